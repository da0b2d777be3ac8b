"""The heartbeat file: the rank's writer (a few stores into an mmap, no syscall, no lock) and the decoder
the supervisor uses. Stdlib only, Python >= 3.9: loaded inside the job's interpreter."""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

from . import protocol as P

_SEQ_PACK = P.SEQ.pack_into
_PROGRESS_PACK = P.PROGRESS.pack_into
_PHASE_PACK = P.PHASE.pack_into
_COLL_PACK = P.COLLECTIVE.pack_into
_NAME_PACK = P.PHASE_NAME.pack_into
_WORD_PACK = P.WORD.pack_into
_LIVE_PACK = P.LIVENESS.pack_into
_DATA_PACK = P.DATA.pack_into


class HeartbeatWriter:
    """Owned by one rank. Main-thread writers go through the seqlock; the liveness thread and the
    state word are single stores outside it."""

    def __init__(
        self, path: str, *, pid: int, start_ticks: int, rank: int, local_rank: int, world_size: int, mode: str
    ) -> None:
        tmp = "%s.%d.tmp" % (path, pid)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, P.HEARTBEAT_SIZE)
            self.mm = mmap.mmap(fd, P.HEARTBEAT_SIZE)
        finally:
            os.close(fd)
        self.wall0 = time.time()
        self.mono0 = time.monotonic()
        mm = self.mm
        P.HEADER.pack_into(mm, P.OFF_HEADER, P.MAGIC, P.HEARTBEAT_VERSION, P.HEARTBEAT_SIZE)
        P.IDENT.pack_into(
            mm, P.OFF_IDENT, pid, start_ticks, rank, local_rank, world_size,
            P.MODE_CODES.get(mode, 0), self.wall0, self.mono0,
        )  # fmt: skip
        _PROGRESS_PACK(mm, P.OFF_PROGRESS, 0, self.mono0, 0.0, 0.0)
        _PHASE_PACK(mm, P.OFF_PHASE, P.PHASE_STARTUP, self.mono0)
        _LIVE_PACK(mm, P.OFF_LIVENESS, 0, self.mono0)
        self.seq = 0
        os.replace(tmp, path)  # readers only ever see a complete header

    # --- main thread, seqlocked -------------------------------------------------------------------
    def progress(self, step: int, now: float, step_dt: float, slowest_dt: float) -> None:
        mm = self.mm
        seq = self.seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq)
        _PROGRESS_PACK(mm, P.OFF_PROGRESS, step, now, step_dt, slowest_dt)
        self.seq = seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq + 1)

    def phase(self, code: int, start: float, name: bytes = b"") -> None:
        mm = self.mm
        seq = self.seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq)
        _PHASE_PACK(mm, P.OFF_PHASE, code, start)
        if code == P.PHASE_CUSTOM:
            _NAME_PACK(mm, P.OFF_PHASE_NAME, name)
        self.seq = seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq + 1)

    def collective(self, code: int, start: float, op: int, op_seq: int) -> None:
        mm = self.mm
        seq = self.seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq)
        _PHASE_PACK(mm, P.OFF_PHASE, code, start)
        _COLL_PACK(mm, P.OFF_COLLECTIVE, op, op_seq)
        self.seq = seq + 1
        _SEQ_PACK(mm, P.OFF_SEQ, seq + 1)

    # --- single stores ----------------------------------------------------------------------------
    def state(self, code: int) -> None:
        _WORD_PACK(self.mm, P.OFF_STATE, code)

    def liveness(self, counter: int, now: float) -> None:
        _LIVE_PACK(self.mm, P.OFF_LIVENESS, counter, now)

    def data(self, waited_total: float, batches: int) -> None:
        _DATA_PACK(self.mm, P.OFF_DATA, waited_total, batches)


