"""What /proc says a thread is blocked on (adapters.procfs.blocked), on real processes: a read of a pipe, an open of a
FIFO by a relative path (a mount that stopped answering looks the same to the job), a recv on a TCP socket. Each
child is reaped in `finally`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

from blackbox.adapters import procfs


def blocked_child(code: str, cwd: Path, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Start `code`, wait until /proc shows its main thread blocked as `until` wants, return what it shows."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd)
    try:
        deadline = time.monotonic() + 20
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            seen = procfs.blocked(proc.pid)
            if until(seen):
                return seen
            time.sleep(0.02)
        raise AssertionError(f"never blocked as wanted: {seen}")
    finally:
        proc.kill()
        proc.wait()


def test_a_read_of_a_pipe_and_an_open_of_a_fifo_by_a_relative_path(tmp_path: Path) -> None:
    pipe = blocked_child("import os; r, w = os.pipe(); os.read(r, 1)", tmp_path,
                         lambda b: b.get("syscall") == "read")  # fmt: skip
    assert (pipe["fd_kind"], pipe["state"]) == ("pipe", "S") and str(pipe["fd_target"]).startswith("pipe:[")
    os.mkfifo(tmp_path / "shard.bin")
    fifo = blocked_child("open('shard.bin', 'rb')", tmp_path, lambda b: b.get("syscall") in ("open", "openat"))
    assert fifo["path"] == str(tmp_path / "shard.bin") and fifo["fd_kind"] == "fifo"
    assert fifo["fs_type"] and fifo["mount"]


def test_a_recv_on_a_socket_names_the_other_end(tmp_path: Path) -> None:
    code = """
        import socket
        server = socket.create_server(("127.0.0.1", 0))
        conn = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        conn.recv(1)
    """
    sock = blocked_child(code, tmp_path, lambda b: b.get("syscall") in ("recvfrom", "read", "recvmsg"))
    assert sock["fd_kind"] == "socket" and str(sock["peer"]).startswith("127.0.0.1:")
