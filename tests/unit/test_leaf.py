"""The leaf a still rank waits at (supervisor.leaf), read from /proc on real processes: a FIFO's open or read and a
stopped process are definite, as is a poll loop its recorder saw; a sleep, a pipe from a child, a socket and a
spinning native call are not (they keep the step-based timeouts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from blackbox.supervisor.leaf import LEAVES, of_rank
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


def test_every_leaf_has_its_class_and_words() -> None:
    assert [(leaf.name, leaf.definite) for leaf in LEAVES] == [("stopped", True), ("fifo", True), ("poll", True),
                                                               ("other", False)]  # fmt: skip
    assert all(leaf.what for leaf in LEAVES)
