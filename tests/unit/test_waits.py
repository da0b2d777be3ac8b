"""Following a wait (blackbox/supervisor/waits.py) on real processes: a parent whose main thread waits for a child —
in wait4 (subprocess.run), in poll on its captured output (capture_output=True), in poll on a result queue (a
DataLoader's workers) — is followed to that child and what runs below it: the child's bytes and CPU time are motion,
a child blocked on input that never comes is not, nor is a poll loop's wake-up; a secret on the child's command line
is never shown; a parent that waits on nothing of the kind is not followed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.supervisor.waits import Waited, WaitFollower

pytestmark = pytest.mark.timeout(60)

WRITER = "i=0; while [ $i -lt 400 ]; do head -c 65536 /dev/zero; sleep 0.05; i=$((i+1)); done | gzip -1 > /dev/null"
SPIN = "i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done"  # CPU only: not one byte


def parent(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.DEVNULL)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        for child in _tree(p.pid):
            subprocess.run(["kill", "-9", str(child)], check=False)
        p.kill()
        p.wait()


def _tree(pid: int) -> list[int]:
    from blackbox.adapters import proctree

    return proctree.process_tree([pid])[1:]


def follow(pid: int, seconds: float) -> list[Waited | None]:
    """What the follower says at each poll (every 0.5 s) for `seconds`, after the parent has settled in its wait."""
    time.sleep(1.0)
    follower, out = WaitFollower(), []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out.append(follower.follow(pid, time.monotonic()))
        follower.end_poll()
        time.sleep(0.5)
    return out


def steady(seen: list[Waited | None]) -> bool:
    """Motion seen at least once in every 2 s after the first reading (the baseline): the rules count what moved
    within the last 10 s, and a process that gets a slice of a loaded CPU makes its CPU floor at every other poll."""
    moved = [w is not None and w.moved for w in seen[1:]]
    return len(moved) >= 4 and all(any(moved[i : i + 4]) for i in range(len(moved) - 3))


def test_a_child_that_writes_is_motion_while_the_parent_waits_in_wait4(procs: list[subprocess.Popen[bytes]]) -> None:
    p = parent(f"import subprocess; subprocess.run(['sh', '-c', {WRITER!r}])")
    procs.append(p)
    seen = follow(p.pid, 4.0)
    assert all(w is not None for w in seen), seen
    assert steady(seen), seen
    last = seen[-1]
    assert last is not None and last.name.startswith("its child `sh -c i=0; while") and "(pid " in last.name
    assert last.read_1m > 1_000_000 and last.describe().startswith("waits for its child `sh -c"), last


def test_a_child_whose_output_is_captured_is_followed_through_the_pipe(procs: list[subprocess.Popen[bytes]]) -> None:
    p = parent(f"import subprocess; subprocess.run(['sh', '-c', {WRITER!r}], capture_output=True)")
    procs.append(p)
    seen = follow(p.pid, 4.0)
    assert all(w is not None for w in seen) and steady(seen), seen
    # the shell's pipeline holds the pipes too: the shell stands for it
    assert seen[-1] is not None and seen[-1].name.startswith("its child `sh -c i=0; while"), seen[-1]


def test_a_child_that_only_computes_moves_by_its_cpu_time(procs: list[subprocess.Popen[bytes]]) -> None:
    p = parent(f"import subprocess; subprocess.run(['sh', '-c', {SPIN!r}])")
    procs.append(p)
    seen = follow(p.pid, 4.0)
    assert steady(seen), seen
    assert all(w is not None and w.read_1m == w.written_1m == 0 for w in seen), seen


def test_a_child_blocked_on_input_that_never_comes_is_not_motion(procs: list[subprocess.Popen[bytes]]) -> None:
    # a credential prompt: the child reads a pipe the parent never writes, the parent waits for it
    p = parent("""
        import os, subprocess
        r, w = os.pipe()
        subprocess.run(['cat'], stdin=r)
    """)
    procs.append(p)
    seen = follow(p.pid, 3.0)
    assert seen and all(w is not None and not w.moved for w in seen), seen
    assert seen[0] is not None and seen[0].name.startswith("its child `cat` (pid ")


def test_result_queue_workers_are_followed_only_while_they_work(procs: list[subprocess.Popen[bytes]]) -> None:
    # the DataLoader's shape: the main thread polls a result queue (get with a timeout) that two workers feed; one
    # worker computes, then both sleep: a sleeping pool is not motion, however often the main thread wakes
    p = parent(f"""
        import multiprocessing as mp, subprocess, time
        def work(q, spin):
            if spin:
                subprocess.run(['sh', '-c', {SPIN!r}], timeout=4)
            time.sleep(3600)
        if __name__ == '__main__':
            q = mp.get_context('fork').Queue()
            workers = [mp.get_context('fork').Process(target=work, args=(q, i == 0), daemon=True) for i in range(2)]
            for w in workers:
                w.start()
            while True:
                try:
                    q.get(timeout=0.2)
                except Exception:
                    pass
    """)
    procs.append(p)
    seen = follow(p.pid, 3.0)
    assert seen and all(w is not None and w.name.startswith("its 2 child processes (pids ") for w in seen), seen
    assert steady(seen), seen
    time.sleep(2.0)  # the spinning worker's 4 s are over: both sleep
    quiet = follow(p.pid, 3.0)
    assert quiet and not any(w.moved for w in quiet if w), quiet


def test_a_fifos_writer_is_followed_wherever_it_runs(procs: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    # a FIFO fed by a process that is not the reader's child (a producer started beside the job): the reader's
    # blocked read is as alive as the writer — which computes the next chunk without a byte for a while, then sleeps
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"exec 3> {fifo}; {SPIN}; sleep 3600"])
    procs.append(writer)
    p = parent(f"open({str(fifo)!r}, 'rb').read(1)")
    procs.append(p)
    seen = follow(p.pid, 3.0)
    named = [w.name for w in seen if w is not None]
    assert len(named) == len(seen) and all(n.startswith("its FIFO's writer `sh -c exec 3> ") and n.endswith(
        f"(pid {writer.pid})") for n in named), seen  # fmt: skip
    assert steady(seen), seen
    # once the writer does nothing (stopped here), the read is still: nothing it waits for moves
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        quiet = follow(p.pid, 2.0)
        assert quiet and not any(w.moved for w in quiet if w), quiet
    finally:
        os.kill(writer.pid, signal.SIGCONT)


def test_a_secret_on_the_childs_command_line_is_never_shown(procs: list[subprocess.Popen[bytes]]) -> None:
    p = parent("import subprocess; subprocess.run(['sh', '-c', 'sleep 30', '--api-token', 'hf_abcdefghijklmnopqrstu'])")
    procs.append(p)
    (first, *_) = follow(p.pid, 1.0)
    assert first is not None and "hf_abc" not in first.name, first
    assert first.name.startswith("its child `sh -c sleep 30 --api-token <redacted>` (pid "), first


def test_a_parent_waiting_on_no_other_process_is_not_followed(procs: list[subprocess.Popen[bytes]]) -> None:
    p = parent("import threading; threading.Event().wait()")  # a futex: a thread, not a process
    procs.append(p)
    assert follow(p.pid, 1.0) == [None, None]


def test_a_wait_for_a_thread_or_a_poll_loop_follows_the_workers_and_what_came_since(
        procs: list[subprocess.Popen[bytes]]) -> None:  # fmt: skip
    # GIVEN a rank whose main thread waits for a thread of its own (the kernel shows a futex; its heartbeat says
    # so), with three children: a service it started long before its last step (a metrics agent, always busy), a
    # Python worker of its pool, and a tool it started since
    from blackbox.adapters import proctree

    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import multiprocessing as mp, subprocess, sys, threading, time
        if __name__ == '__main__':
            service = subprocess.Popen(['sh', '-c', {SPIN!r}])
            worker = mp.get_context('fork').Process(target=time.sleep, args=(3600,), daemon=True)
            worker.start()
            print(service.pid, worker.pid, flush=True)
            sys.stdin.readline()
            late = subprocess.Popen(['sleep', '3600'])
            print(late.pid, flush=True)
            threading.Event().wait()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    procs.append(p)  # type: ignore[arg-type]
    assert p.stdin is not None and p.stdout is not None
    service, worker = map(int, p.stdout.readline().split())
    time.sleep(0.1)
    since = time.monotonic()  # its last step
    time.sleep(0.1)
    p.stdin.write("\n")
    p.stdin.flush()
    late = int(p.stdout.readline())
    time.sleep(0.5)
    # THEN the worker and the tool are what it may wait for, never the service (which moves all the time)
    assert sorted(proctree.workers(p.pid, since)) == sorted([worker, late])
    follower = WaitFollower()
    seen = []
    for _ in range(3):
        seen.append(follower.follow(p.pid, time.monotonic(), since))
        follower.end_poll()
        time.sleep(0.5)
    assert all(w is not None and not w.moved for w in seen), seen
    assert seen[0] is not None and seen[0].name in (f"its 2 child processes (pids {worker}, {late})",
                                                    f"its 2 child processes (pids {late}, {worker})")  # fmt: skip
    # AND without its heartbeat saying so, a futex is not a wait on another process
    assert follower.follow(p.pid, time.monotonic()) is None


def test_the_report_names_the_leaf_of_the_wait_from_untrusted_proc_json() -> None:
    from blackbox.analyze.states import describe_waited

    cat = {"pid": 12, "waited": False, "argv": ["cat"], "state": "S",
           "main_thread": {"syscall": "read", "fd": 0, "fd_target": "pipe:[88]", "fd_kind": "pipe"}}  # fmt: skip
    sh = {"pid": 11, "waited": True, "argv": ["sh", "-c", "cat"], "state": "S", "main_thread": {"syscall": "wait4"}}
    assert describe_waited([sh, cat]) == (
        "its child `sh -c cat` (pid 11), which waits for `cat` (pid 12), which is blocked in "
        "read() of fd 0, pipe:[88] (a pipe)")  # fmt: skip
    assert describe_waited([{**cat, "waited": True}]) == (
        "its child `cat` (pid 12), which is blocked in read() of fd 0, pipe:[88] (a pipe)"
    )
    d = {**cat, "waited": True, "state": "D", "main_thread": {"syscall": "write", "fd": 3, "fd_target": "/mnt/x",
                                                               "fd_kind": "file", "fs_type": "nfs4"}}  # fmt: skip
    assert describe_waited([d]).endswith(", in uninterruptible sleep in the kernel (blocked in write() of fd 3, "
                                         "/mnt/x (a file on nfs4))")  # fmt: skip
    for bad in (None, "x", [1, "a", {"pid": "7"}], {"pid": 3}, []):
        assert describe_waited(bad) == ""
    odd = [{"pid": 5, "argv": 3, "main_thread": []}]
    assert describe_waited(odd) == "its child process (pid 5)"


def test_the_advice_for_a_rank_that_waits_for_a_child_is_chosen_by_the_fact_not_its_words() -> None:
    from blackbox.analyze.actions import Blocked, Facts, next_actions
    from blackbox.analyze.model import RankRow, Verdict

    rows = {0: RankRow(0, "gpu-a", 4000, "running", 9, "compute", None, 70.0, True)}
    v = Verdict("hang.io", "compute", [0], "high", "rank 0 waits")
    # GIVEN a rank whose main thread waits for its child, which waits for input that never comes
    child = "its child `sudo -S true` (pid 12), which is blocked in read() of fd 0, /dev/pts/3 (a tty)"
    said = next_actions(v, Facts("gpu-a", rows, blocked_io={0: Blocked(f"main thread waits for {child}", child)}))
    # THEN the advice is about that process and the prompt it waits at
    assert said[0] == (f"Rank 0 on gpu-a waits for {child}. Look at that process (`py-spy dump --pid`, `cat "
                       "/proc/PID/wchan`): a tool that reads its standard input or a terminal waits for an answer no "
                       "one gives (a password or confirmation prompt)."), said  # fmt: skip
    assert said[1].startswith("Run tools without a terminal and with a deadline")
    # AND a rank blocked in a read of its own gets the I/O advice, however its words begin
    read = "main thread waits for its child… no: blocked in read() of fd 5, /data/x (a file on nfs4)"
    said = next_actions(v, Facts("gpu-a", rows, blocked_io={0: Blocked(read)}))
    assert said[0].startswith(f"Rank 0 on gpu-a waits for I/O: {read}. Check that file's filesystem"), said
