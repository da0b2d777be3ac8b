"""Prints a known mix to stdout and stderr (unicode, carriage returns, no final newline, a large block)."""

import sys

sys.stdout.write("line one\nünïcødé ✓\r\nprogress 50%\rprogress 100%\n")
sys.stdout.flush()
sys.stderr.write("a warning on stderr\n")
sys.stderr.flush()
sys.stdout.write("x" * 200_000 + "\n")
sys.stdout.buffer.write(bytes(range(256)))
sys.stdout.write("no newline at the end")
