"""Each rank's I/O as progress, read from /proc (adapters.procfs) at every poll: a checkpoint being written or an index
being read is a rank at work even when it neither steps nor runs Python code. Counted as motion: any byte through the
main thread's own read and write system calls (files, pipes, sockets); the main thread woken inside one such call
(a single long write to slow storage counts its bytes only when it returns); and storage bytes of the whole process
(a thread writing a checkpoint while the main thread waits for it) once they pass a floor, so that a logger's appends
and the writeback of the heartbeat page do not make a hung rank look busy; a flush the main thread is in (fsync,
close on NFS, msync) while what holds its file writes (adapters.writeback); and, while the rank is otherwise still,
the processes its main thread waits for (supervisor.waits) and the bytes its TCP sockets carry (supervisor.netwatch:
send() and recv() are not in /proc/PID/io). The rank's own CPU time is never read: a CUDA sync or an NCCL wait spins
a core while nothing moves. Imports the stdlib, blackbox's /proc and writeback adapters, its wait and socket
followers and detections (for human_bytes)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from ..adapters import procfs, writeback
from ..detections import human_bytes
from .netwatch import SocketFollower
from .waits import WaitFollower

STORAGE_FLOOR = 1 << 20  # the whole process's storage bytes count as motion from this many ...
STORAGE_WINDOW_S = 10.0  # ... within this long
RATE_WINDOW_S = 60.0  # "writing 412 MB in the last minute"


@dataclass
class RankIo:
    """One rank process's I/O as the supervisor has seen it."""

    moved_at: float = 0.0  # the last poll at which its I/O counted as motion (CLOCK_MONOTONIC); 0: never seen
    read: int = 0  # bytes through read system calls, the whole process, since it started (rchar)
    written: int = 0  # bytes through write system calls (wchar)
    readable: bool = True  # /proc let us read its counters
    in_call: bool = False  # its main thread is inside a read or write system call now
    waits_for: str = ""  # what its main thread waits for, where that made its last motion ("waits for its child …")
    waited: tuple[int, ...] = ()  # the processes its main thread waited for at the last poll that followed it
    _main: Optional[int] = None  # the main thread's rchar + wchar at the last poll
    _wakeups: Optional[int] = None  # its wake-ups inside a read or write call at the last poll (None: in none)
    _flush: Optional[tuple[float, writeback.Flush]] = None  # (when, the flush its main thread was in) at the last poll
    _flush_from: Optional[tuple[float, writeback.Flush]] = None  # ... and at the first poll that found it in that flush
    _base: tuple[float, int] = (0.0, -1)  # (when, storage bytes) the floor counts from
    _samples: deque[tuple[float, int, int]] = field(default_factory=deque)  # (time, read, written)

    def last_minute(self) -> tuple[int, int]:
        """Bytes read and written over about the last RATE_WINDOW_S (since the first poll, when younger)."""
        if not self._samples:
            return 0, 0
        _, r0, w0 = self._samples[0]  # the last poll at or before the window's start, or the first one
        return max(0, self.read - r0), max(0, self.written - w0)


class IoWatch:
    def __init__(self, job_pids: Callable[[], Iterable[int]] = tuple) -> None:
        """`job_pids`: the job's processes on this host (their connections to each other are not motion)."""
        self._ranks: dict[tuple[int, int], RankIo] = {}  # (rank, pid)
        self._rebase = False
        self.waits = WaitFollower()
        self.sockets = SocketFollower(job_pids)

    def get(self, rank: int, pid: int) -> Optional[RankIo]:
        return self._ranks.get((rank, pid))

    def rebase(self) -> None:
        """The next reading sets the baselines and counts nothing: blackbox's own collection just made the ranks
        write (the dump signal's stack dump is written by the rank's main thread)."""
        self._rebase = True

    def end_poll(self) -> None:
        self._rebase = False
        self.waits.end_poll()
        self.sockets.end_poll()

    def sample(self, rank: int, pid: int, now: float, follow: bool = False,
               workers_since: Optional[float] = None) -> RankIo:  # fmt: skip
        """The rank's I/O at this poll, and whether it moved. `follow`: the rank is otherwise still (no step, batch,
        forward call or stack change for a while), so what its main thread waits for is followed too
        (`workers_since`: see WaitFollower.follow)."""
        io = self._ranks.get((rank, pid))
        if io is None:
            io = self._ranks[(rank, pid)] = RankIo()
        proc = procfs.io_counters(pid)
        main = procfs.io_counters(pid, pid)
        io.readable = proc is not None
        if proc is None:
            return io
        io.read, io.written = proc.rchar, proc.wchar
        samples = io._samples
        samples.append((now, proc.rchar, proc.wchar))
        while len(samples) > 2 and samples[1][0] < now - RATE_WINDOW_S:
            samples.popleft()
        own = main.rchar + main.wchar if main is not None else None
        wakeups = procfs.rw_wakeups(pid, pid)
        storage = proc.read_bytes + proc.write_bytes
        base_t, base_bytes = io._base
        moved = False
        flush: Optional[writeback.Flush] = None  # the flush or counted write the main thread is in, read once a poll
        counting = not self._rebase and base_bytes >= 0
        woken = wakeups is not None and io._wakeups is not None and wakeups > io._wakeups
        if counting:
            moved = own is not None and io._main is not None and own != io._main
            if not moved and (woken or follow):
                flush = writeback.flushing(pid, pid)
            if woken and not moved:
                # woken inside a long read or write: bytes are moving — but a write to a file on a disk or NFS is
                # woken every 200 ms past the dirty limit whatever goes out: its store's count decides (_drains)
                moved = flush is None or not flush.is_write
            if storage - base_bytes >= STORAGE_FLOOR:
                moved = True
        drains = _drains(io, flush, now) if follow and not moved and counting else ""
        moved = moved or bool(drains)
        itself = moved
        waited = self.waits.follow(pid, now, workers_since) if follow and not moved else None
        carried = self.sockets.follow(pid, now) if follow and not moved else ""
        io.waited = waited.pids if waited is not None else ()
        if waited is not None and waited.moved and counting:
            moved = True
            io.waits_for = waited.describe()
        elif carried and counting:
            moved = True
            io.waits_for = carried
        elif itself:
            io.waits_for = drains
        if base_bytes < 0 or self._rebase or moved or now - base_t > STORAGE_WINDOW_S:
            io._base = (now, storage)
        io._main = own
        io._wakeups = wakeups
        io.in_call = wakeups is not None
        if moved:
            io.moved_at = now
        return io


def _drains(io: RankIo, flush: Optional[writeback.Flush], now: float) -> str:
    """Whether a flush the main thread is in (`flush`: writeback.flushing, this poll) wrote since the last poll, in
    words with its rate since the flush began ("in fsync(), its file's pages going out: the disk (259:1) writes
    4.2 MB/s": a throttled disk writes in bursts, a poll's own rate swings); "" when it is in none, or nothing went
    out (a mount that answers nothing). The first poll in a flush sets its baseline."""
    before, io._flush = io._flush, (now, flush) if flush is not None else None
    if flush is None or before is None or before[1].counter != flush.counter:
        io._flush_from = io._flush
        return ""
    if flush.written <= before[1].written:
        return ""
    since = io._flush_from or before
    rate = (flush.written - since[1].written) / max(now - since[0], 1e-3)
    kind, _, name = flush.counter.partition(" ")
    where = {"block": f"the disk ({name})", "nfs": f"the NFS server of {name}"}.get(kind, "the host")
    return f"in {flush.call}(), its file's pages going out: {where} writes {human_bytes(rate)}/s"
