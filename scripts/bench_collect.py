"""Benchmark: wall time of one `blackbox collect` against the number of target processes. Run with the project's
venv (`make bench`). An agent process starts N idle Python processes posing as ranks (RANK/LOCAL_RANK set, the
recorder active through its sitecustomize); `blackbox collect AGENT_PID` then finds them, takes py-spy stacks
(with and without --native), /proc state, asks each recorder for its dump, gathers the node facts and writes the
bundle. Reported: the collector's own duration (from its JSON outcome) and the command's wall time (with the
CLI's start-up), and the collection again with one of the ranks stopped (SIGSTOP: it cannot answer, py-spy reads it
without suspending it, nothing waits for it). Prints a Markdown table; docs/benchmarks.md quotes it."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AGENT = r"""
import os, subprocess, sys, time
n, run_dir, inject = int(sys.argv[1]), sys.argv[2], sys.argv[3]
procs = []
for i in range(n):
    env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", BLACKBOX_RECORD_DIR=run_dir, PYTHONPATH=inject)
    procs.append(subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"], env=env))
for p in procs:
    p.wait()
"""


def wait_heartbeats(run_dir: str, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = Path(run_dir, "ranks")
        if ranks.is_dir() and sum(1 for _ in ranks.glob("*/heartbeat")) == n:
            return
        time.sleep(0.1)
    raise SystemExit(f"only some of the {n} posing ranks started within {timeout:g} s")


def one_collection(agent: int, out: str, native: bool) -> tuple[float, float, int]:
    cmd = [sys.executable, "-m", "blackbox", "collect", str(agent), "--out", out, "--format", "json"]
    t = time.perf_counter()
    res = subprocess.run(cmd + (["--native"] if native else []), capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"blackbox collect failed: {res.stderr.strip()}")
    outcome = json.loads(res.stdout)
    bad = [s for s in outcome["steps"] if s["status"] not in ("ok",)]
    if bad:
        print(f"  note: {bad}", file=sys.stderr)
    return outcome["duration_s"], wall, len(outcome["ranks"])


def bench(n: int, repeats: int) -> dict[str, float]:
    from blackbox.supervisor.rundir import INJECT_DIR

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        os.makedirs(os.path.join(run_dir, "ranks"), mode=0o700)
        agent = subprocess.Popen([sys.executable, "-c", AGENT, str(n), run_dir, INJECT_DIR],
                                 start_new_session=True)  # fmt: skip
        try:
            wait_heartbeats(run_dir, n)
            row: dict[str, float] = {}
            for key in ("plain", "native", "stopped"):
                if key == "stopped":  # one rank that cannot answer
                    os.kill(psutil.Process(agent.pid).children()[0].pid, signal.SIGSTOP)
                core, wall = [], []
                for i in range(repeats):
                    c, w, found = one_collection(agent.pid, os.path.join(tmp, f"out-{key}-{i}"), key == "native")
                    assert found == n, f"found {found} of {n} ranks"
                    core.append(c)
                    wall.append(w)
                row[f"{key}_core"] = statistics.median(core)
                row[f"{key}_wall"] = statistics.median(wall)
            return row
        finally:
            os.killpg(agent.pid, 9)
            agent.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="2,8,32,64")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    # every bundle reported or collected is indexed (that cost is measured too), in a scratch index
    os.environ["BLACKBOX_HOME"] = home = tempfile.mkdtemp(prefix="bb-bench-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    rows = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        rows[n] = bench(n, args.repeats)
        print(f"  {n} processes: {rows[n]}", file=sys.stderr)
    print("| target processes | collect (s) | collect --native (s) | command wall, incl. start-up (s) | "
          "per process (ms) | collect, one rank stopped (s) |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, r in rows.items():
        print(f"| {n} | {r['plain_core']:.2f} | {r['native_core']:.2f} | {r['plain_wall']:.2f} | "
              f"{1000 * r['plain_core'] / n:.0f} | {r['stopped_core']:.2f} |")  # fmt: skip
    print(f"\n{os.cpu_count()} CPUs, median of {args.repeats} runs each.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
