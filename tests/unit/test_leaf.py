"""The leaf a still rank waits at (supervisor.leaf), read from /proc on real processes: a FIFO's open or read and a
stopped process are definite, as is a poll loop its recorder saw, and a wait for workers of its own that are stuck so (a
DataLoader whose worker reads a dead mount, or a FIFO whose writer does nothing); a sleep, a pipe from a child, a
socket, a spinning native call and workers that sleep or wait for the rank are not (the step-based timeouts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from blackbox.supervisor.leaf import LEAVES, of_rank
from blackbox.supervisor.waits import WaitFollower
from tests.conftest import wait_for


@contextmanager
def process(code: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def in_call(pid: int, *calls: str) -> bool:
    try:
        text = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    names = {"0": "read", "257": "openat", "2": "open", "35": "nanosleep", "230": "clock_nanosleep", "7": "poll",
             "45": "recvfrom"}  # fmt: skip
    return bool(text) and names.get(text[0]) in calls


def name(pid: int, waiting: str = "") -> str:
    leaf = of_rank(pid, waiting)
    return leaf.name if leaf is not None else ""


def test_a_fifos_open_or_read_and_a_stopped_process_are_definite(tmp_path: Path) -> None:
    fifo = tmp_path / "shard"
    os.mkfifo(fifo)
    # a main thread blocked opening a FIFO no writer will open (the gallery's dead mount)
    with process("open(__import__('sys').argv[1], 'rb').read()", str(fifo)) as opener:
        wait_for(lambda: in_call(opener.pid, "openat", "open"), 30, "the open to block")
        assert name(opener.pid) == "fifo"
    # a main thread blocked reading a FIFO whose writer writes nothing
    keep = os.open(fifo, os.O_RDWR)  # a writer that holds it open and is silent (O_RDWR: the open does not block)
    try:
        with process("f = open(__import__('sys').argv[1], 'rb'); f.read(1)", str(fifo)) as reader:
            wait_for(lambda: in_call(reader.pid, "read"), 30, "the read to block")
            assert name(reader.pid) == "fifo"
    finally:
        os.close(keep)
    # a stopped process
    with process("import time\nwhile True: time.sleep(1)") as stopped:
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(stopped.pid).status() == psutil.STATUS_STOPPED, 30, "it to stop")
        assert name(stopped.pid) == "stopped"
        # and a poll loop, as its recorder says (the process's own state is what it is)
        os.kill(stopped.pid, signal.SIGCONT)
        wait_for(lambda: in_call(stopped.pid, "clock_nanosleep", "nanosleep"), 30, "it to sleep")
        assert name(stopped.pid, "poll") == "poll"


AT_EXIT = """
import sys, threading
def ship():
    with open(sys.argv[1], "rb") as f:  # a log shipper whose pipe nobody writes
        f.read()
threading.Thread(target=ship, name="log-shipper").start()
"""  # then the interpreter exits: its main thread joins the non-daemon thread (threading._shutdown)


def test_a_thread_at_a_fifo_that_the_main_thread_waits_for_is_definite(tmp_path: Path) -> None:
    fifo = tmp_path / "log-pipe"
    os.mkfifo(fifo)
    # GIVEN a rank that finished: its interpreter waits to exit for a thread of its own blocked opening a FIFO
    with process(AT_EXIT, str(fifo)) as rank:
        wait_for(lambda: any(in_call(int(t), "openat", "open") for t in os.listdir(f"/proc/{rank.pid}/task")
                             if t != str(rank.pid)), 30, "the thread's open to block")  # fmt: skip
        # THEN while its recorder says the main thread waits for a thread, the rank is at that thread's leaf
        assert name(rank.pid, "thread") == "fifo"
        # AND where it does not (the main thread blocked in its own call), another thread's wait is not the rank's
        assert name(rank.pid) == ""


def test_a_sleep_a_pipe_a_socket_and_a_spin_are_not_definite() -> None:
    with process("import time\nwhile True: time.sleep(1)") as sleeper:
        wait_for(lambda: in_call(sleeper.pid, "clock_nanosleep", "nanosleep"), 30, "it to sleep")
        assert name(sleeper.pid) == "" and name(sleeper.pid, "sleep") == ""
    # a pipe (its stdin, the test holding the other end: a child at the far end may be downloading)
    with process("import sys\nsys.stdin.buffer.read(1)") as piped:
        wait_for(lambda: in_call(piped.pid, "read"), 30, "the read to block")
        assert name(piped.pid) == ""
    # a socket whose peer says nothing (it may be computing an answer)
    server = socket.create_server(("127.0.0.1", 0))
    try:
        code = "import socket, sys\ns = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\ns.recv(1)"
        with process(code, str(server.getsockname()[1])) as client:
            wait_for(lambda: in_call(client.pid, "recvfrom", "read"), 30, "the recv to block")
            assert name(client.pid) == ""
    finally:
        server.close()
    # a native call that spins (no system call at all)
    with process("while True: pass") as spinner:
        assert name(spinner.pid) == ""


# A DataLoader's shape without torch: two forked workers, each polling its own index queue (with DataLoader's 5 s
# timeout) and putting into one result queue; the rank feeds worker 0 one index and waits for its result. What
# worker 0 does with it is the case: reads a FIFO no one writes (a dead mount), sleeps, or (idle) nothing is fed.
LOADER = """
import multiprocessing as mp, queue, sys, time

def worker(index_q, result_q, how):
    while True:
        try:
            i = index_q.get(timeout=5.0)
        except queue.Empty:
            continue
        if how == "fifo":
            open(sys.argv[1], "rb").read()
        elif how == "sleep":
            time.sleep(3600)
        result_q.put(i)

