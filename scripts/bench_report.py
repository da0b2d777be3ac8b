"""Benchmark: `blackbox report` time and peak memory on generated bundles of 8 to 32,768 ranks (one rank
stuck in its dataset, the others in all_reduce, a stall detection; per rank a heartbeat, py-spy stacks, /proc
state and the recorder's dump). Each report runs in a fresh process (the CLI, JSON output), timed from outside;
peak memory is that process's max RSS. Prints a Markdown table; the README quotes it.
`--against REV` also times the code of an older commit (checked out with `git worktree add` into a temp dir) on the
same bundles, alternating new and old run by run, and prints both side by side.
`make_bundle` is also used by the tests (tests/unit/test_scale.py)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def _frame(name: str, filename: str, line: int) -> dict[str, object]:
    return {"name": name, "filename": filename, "module": None, "short_filename": filename.rsplit("/", 1)[-1],
            "line": line, "locals": None, "is_entry": False}  # fmt: skip


def _stack(stuck: bool) -> list[dict[str, object]]:
    frames = [_frame("<module>", "/job/train.py", 200), _frame("main", "/job/train.py", 88)]
    if stuck:
        frames += [_frame("__next__", f"{TORCH}/utils/data/dataloader.py", 733),
                   _frame("fetch", f"{TORCH}/utils/data/_utils/fetch.py", 52),
                   _frame("__getitem__", "/job/data.py", 31)]  # fmt: skip
    else:
        frames += [_frame("wrapper", f"{TORCH}/distributed/c10d_logger.py", 81),
                   _frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 3252)]  # fmt: skip
    return [{"pid": 1, "thread_id": 1, "thread_name": "MainThread", "owns_gil": False, "active": False,
             "frames": list(reversed(frames))},
            {"pid": 1, "thread_id": 2, "thread_name": "blackbox-liveness", "owns_gil": False, "active": False,
             "frames": [_frame("wait", "/usr/lib/python3.11/threading.py", 324)]}]  # fmt: skip


def make_bundle(ranks: int, out_dir: str, stuck: int = 1) -> str:
    """A stall bundle of `ranks` ranks written by blackbox's own writer; rank `stuck` never arrived."""
    from blackbox.bundle.writer import BundleWriter
    from blackbox.detections import Trigger

    w = BundleWriter("bench-run", "node0", Trigger.parse("stall"), total_cap=2**31)
    now = time.time()
    for r in range(ranks):
        mine = r == stuck
        phase = "data" if mine else "collective"
        w.add_record(r, "heartbeat.json", {
            "version": 2, "pid": 10_000 + r, "rank": r, "local_rank": r % 8, "world_size": ranks, "mode": "rank",
            "step": 100, "phase": phase, "collective": "none" if mine else "all_reduce", "state": "running",
            "alive": True, "idle_s": 63.0 + (r % 7) * 0.1, "liveness_age_s": 0.3, "last_progress_wall": now - 63,
            "phase_start_wall": now - 63, "phase_age_s": 63.0, "exit_status": None, "dump_request": 1,
            "dump_ack": 1, "data_wait_total": 12.5, "batches": 400, "last_step_dt": 0.51, "slowest_step_dt": 0.9,
            "ledger": [30.0, 250.0, 12.5 if not mine else 80.0, 0.0, 0.0, 0.0, 140.0, 0.0],
        })  # fmt: skip
        w.add_record(r, "py-spy.json", _stack(mine))
        w.add_record(r, "proc.json", {
            "pid": 10_000 + r, "name": "python3", "state": "S (sleeping)", "wchan": "futex_wait_queue",
            "threads": [{"tid": 10_000 + r + t, "name": "python3", "state": "S", "wchan": "futex_wait_queue"}
                        for t in range(24)], "fd_count": 120, "unreadable": {},
        })  # fmt: skip
        w.add_record(r, "history.json", [{"t": now - 600 + s * 5, "step": s, "phase": "compute", "state": "running",
                                          "phase_t": now - 600 + s * 5, "at": now - 600 + s * 5 + 0.5,
                                          "moved_t": now - 600 + s * 5, "batches": 4 * s, "forwards": 4 * s,
                                          "stack_changes": s, "read_bytes": 2**20 * s, "written_bytes": 0}
                                         for s in range(0, 101, 10)])  # as the supervisor samples it  # fmt: skip
    reason = f"ranks wait in all_reduce while rank {stuck} never arrived (phase data)"
    w.add_json("detection.json", {"rule": "stall", "ranks": list(range(ranks)), "suspects": [stuck], "reason": reason})
    local = [{"rank": r, "pid": 10_000 + r, "local_rank": r % 8, "recorder": True, "alive": True}
             for r in range(ranks)]  # fmt: skip
    return w.write(out_dir, {"job": {"run_id": "bench-run", "node": "node0", "world_size": ranks,
                                     "local_ranks": local}}).path  # fmt: skip


