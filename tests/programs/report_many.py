"""Runs `blackbox report` in this one process on each bundle named on stdin (one path per line), under a memory
limit and a per-bundle time limit, and prints one JSON line per bundle: its exit code, seconds, peak memory,
the output's first characters, and the traceback of anything that escaped. Used by the hostile-bundle tests.

    report_many.py FORMAT MEMORY_MB SECONDS < paths"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import time
import traceback


class TimeUp(BaseException):  # not an Exception: nothing in blackbox may swallow it
    pass


def _alarm(signum: int, frame: object) -> None:
    raise TimeUp()


def main() -> int:
    fmt, memory_mb, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    from blackbox.cli.main import main as blackbox

    for path in sys.stdin.read().split("\n"):
        if not path:
            continue
        out, err = io.StringIO(), io.StringIO()
        escaped = None
        t0 = time.monotonic()
        signal.alarm(seconds)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = blackbox(["report", "--no-index", "--no-fr-analyzer", "--format", fmt, path])
        except TimeUp:
            code, escaped = -1, "timed out"
        except BaseException:
            code, escaped = -2, traceback.format_exc()
        finally:
            signal.alarm(0)
        print(
            json.dumps(
                {
                    "path": path,
                    "code": code,
                    "seconds": round(time.monotonic() - t0, 2),
                    "escaped": escaped,
                    "stdout": out.getvalue(),
                    "stderr": err.getvalue(),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
