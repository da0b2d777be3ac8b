"""Benchmark: the job's own output through `blackbox run` against the same job alone, side by side in one run —
a chatty job (200,000 log lines), a tqdm-style progress bar (100,000 `\\r` updates on one line), 64 KiB lines, a
row of dashes (the input that once made redaction quadratic), and an ML log (200,000 lines with `tokens_per_sec=`
in each, a tqdm bar and a 20 KB line), buffered and with PYTHONUNBUFFERED=1. The job writes to a pipe (or, with
--pty, a terminal) that this script drains as fast as it can, as a terminal or a log collector would. Two times
under blackbox: when the job's last byte reached us (the job's own speed: the target, at most twice alone + 2 s),
and when `blackbox run` exited (after console.log, redacted in a niced process of its own, has caught up).
Prints a Markdown table; docs/benchmarks.md quotes it. Run with the project's venv: python scripts/bench_output.py"""

from __future__ import annotations

import argparse
import atexit
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import termios
import time

ML_LOG = (
    "import sys\nfor i in range(200_000):\n"
    "    print(f'step {i} loss {i * 1e-6:.6f} lr 0.001 tokens_per_sec={12345 + i % 977}')\n"
    "for i in range(1000):\n    sys.stdout.write(f'\\r{i:6d}/1000 [{\"#\" * (i // 50):20s}] 12.3it/s')\n"
    "sys.stdout.write('\\n')\nprint('x' * 20_000)\n"
)
JOBS = {  # name: (code, PYTHONUNBUFFERED)
    "200,000 log lines": ("for i in range(200_000):\n    print(f'step {i} loss {i * 1e-6:.6f} lr 0.001')\n", False),
    "tqdm bar, 100,000 updates": (
        "import sys\nfor i in range(100_000):\n"
        "    sys.stdout.write(f'\\r{i:6d}/100000 [{\"#\" * (i // 5000):20s}] 12.3it/s')\nsys.stdout.write('\\n')\n",
        False,
    ),
    "200 lines of 64 KiB": ("import sys\nfor i in range(200):\n    sys.stdout.write('x' * 65536 + '\\n')\n", False),
    "2,000 lines of 6,000 dashes": (
        "import sys\nfor i in range(2_000):\n    sys.stdout.write('-' * 6000 + '\\n')\n",
        False,
    ),
    "ML log: 200,000 lines with `tokens_per_sec=`, a tqdm bar, a 20 KB line": (ML_LOG, False),
    "the same ML log, PYTHONUNBUFFERED=1": (ML_LOG, True),
}


def timed(argv: list[str], cwd: str, unbuffered: bool, pty: bool) -> tuple[float, float, int]:
    """(seconds until the last byte of output reached us, seconds until the command exited, bytes read)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_") or k == "BLACKBOX_HOME"}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    if pty:
        ours, theirs = os.openpty()
        attrs = termios.tcgetattr(theirs)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(theirs, termios.TCSANOW, attrs)
    else:
        ours, theirs = os.pipe()
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=theirs,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    os.close(theirs)
    last, size = t, 0
    while True:
        select.select([ours], [], [])
        try:
            chunk = os.read(ours, 1 << 16)
        except OSError:  # EIO: a pty's last writer is gone
            chunk = b""
        if not chunk:
            break
        size += len(chunk)
        last = time.perf_counter()
    os.close(ours)
    proc.wait()
    return last - t, time.perf_counter() - t, size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pty", action="store_true", help="the job's stdout (and blackbox's) is a terminal, not a pipe")
    args = p.parse_args()
    os.environ["BLACKBOX_HOME"] = home = tempfile.mkdtemp(prefix="bb-bench-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (code, unbuffered) in JOBS.items():
            script = os.path.join(tmp, "job.py")
            with open(script, "w") as f:
                f.write(code)
            alone, delivered, exited, logs = [], [], [], []
            for i in range(args.repeats):  # alternated, so that the machine's load hits both alike
                a, _, size = timed([sys.executable, script], tmp, unbuffered, args.pty)
                alone.append(a)
                run_dir = os.path.join(tmp, f"run-{len(rows)}-{i}")
                d, e, wrapped_size = timed([sys.executable, "-m", "blackbox", "run", "--run-dir", run_dir, "--",
                                            sys.executable, script], tmp, unbuffered, args.pty)  # fmt: skip
                assert wrapped_size == size, f"{name}: {wrapped_size} bytes under blackbox, {size} alone"
                delivered.append(d)
                exited.append(e)
                with open(os.path.join(run_dir, "console.log"), "rb") as f:
                    log = f.read()
                logs.append(b"are missing here" not in log and b"not in this log" not in log)
            a, d, e = statistics.median(alone), statistics.median(delivered), statistics.median(exited)
            rows.append((name, a, d, e, all(logs)))
            print(f"  {name}: alone {a:.2f} s, output delivered {d:.2f} s, blackbox exited {e:.2f} s", file=sys.stderr)
    print("| job output | alone (s) | under `blackbox run`: output delivered (s) | ratio | within 2 x alone + 2 s "
          "| `blackbox run` exited, console.log complete (s) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for name, a, d, e, complete in rows:
        print(f"| {name} | {a:.2f} | {d:.2f} | {d / a:.1f} x | {'yes' if d <= 2 * a + 2 else 'NO'} | {e:.2f}"
              f"{'' if complete else ' (console.log cut short, said in it)'} |")  # fmt: skip
    print(
        f"\n{os.cpu_count()} CPUs; stdout a {'terminal (pty)' if args.pty else 'pipe'}; median of {args.repeats} "
        "alternated runs each; wall time from the start of the command (blackbox's start-up, ~0.5 s, included)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