def one_report(bundle: str, fmt: str, root: Path = ROOT) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one `blackbox report` process, of the code checked out at `root`."""
    code = ("import resource, sys, time; t = time.perf_counter(); from blackbox.cli.main import main; "
            f"rc = main(['report', {bundle!r}, '--format', {fmt!r}, '--out', '/dev/null']); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024); "
            "sys.exit(rc)")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=False)
    if res.returncode != 0:
        raise SystemExit(f"report failed: {res.stderr.strip()}")
    seconds, rss = res.stdout.split()
    return float(seconds), float(rss)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The code of `rev` in a temporary worktree (removed afterwards)."""
    tmp = tempfile.mkdtemp(prefix="bb-bench-against-")
    subprocess.run(["git", "worktree", "add", "--detach", "-q", tmp, rev], cwd=ROOT, check=True)
    try:
        yield Path(tmp)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT, check=False)


def measure(bundle: str, fmt: str, repeats: int, old: Optional[Path]) -> tuple[list[tuple[float, float]], ...]:
    """`repeats` reports of this code and, with `old`, as many of the old code's, alternating."""
    new_runs, old_runs = [], []
    for _ in range(repeats):
        new_runs.append(one_report(bundle, fmt))
        if old is not None:
            old_runs.append(one_report(bundle, fmt, old))
    return new_runs, old_runs


def _span(runs: list[tuple[float, float]]) -> str:
    times = sorted(r[0] for r in runs)
    return f"{statistics.median(times):.2f} ({times[0]:.2f} to {times[-1]:.2f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="8,512,4096,32768")
    p.add_argument("--formats", default="json,terminal,html")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--against", default=None, metavar="REV", help="also time this commit's code, side by side")
    args = p.parse_args()
    # every bundle reported or collected is indexed (that cost is measured too), in a scratch index
    os.environ["BLACKBOX_HOME"] = home = tempfile.mkdtemp(prefix="bb-bench-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    rows = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        old = stack.enter_context(checkout(args.against)) if args.against else None
        for n in [int(s) for s in args.sizes.split(",")]:
            bundle = make_bundle(n, tmp)
            size = os.path.getsize(bundle)
            for fmt in args.formats.split(","):
                new_runs, old_runs = measure(bundle, fmt, args.repeats, old)
                rows.append((n, size, fmt, new_runs, old_runs))
                print(f"  {n} ranks, {fmt}: {_span(new_runs)} s" + (f", {args.against}: {_span(old_runs)} s"
                      if old_runs else ""), file=sys.stderr)  # fmt: skip
    against = f" | {args.against} time (s) | {args.against} peak (MB)" if args.against else ""
    print(f"| ranks | bundle (KiB, gzip) | format | report time (s) | peak memory (MB){against} |")
    print("| ---: | ---: | --- | ---: | ---:" + (" | ---: | ---:" if args.against else "") + " |")
    for n, size, fmt, new_runs, old_runs in rows:
        cells = [str(n), str(size // 1024), fmt, _span(new_runs), f"{max(r[1] for r in new_runs):.0f}"]
        if old_runs:
            cells += [_span(old_runs), f"{max(r[1] for r in old_runs):.0f}"]
        print("| " + " | ".join(cells) + " |")
    print(
        f"\n{os.cpu_count()} CPUs; median (min to max) time and the largest peak of {args.repeats} runs each; "
        f"time from the CLI's entry (imports included), in a fresh process"
        + (f"; {args.against} run alternately with this code on the same bundles." if args.against else ".")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
