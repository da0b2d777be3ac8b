"""Following a rank's wait: when its main thread waits on another process — a child it waits for (wait4, waitid), or the
processes at the other end of a pipe it reads or polls (a tool's captured output, a DataLoader's or a process pool's
result queue) or of a FIFO it reads (its writer, wherever it runs), or, while it waits for a thread of its own or polls,
the rank's workers (a process pool's workers behind its result thread) — whether those processes, or any below them, or
the writers of a FIFO one of them reads, move. Motion there is bytes through their system calls (their /proc/PID/io,
which also holds what their reaped children moved) or CPU time from a floor: a compressor or a conversion script works
for a while without a byte, a poll loop's wake-ups use far less. No CUDA or NCCL spin lives in a process the rank waits
for, so its CPU time is work. Imports the stdlib, blackbox's /proc adapter and blackbox.redact (a command line is shown
redacted)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from ..adapters import procfs, proctree
from ..detections import human_bytes
from ..redact import redact_argv

CPU_FLOOR_TICKS = 20  # a followed process's CPU time counts as motion from this many clock ticks (0.2 s at 100 Hz) ...
CPU_WINDOW_S = 10.0  # ... within this long
RATE_WINDOW_S = 60.0  # "writing 412 MB in the last minute"
HOLDERS_TTL_S = 30.0  # who holds the pipes a rank polls is looked up again after this long (or when one is gone)


@dataclass
class _Seen:
    """One followed process at the last poll that read it."""

    read: int
    written: int
    base: tuple[float, int]  # (when, CPU ticks) the floor counts from


@dataclass(frozen=True)
class Waited:
    """What a rank's main thread waits for at one poll, and whether it moved."""

    name: str  # "its child `gzip -1` (pid 4121)", "its 2 child processes (pids 4121, 4122)"
    moved: bool
    read_1m: int = 0  # bytes the followed processes read and wrote over about the last minute
    written_1m: int = 0
    pids: tuple[int, ...] = ()  # the processes waited for (not those below them)

    def describe(self) -> str:
        """The words for the slow-phase line and `top`: "waits for its child `gzip -1` (pid 4121), which works:
        writing 3.1 MB in the last minute"."""
        amounts = [f"{verb} {human_bytes(n)}" for verb, n in (("writing", self.written_1m), ("reading", self.read_1m))
                   if n >= 1_000_000]  # fmt: skip
        how = " and ".join(amounts) + " in the last minute" if amounts else "using CPU or moving bytes"
        return f"waits for {self.name}, which {'work' if len(self.pids) > 1 else 'works'}: {how}"


@dataclass
class _Rank:
    totals: tuple[int, int] = (0, 0)  # bytes read and written by what it waited for, since followed
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)  # (time, read, written)


