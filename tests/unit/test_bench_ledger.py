"""The overhead benchmark's ledger (scripts/bench_overhead.py): /proc schedstat lines parsed, each process of a run
told apart (the ranks, the torchrun agent, blackbox's supervisor, tee and console.log process), threads named and
their CPU between two snapshots summed per row, blackbox's own rows told from the job's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.bench_overhead import classify, is_blackbox, ledger, parse_schedstat, thread_label

PY = "/venv/bin/python"
TORCHRUN = [PY, "/venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", "/tmp/train.py", "1500"]
RANK = [PY, "-u", "/tmp/train.py", "1500"]


def test_schedstat_line_parsed_and_garbage_refused() -> None:
    assert parse_schedstat("123456789 2345 17\n") == (123456789, 2345)
    assert parse_schedstat("") is None
    assert parse_schedstat("12 x 3") is None


def test_processes_of_a_blackbox_run_told_apart() -> None:
    # GIVEN the tree of `blackbox run -- torchrun …`: the supervisor, its tee and console.log process, the agent,
    # two ranks (one with a DataLoader worker), and something new blackbox started
    blackbox = [PY, "/venv/bin/blackbox", "run", "--", *TORCHRUN[1:]]
    procs = {
        10: (1, blackbox, "blackbox"),
        11: (10, [PY, "-I", "-S", "/src/blackbox/supervisor/tee.py", "5", "6", "7", "8"], "python"),
        12: (10, blackbox, "blackbox-log"),
        13: (10, TORCHRUN, "torchrun"),
        14: (13, RANK, "pt_main_thread"),
        15: (13, RANK, "pt_main_thread"),
        16: (14, RANK, "pt_data_worker"),
        17: (10, ["py-spy", "dump"], "py-spy"),
    }
    # WHEN classified
    roles = classify(10, procs)
    # THEN each has its role, and what is neither the job's nor known is blackbox's, by its name
    assert roles == {10: "supervisor", 11: "tee process", 12: "console.log process", 13: "torchrun agent",
                     14: "rank", 15: "rank", 16: "rank's child", 17: "blackbox's py-spy"}  # fmt: skip
    assert [is_blackbox(roles[p], "main thread") for p in sorted(roles)] == [True, True, True, False, False, False,
                                                                              False, True]  # fmt: skip


def test_plain_torchrun_has_no_blackbox_process() -> None:
    roles = classify(20, {20: (1, TORCHRUN, "torchrun"), 21: (20, RANK, "python"), 22: (20, RANK, "python")})
    assert roles == {20: "torchrun agent", 21: "rank", 22: "rank"}


def test_threads_named_numbers_folded_liveness_in_full() -> None:
    assert thread_label("rank", 14, 14, "pt_main_thread\n") == "main thread (the step)"
    assert thread_label("supervisor", 10, 10, "blackbox") == "main thread"
    assert thread_label("rank", 14, 30, "pt_autograd_1\n") == "pt_autograd_N"
    assert thread_label("rank", 14, 31, "blackbox-live\n") == "blackbox-liveness"
    # a thread blackbox starts inside a rank is blackbox's; the job's own threads are not
    assert is_blackbox("rank", "blackbox-liveness") and not is_blackbox("rank", "pt_autograd_N")


def test_ledger_sums_deltas_per_row() -> None:
    # GIVEN two snapshots: two ranks' main threads, a thread started in between, and one gone by the second
    main = ("rank", "main thread (the step)")
    before = {(14, 14): (*main, (1000, 50)), (15, 15): (*main, (2000, 70)), (10, 40): ("supervisor", "x", (5, 5))}
    after = {(14, 14): (*main, (4000, 80)), (15, 15): (*main, (6000, 100)),
             (10, 41): ("supervisor", "blackbox-straggler", (300, 20))}  # fmt: skip
    # WHEN the ledger is taken
    rows = ledger(before, after)
    # THEN the ranks' rows add up, the new thread counts from zero, the gone one is left out
    assert rows == {main: (7000, 60), ("supervisor", "blackbox-straggler"): (300, 20)}


def test_the_liveness_thread_is_named_in_the_kernel(tmp_path: Path) -> None:
    # GIVEN a process with the recorder active, as a rank
    from blackbox._recorder import protocol as P
    from blackbox.supervisor.rundir import INJECT_DIR

    code = ("import glob, time\n"
            "for _ in range(100):\n"
            "    names = [open(p).read().strip() for p in glob.glob('/proc/self/task/*/comm')]\n"
            "    if 'blackbox-live' in names: break\n"
            "    time.sleep(0.02)\n"
            "print(names)\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "RANK", "LOCAL_RANK"))}
    env.update({"PYTHONPATH": INJECT_DIR, P.ENV_RUN_DIR: str(tmp_path), "RANK": "0", "LOCAL_RANK": "0"})
    # WHEN it lists its threads' names
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout
    # THEN its liveness thread is there by name (top -H, py-spy and the overhead bench's ledger see it)
    assert "'blackbox-live'" in out, out