if __name__ == "__main__":
    ctx, how = mp.get_context("fork"), sys.argv[2]
    results = ctx.Queue()
    feeds = [ctx.Queue(), ctx.Queue()]
    for q in feeds:
        ctx.Process(target=worker, args=(q, results, how), daemon=True).start()
    if how != "idle":
        feeds[0].put(0)
    results.get()
"""


def loader_leaf(rank: int) -> str:
    """The rank's leaf as the watch reads it: what its main thread waits for (supervisor.waits), then the leaf."""
    waited = WaitFollower().follow(rank, time.monotonic())
    assert waited is not None and len(waited.pids) == 2, waited  # its two workers, at the result queue's other end
    return name(rank) or (leaf.name if (leaf := of_rank(rank, "", waited.pids)) else "")


def test_a_rank_waiting_for_workers_stuck_at_a_definite_leaf_is_at_one(tmp_path: Path) -> None:
    fifo = tmp_path / "shard"
    os.mkfifo(fifo)
    # a worker blocked opening a FIFO (the gallery's dead mount), the other idle, polling the queue the rank feeds
    with process(LOADER, str(fifo), "fifo") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        stuck = min(c.pid for c in psutil.Process(rank.pid).children())
        wait_for(lambda: in_call(stuck, "openat", "open") and in_call(rank.pid, "read", "poll"), 30, "the waits")
        assert loader_leaf(rank.pid) == "workers"
    # a worker stopped (SIGSTOP), the other idle
    with process(LOADER, str(fifo), "idle") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        stopped = min(c.pid for c in psutil.Process(rank.pid).children())
        os.kill(stopped, signal.SIGSTOP)
        try:
            wait_for(lambda: psutil.Process(stopped).status() == psutil.STATUS_STOPPED, 30, "it to stop")
            wait_for(lambda: in_call(rank.pid, "read", "poll"), 30, "the rank to wait")
            assert loader_leaf(rank.pid) == "workers"
        finally:
            os.kill(stopped, signal.SIGCONT)


def test_a_rank_waiting_for_workers_that_sleep_or_wait_for_it_is_not_at_a_definite_leaf(tmp_path: Path) -> None:
    # a worker asleep on its batch (a rate limit, a retry's backoff: it will go on), the other idle
    with process(LOADER, str(tmp_path / "unused"), "sleep") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        sleeper = min(c.pid for c in psutil.Process(rank.pid).children())
        wait_for(lambda: in_call(sleeper, "clock_nanosleep", "nanosleep") and in_call(rank.pid, "read", "poll"), 30,
                 "the waits")  # fmt: skip
        assert loader_leaf(rank.pid) == ""
    # both workers idle, waiting for the rank to feed them (no leaf of their own: the rank is where the wait is)
    with process(LOADER, str(tmp_path / "unused"), "idle") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        wait_for(lambda: in_call(rank.pid, "read", "poll"), 30, "the rank to wait")
        assert loader_leaf(rank.pid) == ""


# A producer beside the job, holding a FIFO open for writing: it sleeps, or computes before its next bytes.
WRITER = """
import sys, time
f = open(sys.argv[1], "wb")  # until a reader opens it
if sys.argv[2] == "sleep":
    time.sleep(3600)
while True:
    pass
"""


def followed(rank: int, polls: int) -> list[bool]:
    """Whether what the rank waits for moved, at each of `polls` polls 0.5 s apart after the first (its baseline)."""
    follower, moved = WaitFollower(), []
    follower.follow(rank, time.monotonic())
    for _ in range(polls):
        time.sleep(0.5)
        waited = follower.follow(rank, time.monotonic())
        assert waited is not None and len(waited.pids) == 2, waited  # its two workers, whatever else is followed
        moved.append(waited.moved)
        follower.end_poll()
    return moved


def test_a_worker_reading_a_fifo_is_as_alive_as_the_fifos_writers(tmp_path: Path) -> None:
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    # GIVEN a DataLoader's worker reading a FIFO that a producer outside the job's tree holds open and sleeps in
    with process(WRITER, str(fifo), "sleep"), process(LOADER, str(fifo), "fifo") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        reader = min(c.pid for c in psutil.Process(rank.pid).children())
        wait_for(lambda: in_call(reader, "read") and in_call(rank.pid, "read", "poll"), 30, "the waits")
        # THEN nothing the rank waits for moves, and its leaf is its workers': definite
        assert followed(rank.pid, 3) == [False, False, False]
        assert loader_leaf(rank.pid) == "workers"
    # BUT a producer that computes before its next bytes is followed as the worker's writer: the rank is alive
    with process(WRITER, str(fifo), "spin"), process(LOADER, str(fifo), "fifo") as rank:
        wait_for(lambda: len(psutil.Process(rank.pid).children()) == 2, 30, "the workers to start")
        reader = min(c.pid for c in psutil.Process(rank.pid).children())
        wait_for(lambda: in_call(reader, "read") and in_call(rank.pid, "read", "poll"), 30, "the waits")
        assert any(followed(rank.pid, 16)), "the writer's CPU time (0.2 s within 10 s) is motion"


def test_every_leaf_has_its_class_and_words() -> None:
    assert [(leaf.name, leaf.definite) for leaf in LEAVES] == [("stopped", True), ("fifo", True), ("poll", True),
                                                               ("workers", True), ("other", False)]  # fmt: skip
    assert all(leaf.what for leaf in LEAVES)
