"""A still rank's TCP bytes (supervisor.netwatch over adapters.sockdiag), on real sockets and real processes: bytes
its sockets carry to a server outside the job are motion, past a floor; the job's own connections (to a process of
the job, to MASTER_PORT) and a trickle are not; the kernel's queues are read per socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from blackbox.adapters import sockdiag
from blackbox.supervisor.netwatch import NET_FLOOR, SocketFollower

SENDER = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
chunk = b"x" * int(sys.argv[2])
print("connected", flush=True)
while True:
    s.sendall(chunk)
    time.sleep(0.05)
"""


@contextmanager
def server(read: bool = True) -> Iterator[int]:
    """A server on loopback that reads what it is sent (or, `read=False`, takes nothing); its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    accepted: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            if read:
                threading.Thread(target=lambda c=conn: [None for _ in iter(lambda: c.recv(1 << 16), b"")],
                                 daemon=True).start()  # fmt: skip

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        for s in [listener, *accepted]:
            s.close()


@contextmanager
def sender(port: int, chunk: int, **env: str) -> Iterator[subprocess.Popen[str]]:
    """A process that sends `chunk` bytes every 50 ms to `port` (a rank uploading), with `env` added."""
    proc = subprocess.Popen([sys.executable, "-c", SENDER, str(port), str(chunk)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def followed(pid: int, job: tuple[int, ...] = (), polls: int = 6) -> list[str]:
    """What the follower says of `pid` at each of `polls` polls 0.5 s apart (`job`: the job's processes)."""
    follower = SocketFollower(lambda: job)
    said = []
    for _ in range(polls):
        said.append(follower.follow(pid, time.monotonic()))
        follower.end_poll()
        time.sleep(0.5)
    assert not follower.unreadable
    return said


def test_an_upload_to_a_server_outside_the_job_is_motion_and_a_trickle_is_not() -> None:
    # GIVEN a process sending 64 kB every 50 ms (about 1.3 MB/s) to a server that reads it
    with server() as port, sender(port, 64_000) as proc:
        said = followed(proc.pid)
    # THEN the first poll sets the baseline, and the next ones say what moves and with whom
    assert said[0] == ""
    assert all(f"moves bytes over TCP with 127.0.0.1:{port}: " in s and s.endswith("/s") for s in said[2:]), said
    # BUT 100 bytes every 50 ms (a metrics client's heartbeat) stay under the floor
    with server() as port, sender(port, 100) as proc:
        assert followed(proc.pid) == [""] * 6
    assert NET_FLOOR > 100 * 20 * 10  # (what it sends in the window)


def test_the_jobs_own_connections_are_not_motion() -> None:
    # GIVEN the same upload to a process of the job (a TCPStore served by the launcher, a gloo pair) ...
    with server() as port, sender(port, 64_000) as proc:
        assert followed(proc.pid, job=(os.getpid(),)) == [""] * 6
    # ... or to the rendezvous port of another host (MASTER_PORT)
    with server() as port, sender(port, 64_000, MASTER_PORT=str(port)) as proc:
        assert followed(proc.pid) == [""] * 6


def test_a_peer_that_takes_nothing_moves_nothing_and_its_queue_shows() -> None:
    # GIVEN a sender whose server accepts and reads nothing: its buffers fill, then nothing moves
    with server(read=False) as port, sender(port, 64_000) as proc:
        time.sleep(3)  # the buffers fill
        assert followed(proc.pid, polls=4)[1:] == [""] * 3
        # AND its socket holds what it could not send, as the collector records it
        (mine,) = [s for s in sockdiag.of_process(proc.pid, sockdiag.tcp_sockets() or {})
                   if s["peer"] == f"127.0.0.1:{port}"]  # fmt: skip
        assert isinstance(mine["unsent"], int) and mine["unsent"] > 0, mine


def test_sockets_are_read_with_their_endpoints_and_counts() -> None:
    listener = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    conn, _ = listener.accept()
    try:
        client.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(conn.recv(1 << 16))
        table = sockdiag.tcp_sockets()
        assert table is not None
        mine, theirs = table[os.fstat(client.fileno()).st_ino], table[os.fstat(conn.fileno()).st_ino]
        # an IPv4 peer of an IPv6 socket is spelled as IPv4 (one socket, one spelling)
        assert mine.remote == theirs.local == ("127.0.0.1", listener.getsockname()[1])
        assert mine.carried >= 100_000 and theirs.carried == 100_000  # acknowledged (with the SYN's 1) and received
        assert {os.fstat(client.fileno()).st_ino, os.fstat(conn.fileno()).st_ino} <= sockdiag.socket_inodes(os.getpid())
    finally:
        for s in (client, conn, listener):
            s.close()


def test_a_rank_that_is_gone_or_exiting_is_nothing_to_follow() -> None:
    # GIVEN a process that has ended (a rank exits between the poll's reading of the ranks and this follow)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    pid = proc.pid
    proc.wait()
    # THEN following it says nothing moved, and never raises (that ended the watch: "the job goes on unwatched")
    assert SocketFollower(lambda: []).follow(pid, time.monotonic()) == ""