class WaitFollower:
    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], _Seen] = {}  # (pid, start ticks) of a followed process
        self._ranks: dict[int, _Rank] = {}  # rank pid -> what its waits moved
        self._polled: set[tuple[int, int]] = set()
        self._following: set[int] = set()  # rank pids followed at this poll
        self._names: dict[tuple[int, ...], str] = {}  # the processes waited for -> their name (a redacted command line)
        self._named: set[tuple[int, ...]] = set()  # ... named at this poll
        self._holders: dict[tuple[int, frozenset[str]], tuple[float, list[tuple[int, int]]]] = {}  # (rank pid, pipes)
        self._stats: dict[int, Optional[procfs.ProcStat]] = {}  # /proc/PID/stat read at this poll: once a process

    def _stat(self, pid: int) -> Optional[procfs.ProcStat]:
        if pid not in self._stats:
            self._stats[pid] = procfs.proc_stat(pid)
        return self._stats[pid]

    def follow(self, pid: int, now: float, workers_since: Optional[float] = None) -> Optional[Waited]:
        """What the main thread of process `pid` waits for, if another process, and whether that moved since the
        last poll; None when it waits for no other process. `workers_since` (CLOCK_MONOTONIC s): the main
        thread waits for a thread of its own or polls (its heartbeat says), so where the kernel shows no wait on a
        process, the rank's workers and what it started since then are what it may wait for (proctree.workers)."""
        waited, fifo = self._waited(pid, now)
        if not waited and workers_since is not None:
            waited = proctree.workers(pid, workers_since, self._stat)
        if not waited:
            return None
        moved, read, written = self._moved(waited + ([] if fifo else self._writers(pid, waited, now)), now)
        rank = self._ranks.setdefault(pid, _Rank())
        rank.totals = (rank.totals[0] + read, rank.totals[1] + written)
        rank.samples.append((now, *rank.totals))
        while len(rank.samples) > 2 and rank.samples[1][0] < now - RATE_WINDOW_S:
            rank.samples.popleft()
        _, r0, w0 = rank.samples[0]
        who = tuple(waited)
        name = self._names[who] = self._names.get(who) or proctree.waited_name(waited, redact_argv, fifo)
        self._named.add(who)
        return Waited(name, moved, rank.totals[0] - r0, rank.totals[1] - w0, who)

    def _moved(self, waited: list[int], now: float) -> tuple[bool, int, int]:
        """Whether these processes or any below them moved since the last poll (bytes, or CPU time over the floor),
        and the bytes they read and wrote meanwhile. A process seen for the first time sets its baseline."""
        moved, read, written = False, 0, 0
        for p in proctree.process_tree(waited):
            st = self._stat(p)
            if st is None:
                continue
            io = procfs.io_counters(p)
            ticks = st.cpu_ticks
            key = (p, st.start_ticks)
            self._polled.add(key)
            r, w = (io.rchar, io.wchar) if io is not None else (0, 0)
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = _Seen(r, w, (now, ticks))
                continue
            if (r, w) != (seen.read, seen.written):
                moved = True
                read, written = read + max(0, r - seen.read), written + max(0, w - seen.written)
            busy = ticks - seen.base[1] >= CPU_FLOOR_TICKS
            moved = moved or busy
            if busy or now - seen.base[0] > CPU_WINDOW_S:
                seen.base = (now, ticks)
            seen.read, seen.written = r, w
        return moved, read, written

    def _writers(self, rank: int, waited: list[int], now: float) -> list[int]:
        """The writers of the FIFOs that the processes a rank waits for are reading (a DataLoader worker reading a
        named pipe a producer beside the job feeds): the rank is as alive as they are, so they are followed with
        the processes it waits for."""
        out: list[int] = []
        for worker in waited:
            writers, fifo = self._waited(worker, now)  # (its system call read once: nothing for any other wait)
            if fifo:
                out += [w for w in writers if w != rank and w not in waited and w not in out]
        return out

    def _waited(self, pid: int, now: float) -> tuple[list[int], bool]:
        """proctree.waited_processes, with who holds a polled pipe or a read FIFO remembered for HOLDERS_TTL_S (a
        DataLoader's workers stay the same for an epoch; finding them reads every descriptor below the rank, a FIFO's
        writer every process's); and whether they are a FIFO's writers."""
        self._following.add(pid)
        waited, pipes = proctree.wait_target(pid)
        if not pipes:
            return waited, False
        known = self._holders.get((pid, pipes))
        if (
            known is None
            or now - known[0] > HOLDERS_TTL_S
            or not all(procfs.is_alive(*p, self._stat) for p in known[1])
        ):
            found = proctree.other_ends(pid, pipes)
            stats = [(p, self._stat(p)) for p in found]
            known = self._holders[(pid, pipes)] = (now, [(p, st.start_ticks) for p, st in stats if st is not None])
        return [p for p, _ in known[1]], proctree.is_fifo(pipes)

    def end_poll(self) -> None:
        """Forget the processes no rank waited for at this poll, and the ranks not followed."""
        self._seen = {k: v for k, v in self._seen.items() if k in self._polled}
        self._holders = {k: v for k, v in self._holders.items() if k[0] in self._following}
        self._ranks = {k: v for k, v in self._ranks.items() if k in self._following}
        self._names = {k: v for k, v in self._names.items() if k in self._named}
        self._named = set()
        self._following = set()
        self._polled = set()
        self._stats = {}
