"""Decoding a rank's heartbeat file (layout in blackbox/_recorder/protocol.py) into one consistent
HeartbeatState, and the table of a run's heartbeats (read each poll; a dump request written into one).
Host side; imports the stdlib, the protocol and safeopen."""

from __future__ import annotations

import math
import mmap
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Optional

from ._recorder import protocol as P
from .safeopen import RunDir

_MODES = {v: k for k, v in P.MODE_CODES.items()}


_Words = tuple["memoryview[int]", "memoryview[float]"]  # a group's words as integers and as floats


class HeartbeatFormatError(Exception):
    pass


class HeartbeatBusy(Exception):
    """No clean copy of a group could be had within the patience (its writer kept rewriting it, or died in the
    middle of an update) and there is no earlier clean reading to fall back on."""


@dataclass(frozen=True)
class HeartbeatState:
    """One consistent reading. Times are CLOCK_MONOTONIC seconds of the rank's host (comparable with the
    supervisor's `time.monotonic()`); `wall0`/`mono0` convert them to wall-clock time."""

    version: int
    pid: int
    start_ticks: int
    rank: int
    local_rank: int
    world_size: int
    mode: str
    wall0: float
    mono0: float
    step: int
    last_progress: float
    last_step_dt: float
    slowest_step_dt: float
    phase: str
    phase_start: float
    collective: str  # the last Python-visible collective the rank entered
    collective_seq: int
    state: str
    liveness: int
    liveness_time: float
    dump_request: int
    dump_ack: int
    data_wait_total: float
    batches: int
    busy: bool = False  # a group was being rewritten throughout the read: its fields are the last clean reading
    # the time ledger (layout version 2): seconds in each phase of protocol.LEDGER_PHASES, up to the current phase's
    # start; empty for a version-1 page
    ledger: tuple[float, ...] = ()
    # motion (layout version 3; zero before): progress that is not a step, seen by the rank's liveness thread
    forwards: int = 0  # module forward calls counted during pauses (the hook is installed only then)
    forwards_time: float = 0.0  # when that count last changed
    stack_changes: int = 0  # samples at which the main thread's Python stack differed from the sample before
    stack_time: float = 0.0  # when it last did
    forward_mode: str = "idle"  # the forward counter: idle (no pause), counting, off (torch.compile in use)
    waiting: str = ""  # what its main thread waits for: "thread" (of its own), "poll" (sleeps and checks), "sleep"
    join: str = (
        ""  # its default process group: "" (not joined yet, or unknown), "joining" (in init_process_group), "joined"
    )

    @property
    def workers_since(self) -> Optional[float]:
        """Where its main thread waits for a thread of its own or polls: its last progress (mono s), from which
        what it started, and its Python workers, are what it may wait for (proctree.workers); else None."""
        return self.last_progress if self.waiting in ("thread", "poll", "sleep") else None

    @property
    def last_motion(self) -> float:
        """The last time this rank moved in any way its heartbeat shows: a step, a batch, a forward call, its main
        thread's stack changing (I/O is read from /proc by the host side)."""
        return max(self.last_progress, self.forwards_time, self.stack_time)

    def wall(self, mono: float) -> float:
        return self.wall0 + (mono - self.mono0)

    def time_spent(self, now: float) -> dict[str, float]:
        """Seconds in each phase up to `now` (CLOCK_MONOTONIC): the ledger, and the current phase's time since it
        began. Empty without a ledger."""
        return P.time_spent(self.ledger, self.phase, now - self.phase_start) if self.ledger else {}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RingEntry:
    """A phase edge from the rank's ring (layout 4 and 5): the phase it entered, at which step, when (mono s); in a
    collective, its op and the rank's own sequence number of it in its group; torch's count of the collectives the
    rank had issued on its default group by then (layout 5; 0: unknown, or none yet)."""

    n: int
    phase: str
    collective: str
    seq: int
    start: float
    step: int
    issued: int = 0


def ring(buf: Any) -> list[RingEntry]:
    """The rank's last phase edges, oldest first, read from its page without its help (an mmap or bytes).
    Untrusted: an entry whose two numbers are not the one its slot should hold (torn by a write under way,
    overwritten, made up) is dropped, as is one whose time is not a number; a page of layout 1-3 has none."""
    if len(buf) < P.HEARTBEAT_SIZE:
        return []
    magic, version, _size = P.HEADER.unpack_from(buf, P.OFF_HEADER)
    if magic != P.MAGIC or version < 4:
        return []
    words = P.RING_WORDS_4 if version == 4 else P.RING_WORDS
    view = memoryview(buf)[: P.HEARTBEAT_SIZE]
    q, d = view.cast("Q"), view.cast("d")
    out = []
    for slot in range(P.RING_ENTRIES):
        w = P.W_RING + slot * words
        last = q[w + words - 1]  # loaded in the reverse of the writer's order: last number, fields, first number
        what, seq, start = q[w + 1], q[w + 2], d[w + words - 2]
        issued = q[w + 3] if words == P.RING_WORDS else 0
        n = q[w]
        if n == 0 or n != last or (n - 1) % P.RING_ENTRIES != slot or not math.isfinite(start):
            continue
        code, op, step = what & 0xFF, (what >> 8) & 0xFF, what >> 16
        phase = P.PHASE_NAMES.get(code, "custom" if code == P.PHASE_CUSTOM else "unknown")
        collective = P.COLLECTIVE_OPS[op] if op < len(P.COLLECTIVE_OPS) else "unknown"
        out.append(RingEntry(n, phase, collective if code == P.PHASE_COLLECTIVE else "", seq, start, step, issued))
    return sorted(out, key=lambda e: e.n)


