"""Benchmark: what multi-node coordination costs the store as the node count grows. One process serves the
job's TCPStore (the hosting node's helper) and N simulated nodes — threads, each with its own TCPStore client —
run the coordination helper's own poll (`StoreProcess.tick`: summary, liveness, incidents, and on the hosting node
the read of every node's liveness) for a number of rounds. Reported: the median and 95th-percentile time of one
poll for an ordinary node and for the hosting node. Prints a Markdown table; the README quotes it.

    .venv/bin/python scripts/bench_coord.py [--nodes 8,64,256] [--rounds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from blackbox.coord.store_process import StoreProcess  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def summary(node: int) -> dict[str, object]:
    return {"host": f"node{node:04d}", "ranks": {str(node * 8 + r): {"step": 1000, "phase": "compute",
            "state": "running", "alive": True, "quiet_s": 0.2} for r in range(8)}}  # fmt: skip


def one_size(nodes: int, rounds: int) -> tuple[list[float], list[float]]:
    port = free_port()
    base = {"host": "127.0.0.1", "port": port, "job_key": f"bench-{nodes}", "nnodes": nodes, "hostname": "bench",
            "run_id": "bench", "poll_interval": 1.0, "silent_after": 3600.0, "connect_timeout": 60.0,
            "episode_s": 60.0}  # fmt: skip
    helpers = [StoreProcess({**base, "node": str(i), "hosting": i == 0}) for i in range(nodes)]
    for i, h in enumerate(helpers):
        h.summary = summary(i)
    with contextlib.redirect_stdout(io.StringIO()):
        assert helpers[0].connect()
        errors: list[BaseException] = []

        def join(h: StoreProcess) -> None:
            try:
                assert h.connect()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(h,)) for h in helpers[1:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        host_times: list[float] = []
        node_times: list[float] = []
        lock = threading.Lock()

        def poll(h: StoreProcess, out: list[float]) -> None:
            for _ in range(rounds):
                t0 = time.perf_counter()
                h.tick()
                took = time.perf_counter() - t0
                with lock:
                    out.append(took)

        threads = [threading.Thread(target=poll, args=(h, host_times if i == 0 else node_times))
                   for i, h in enumerate(helpers)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return host_times, node_times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="8,64,256")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        host, node = one_size(n, args.rounds)
        rows.append((n, statistics.median(node), _p95(node), statistics.median(host), _p95(host)))
        print(f"  {n} nodes: done", file=sys.stderr)
    print("| nodes | node poll, median (ms) | node poll, p95 (ms) | hosting node poll, median (ms) | p95 (ms) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n, nm, n95, hm, h95 in rows:
        print(f"| {n} | {nm * 1e3:.1f} | {n95 * 1e3:.1f} | {hm * 1e3:.1f} | {h95 * 1e3:.1f} |")
    print(f"\n{os.cpu_count()} CPUs; every node polls at once, {args.rounds} rounds, one store on 127.0.0.1.")
    return 0


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


if __name__ == "__main__":
    sys.exit(main())
