"""A rank that prints numbered lines, one every INTERVAL seconds, then `done`: its output is checked line by
line. Each line is one write (print() writes the text and its newline apart when PYTHONUNBUFFERED is set, as
on this machine, and two ranks sharing one stdout then interleave mid-line, with or without blackbox).
Usage: chatty_ranks.py LINES INTERVAL"""

import os
import sys
import time

rank = os.environ.get("RANK", "0")
lines, interval = int(sys.argv[1]), float(sys.argv[2])
for i in range(lines):
    sys.stdout.write(f"rank {rank} line {i}\n")
    sys.stdout.flush()
    time.sleep(interval)
sys.stdout.write(f"rank {rank} done\n")
sys.stdout.flush()