def _group(q: memoryview[int], first: int, last: int, patience_s: float) -> _Words | None:
    """Copies of the words [first, last] once the version words at both ends agree (end loaded first).
    A writer preempted mid-update makes readers wait; one killed mid-update never finishes: give up then."""
    deadline = 0.0
    while True:
        v_end = q[last]
        words = q[first : last + 1].tobytes()
        v_start = q[first]
        if v_start == v_end != 0:
            raw = memoryview(words)
            return raw.cast("Q"), raw.cast("d")
        now = time.monotonic()
        if not deadline:
            deadline = now + patience_s
        elif now > deadline:
            return None
        time.sleep(0)


def decode(buf: Any, patience_s: float = 0.05, last: Optional[HeartbeatState] = None) -> HeartbeatState:
    """Read a heartbeat from a buffer (an mmap or bytes). Raises HeartbeatFormatError for a file that is
    not a heartbeat or comes from a newer layout. A mixed reading is never returned: a group that cannot be
    copied cleanly within the patience keeps its fields from `last` (the rank's last clean reading, marked
    `busy`), and without one HeartbeatBusy is raised."""
    if len(buf) < P.HEARTBEAT_SIZE:
        raise HeartbeatFormatError("heartbeat file is %d bytes, expected %d" % (len(buf), P.HEARTBEAT_SIZE))
    magic, version, _size = P.HEADER.unpack_from(buf, P.OFF_HEADER)
    if magic != P.MAGIC:
        raise HeartbeatFormatError(f"not a blackbox heartbeat file (bad magic {magic!r})")
    if version > P.HEARTBEAT_VERSION:
        raise HeartbeatFormatError(
            f"heartbeat layout version {version} is newer than this blackbox understands ({P.HEARTBEAT_VERSION})"
        )
    pid, ticks, rank, local_rank, world, mode, wall0, mono0 = P.IDENT.unpack_from(buf, P.OFF_IDENT)
    view = memoryview(buf)[: P.HEARTBEAT_SIZE]
    q, d = view.cast("Q"), view.cast("d")
    progress = _group(q, P.W_PROGRESS, P.W_PROGRESS_END, patience_s)
    phase_words = _group(q, P.W_PHASE, P.W_PHASE_END, patience_s)
    motion = _group(q, P.W_MOTION, P.W_MOTION_END, patience_s) if version >= 3 else None
    torn_motion = version >= 3 and motion is None
    if (progress is None or phase_words is None or torn_motion) and (last is None or last.pid != pid):
        raise HeartbeatBusy(f"rank {rank}'s heartbeat was being rewritten throughout the read")
    state = _state(q, d, (version, pid, ticks, rank, local_rank, world, mode, wall0, mono0), progress, phase_words,
                   motion)  # fmt: skip
    if progress is not None and phase_words is not None and not torn_motion:
        return state
    assert last is not None
    keep: dict[str, Any] = {"busy": True}
    if progress is None:
        keep.update({k: getattr(last, k) for k in ("step", "last_progress", "last_step_dt", "slowest_step_dt")})
    if phase_words is None:
        keep.update({k: getattr(last, k) for k in ("phase", "phase_start", "collective", "collective_seq")})
    if torn_motion:
        keep.update({k: getattr(last, k) for k in MOTION_FIELDS})
    return replace(state, **keep)


MOTION_FIELDS = ("forwards", "forwards_time", "stack_changes", "stack_time", "forward_mode", "waiting")


def _wait_name(code: int) -> str:
    return P.WAIT_NAMES[code] if 0 <= code < len(P.WAIT_NAMES) else "unknown"


def _join_name(code: int) -> str:
    return P.JOIN_NAMES[code] if 0 <= code < len(P.JOIN_NAMES) else "unknown"


