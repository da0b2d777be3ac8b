"""Benchmark: the job's own output through `blackbox run` against the same job alone, side by side in one run —
a chatty job (200,000 log lines), a tqdm-style progress bar (100,000 `\\r` updates on one line), 64 KiB lines, and
a row of dashes (the input that once made redaction quadratic). The job writes to a pipe that this script drains
as fast as it can (as a terminal or a log collector would). Prints a Markdown table; the README quotes it.
Run with the project's venv: python scripts/bench_output.py [--repeats N]"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOBS = {
    "200,000 log lines": "for i in range(200_000):\n    print(f'step {i} loss {i * 1e-6:.6f} lr 0.001')\n",
    "tqdm bar, 100,000 updates": "import sys\nfor i in range(100_000):\n"
    "    sys.stdout.write(f'\\r{i:6d}/100000 [{\"#\" * (i // 5000):20s}] 12.3it/s')\nsys.stdout.write('\\n')\n",
    "200 lines of 64 KiB": "import sys\nfor i in range(200):\n    sys.stdout.write('x' * 65536 + '\\n')\n",
    "2,000 lines of 6,000 dashes": "import sys\nfor i in range(2_000):\n    sys.stdout.write('-' * 6000 + '\\n')\n",
}


def timed(argv: list[str], cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_") or k == "BLACKBOX_HOME"}
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    while proc.stdout.read(1 << 16):
        pass
    proc.wait()
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    os.environ["BLACKBOX_HOME"] = tempfile.mkdtemp(prefix="bb-bench-home-")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, code in JOBS.items():
            script = os.path.join(tmp, "job.py")
            with open(script, "w") as f:
                f.write(code)
            alone, wrapped = [], []
            for i in range(args.repeats):  # alternated, so that the machine's load hits both alike
                alone.append(timed([sys.executable, script], tmp))
                run_dir = os.path.join(tmp, f"run-{len(rows)}-{i}")
                wrapped.append(timed([sys.executable, "-m", "blackbox", "run", "--run-dir", run_dir, "--",
                                      sys.executable, script], tmp))  # fmt: skip
            a, w = statistics.median(alone), statistics.median(wrapped)
            rows.append((name, a, w))
            print(f"  {name}: alone {a:.2f} s, under blackbox run {w:.2f} s", file=sys.stderr)
    print("| job output | alone (s) | under `blackbox run` (s) | difference (s) |")
    print("| --- | ---: | ---: | ---: |")
    for name, a, w in rows:
        print(f"| {name} | {a:.2f} | {w:.2f} | {w - a:+.2f} |")
    print(
        f"\n{os.cpu_count()} CPUs; median of {args.repeats} alternated runs each; wall time until the job's output "
        "was drained and it exited (blackbox's start-up, ~0.5 s, included)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
