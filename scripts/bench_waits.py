"""Benchmark: what following a rank's wait (blackbox/supervisor/waits.py) costs the supervisor's poll. N stand-in
ranks (small Python processes, no torch) wait the ways a still rank does: in a futex (a collective, a thread: not
followed, one /proc read), in wait4 for a child that writes (subprocess.run of a tool), and in poll on a result queue
two worker processes feed slowly (a DataLoader's shape: the pipe's holders are looked up, then remembered). The
supervisor's I/O read of every rank (IoWatch.sample) is timed with following off and on, side by side, polls
alternating. Reported per shape and rank count: the median and 95th-percentile time of one poll of all ranks, and
its share of the 1 s poll interval. Prints a Markdown table; docs/benchmarks.md quotes it.

    .venv/bin/python scripts/bench_waits.py [--ranks 8,64] [--polls 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blackbox.supervisor.iowatch import IoWatch  # noqa: E402

SHAPES = {
    "futex (a collective, a thread)": "import threading; threading.Event().wait()",
    "wait4 (a tool that writes)": """
        import subprocess
        subprocess.run(['sh', '-c', 'while :; do head -c 4096 /dev/zero; sleep 0.2; done > /dev/null'])
    """,
    "poll (a result queue, 2 workers)": """
        import multiprocessing as mp, time
        def work(q):
            while True:
                time.sleep(30)  # a slow batch: the main thread polls, its own bytes still
                q.put(b'x' * 1024)
        if __name__ == '__main__':
            ctx = mp.get_context('fork')
            q = ctx.Queue()
            for _ in range(2):
                ctx.Process(target=work, args=(q,), daemon=True).start()
            while True:
                try:
                    q.get(timeout=5)
                except Exception:
                    pass
    """,
}
POLL_INTERVAL_S = 1.0  # the supervisor's default (--poll-interval)


def start(code: str, n: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], stderr=subprocess.DEVNULL, start_new_session=True
        )
        for _ in range(n)
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        subprocess.run(["pkill", "-9", "-s", str(p.pid)], check=False)
        p.kill()
        p.wait()


def measure(procs: list[subprocess.Popen[bytes]], polls: int) -> dict[bool, list[float]]:
    watches = {False: IoWatch(), True: IoWatch()}
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(polls * 2):
        follow = bool(i % 2)
        watch = watches[follow]
        t = time.perf_counter()
        for rank, p in enumerate(procs):
            watch.sample(rank, p.pid, time.monotonic(), follow)
        watch.end_poll()
        times[follow].append(time.perf_counter() - t)
        time.sleep(0.05)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64")
    ap.add_argument("--polls", type=int, default=30)
    args = ap.parse_args()
    print("| ranks | the main thread waits in | poll, following off: median / p95 (ms) | following on: median / "
          "p95 (ms) | share of the 1 s poll, on |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for n in (int(x) for x in args.ranks.split(",")):
        for shape, code in SHAPES.items():
            procs = start(code, n)
            try:
                time.sleep(3.0 + n / 16)  # every stand-in settled in its wait
                times = measure(procs, args.polls)
            finally:
                stop(procs)
            row = []
            for follow in (False, True):
                ms = sorted(t * 1000 for t in times[follow][2:])  # the first polls set the baselines
                row.append(f"{statistics.median(ms):.2f} / {ms[int(0.95 * (len(ms) - 1))]:.2f}")
            share = statistics.median(times[True][2:]) / POLL_INTERVAL_S * 100
            print(f"| {n} | {shape} | {row[0]} | {row[1]} | {share:.2f} % |", flush=True)


if __name__ == "__main__":
    main()
