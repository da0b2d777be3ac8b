"""A still rank's TCP sockets as motion: bytes its sockets carry (adapters.sockdiag: acknowledged by the peer or
received), an upload over plain HTTP from a thread of its own (boto3, s3fs, a MinIO client) that /proc/PID/io does not
count, since send() and recv() bypass it. The job's own connections never count — to a process of the job on this
host (gloo pairs, the TCPStore its launcher or rank 0 serves), or to the rendezvous port (MASTER_PORT) — nor does a
trickle below a floor (a metrics client's heartbeats). Imports the stdlib, blackbox's /proc and sock_diag adapters."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from ..adapters import procfs, sockdiag
from ..detections import human_bytes

NET_FLOOR = 256 << 10  # a rank's counted sockets are motion from this many bytes ...
NET_WINDOW_S = 10.0  # ... within this long
STALE_S = 5.0  # a rank not followed for this long starts again from a baseline (it moved meanwhile: not news)


@dataclass
class _Rank:
    carried: dict[int, int]  # inode -> bytes carried, at the last poll that followed this rank
    at: float
    moves: deque[tuple[float, int, str]] = field(default_factory=deque)  # (when, bytes, the busiest peer)
    master_port: Optional[int] = None


class SocketFollower:
    def __init__(self, job_pids: Callable[[], Iterable[int]]) -> None:
        self._job_pids = job_pids  # the job's processes on this host: the launcher, the ranks, what they started
        self._ranks: dict[int, _Rank] = {}
        self._sockets: Optional[dict[int, sockdiag.TcpSocket]] = None  # read once a poll, when first needed
        self._by_local: dict[sockdiag.Endpoint, int] = {}
        self._job_inodes: Optional[set[int]] = None
        self.unreadable = False  # sock_diag could not be read (said by the caller, once)

    def end_poll(self) -> None:
        self._sockets, self._job_inodes = None, None

    def follow(self, pid: int, now: float) -> str:
        """What the rank's own sockets moved, in words, where that passes the floor ("moves bytes over TCP with
        10.0.0.7:9000: 180 kB/s"); "" otherwise (and on the first poll that follows it: a baseline)."""
        sockets = self._read()
        if sockets is None:
            return ""
        carried = {inode: sockets[inode].carried for inode in sockdiag.socket_inodes(pid) if inode in sockets}
        rank = self._ranks.get(pid)
        if rank is None or now - rank.at > STALE_S:
            try:
                port = procfs.environ(pid).get("MASTER_PORT", "")
            except (OSError, procfs.ProcAccessError):  # gone, or going (ESRCH while it exits): nothing to follow
                return ""
            self._ranks[pid] = _Rank(carried, now, master_port=int(port) if port.isdigit() else None)
            return ""
        moved, busiest, most = 0, "", 0
        for inode, n in carried.items():
            delta = n - rank.carried.get(inode, 0)  # a socket opened since the last poll: all it carried
            if delta <= 0 or self._the_jobs_own(sockets[inode], rank.master_port):
                continue
            moved += delta
            if delta > most:
                busiest, most = sockdiag.endpoint(sockets[inode].remote), delta
        rank.carried, rank.at = carried, now
        moves = rank.moves
        if moved:
            moves.append((now, moved, busiest))
        while moves and moves[0][0] < now - NET_WINDOW_S:
            moves.popleft()
        total = sum(m[1] for m in moves)
        if total < NET_FLOOR or not moved:  # (a burst that ended: the bytes are old, the rank is still now)
            return ""
        return f"moves bytes over TCP with {busiest}: {human_bytes(total / NET_WINDOW_S)}/s"

    def _read(self) -> Optional[dict[int, sockdiag.TcpSocket]]:
        if self._sockets is None and not self.unreadable:
            self._sockets = sockdiag.tcp_sockets()
            if self._sockets is None:
                self.unreadable = True
                return None
            self._by_local = {s.local: s.inode for s in self._sockets.values()}
        return self._sockets

    def _the_jobs_own(self, s: sockdiag.TcpSocket, master_port: Optional[int]) -> bool:
        """A connection of the job's own: to the rendezvous port, or to a socket a process of the job holds here."""
        if master_port is not None and s.remote[1] == master_port:
            return True
        peer = self._by_local.get(s.remote)
        if peer is None:  # the other end is on another host (or gone): not the job's, unless at MASTER_PORT
            return False
        if self._job_inodes is None:
            self._job_inodes = set()
            for pid in self._job_pids():
                self._job_inodes |= sockdiag.socket_inodes(pid)
        return peer in self._job_inodes