@dataclass(frozen=True)
class HeartbeatState:
    """One consistent reading of a heartbeat file. Times are CLOCK_MONOTONIC seconds of the rank's host
    (comparable with the supervisor's `time.monotonic()`); `wall0`/`mono0` convert them to wall time."""

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
    collective: str
    collective_seq: int
    state: str
    liveness: int
    liveness_time: float
    dump_request: int
    dump_ack: int
    data_wait_total: float
    batches: int

    def wall(self, mono: float) -> float:
        return self.wall0 + (mono - self.mono0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class HeartbeatFormatError(Exception):
    pass


def decode(buf: Any, retries: int = 100) -> HeartbeatState:
    """Read a heartbeat from a buffer (an mmap or bytes). Raises HeartbeatFormatError for a file that
    is not a heartbeat or comes from a newer layout."""
    if len(buf) < P.HEARTBEAT_SIZE:
        raise HeartbeatFormatError("heartbeat file is %d bytes, expected %d" % (len(buf), P.HEARTBEAT_SIZE))
    magic, version, _size = P.HEADER.unpack_from(buf, P.OFF_HEADER)
    if magic != P.MAGIC:
        raise HeartbeatFormatError("not a blackbox heartbeat file (bad magic %r)" % (magic,))
    if version > P.HEARTBEAT_VERSION:
        raise HeartbeatFormatError(
            "heartbeat layout version %d is newer than this blackbox understands (%d)" % (version, P.HEARTBEAT_VERSION)
        )
    ident = P.IDENT.unpack_from(buf, P.OFF_IDENT)
    block: Optional[bytes] = None
    for _ in range(retries):
        (seq1,) = P.SEQ.unpack_from(buf, P.OFF_SEQ)
        if seq1 & 1:
            continue
        block = bytes(buf[P.OFF_PROGRESS : P.SEQLOCK_END])
        (seq2,) = P.SEQ.unpack_from(buf, P.OFF_SEQ)
        if seq1 == seq2:
            break
        block = None
    if block is None:  # a writer that stopped mid-update (killed there): take the last bytes as they are
        block = bytes(buf[P.OFF_PROGRESS : P.SEQLOCK_END])
    base = P.OFF_PROGRESS
    step, last_progress, last_dt, slowest_dt = P.PROGRESS.unpack_from(block, P.OFF_PROGRESS - base)
    phase_code, phase_start = P.PHASE.unpack_from(block, P.OFF_PHASE - base)
    op, op_seq = P.COLLECTIVE.unpack_from(block, P.OFF_COLLECTIVE - base)
    (raw_name,) = P.PHASE_NAME.unpack_from(block, P.OFF_PHASE_NAME - base)
    if phase_code == P.PHASE_CUSTOM:
        phase = raw_name.rstrip(b"\0").decode("utf-8", "replace") or "custom"
    else:
        phase = P.PHASE_NAMES.get(phase_code, "unknown")
    (state_code,) = P.WORD.unpack_from(buf, P.OFF_STATE)
    liveness, liveness_time = P.LIVENESS.unpack_from(buf, P.OFF_LIVENESS)
    (dump_request,) = P.WORD.unpack_from(buf, P.OFF_DUMP_REQUEST)
    (dump_ack,) = P.WORD.unpack_from(buf, P.OFF_DUMP_ACK)
    data_wait, batches = P.DATA.unpack_from(buf, P.OFF_DATA)
    modes = {v: k for k, v in P.MODE_CODES.items()}
    return HeartbeatState(
        version=version,
        pid=ident[0],
        start_ticks=ident[1],
        rank=ident[2],
        local_rank=ident[3],
        world_size=ident[4],
        mode=modes.get(ident[5], "unknown"),
        wall0=ident[6],
        mono0=ident[7],
        step=step,
        last_progress=last_progress,
        last_step_dt=last_dt,
        slowest_step_dt=slowest_dt,
        phase=phase,
        phase_start=phase_start,
        collective=P.COLLECTIVE_OPS[op] if 0 <= op < len(P.COLLECTIVE_OPS) else "unknown",
        collective_seq=op_seq,
        state=P.STATE_NAMES[state_code] if 0 <= state_code < len(P.STATE_NAMES) else "unknown",
        liveness=liveness,
        liveness_time=liveness_time,
        dump_request=dump_request,
        dump_ack=dump_ack,
        data_wait_total=data_wait,
        batches=batches,
    )