def _state(q: Any, d: Any, ident: tuple[Any, ...], progress: Optional[_Words], phase_words: Optional[_Words],
           motion: Optional[_Words]) -> HeartbeatState:  # fmt: skip
    """The reading from the groups' clean copies (a missing group's fields zero, for the caller to replace).
    `ident`: the header's version and the identity block, unpacked."""
    version, pid, ticks, rank, local_rank, world, mode, wall0, mono0 = ident
    zeros = memoryview(bytes(8 * (P.W_PHASE_END - P.W_PHASE + 1)))
    pq, pd = progress or (zeros.cast("Q"), zeros.cast("d"))
    hq, hd = phase_words or (zeros.cast("Q"), zeros.cast("d"))
    b = P.W_PHASE
    code, op = hq[P.W_PHASE_CODE - b], hq[P.W_OP - b]
    if code == P.PHASE_CUSTOM:
        raw_name = hq[P.W_PHASE_NAME - b : P.W_PHASE_END - b].tobytes()
        phase = raw_name.rstrip(b"\0").decode("utf-8", "replace") or "custom"
    else:
        phase = P.PHASE_NAMES.get(code, "unknown")
    moving: dict[str, Any] = {}
    if motion is not None:
        mq, md = motion
        m = P.W_MOTION
        forward = mq[P.W_FORWARD_MODE - m]
        named = P.FORWARD_MODES[forward] if 0 <= forward < len(P.FORWARD_MODES) else "unknown"
        moving = {"forwards": mq[P.W_FORWARDS - m], "forwards_time": md[P.W_FORWARDS_TIME - m],
                  "stack_changes": mq[P.W_STACK_CHANGES - m], "stack_time": md[P.W_STACK_TIME - m],
                  "forward_mode": named, "waiting": _wait_name(q[P.W_WAITING])}  # fmt: skip
    state_code = q[P.W_STATE]
    a = P.W_PROGRESS
    return HeartbeatState(
        version=version, pid=pid, start_ticks=ticks, rank=rank, local_rank=local_rank, world_size=world,
        mode=_MODES.get(mode, "unknown"), wall0=wall0, mono0=mono0, step=pq[P.W_STEP - a],
        last_progress=pd[P.W_LAST_PROGRESS - a], last_step_dt=pd[P.W_LAST_DT - a],
        slowest_step_dt=pd[P.W_SLOWEST_DT - a], phase=phase, phase_start=hd[P.W_PHASE_START - b],
        collective=P.COLLECTIVE_OPS[op] if 0 <= op < len(P.COLLECTIVE_OPS) else "unknown",
        collective_seq=hq[P.W_OP_SEQ - b],
        state=P.STATE_NAMES[state_code] if 0 <= state_code < len(P.STATE_NAMES) else "unknown",
        liveness=q[P.W_LIVENESS], liveness_time=d[P.W_LIVENESS_TIME], dump_request=q[P.W_DUMP_REQUEST],
        dump_ack=q[P.W_DUMP_ACK], data_wait_total=d[P.W_DATA_WAIT], batches=q[P.W_BATCHES],
        join=_join_name(q[P.W_JOIN]),
        ledger=tuple(d[P.W_LEDGER : P.W_LEDGER + len(P.LEDGER_PHASES)]) if version >= 2 else (), **moving,
    )  # fmt: skip


class HeartbeatTable:
    """Every rank's heartbeat page under `ranks_dir`, mapped read-only; files that are symlinks, not regular, or
    (with `owner`) not the job's user's are refused (blackbox collect may run as root on another user's job)."""

    def __init__(self, ranks_dir: str, on_error: Callable[[str, str], None], owner: Optional[int] = None) -> None:
        self.ranks_dir = ranks_dir
        self.on_error = on_error  # (path, message), reported once per path and message
        self.dir = RunDir(ranks_dir, owner)
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}
        self._errors: set[tuple[str, str]] = set()
        self._last: dict[str, HeartbeatState] = {}  # each rank's last clean reading

    def read(self) -> list[HeartbeatState]:
        try:
            names = os.listdir(self.ranks_dir)
        except FileNotFoundError:
            return []
        states = []
        for name in sorted(names, key=lambda n: (len(n), n)):
            path = os.path.join(self.ranks_dir, name, P.RANK_HEARTBEAT)
            try:
                ino = os.stat(path, follow_symlinks=False).st_ino
                cached = self._maps.get(path)
                if cached is None or cached[0] != ino:
                    if cached is not None:
                        cached[1].close()
                    fd = self.dir.open_fd(f"{name}/{P.RANK_HEARTBEAT}")
                    try:
                        self._maps[path] = (os.fstat(fd).st_ino, mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
                    finally:
                        os.close(fd)
                state = decode(self._maps[path][1], last=self._last.get(path))
                if not state.busy:
                    self._last[path] = state
                states.append(state)
            except (FileNotFoundError, HeartbeatBusy):
                continue
            except (OSError, ValueError, HeartbeatFormatError) as exc:
                key = (path, str(exc))
                if key not in self._errors:
                    self._errors.add(key)
                    self.on_error(path, str(exc))
        return states

    def request_dump(self, rank: int) -> int:
        """Ask a rank for its own dump (its daemon thread watches this word); returns the request number."""
        fd = self.dir.open_fd(f"{rank}/{P.RANK_HEARTBEAT}", write=True)  # never through a link planted in its place
        try:
            mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        with mm:
            words = memoryview(mm).cast("Q")
            try:
                request = int(words[P.W_DUMP_REQUEST]) + 1
                words[P.W_DUMP_REQUEST] = request  # the supervisor is this word's only writer
            finally:
                words.release()
        return request

    def close(self) -> None:
        for _, mm in self._maps.values():
            mm.close()
        self._maps.clear()
