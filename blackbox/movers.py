"""Which thread of its own keeps a waiting rank alive, in words for the supervisor's slow-phase line and `status`:
"waits for its thread `upload-0` (tid 4123), which works: writing 9.1 MB/s". The rank's recorder names the thread
when it takes over (P.RANK_MOVER); its bytes since then are read from /proc. Imports the stdlib, the protocol,
blackbox's /proc adapter, safe file opening and detections (for human_bytes)."""

from __future__ import annotations

import json
import os
from typing import Optional

from ._recorder import protocol as P
from .adapters import procfs
from .detections import human_bytes
from .safeopen import RunDir, UnsafeFile

MAX_RECORD = 4096
PAUSE_S = 5.0  # named once a rank has taken no step for this long (the recorder names a mover from then on)


def describe(run_dir: str, rank: int, pid: int, now: float, since: float) -> str:
    """The words for the thread a rank's waiting main thread is as alive as; "" when its recorder named none since
    the pause began (`since`: its last step), or that thread is gone. `now`, `since`: CLOCK_MONOTONIC, the clock the
    recorder wrote its time in."""
    record = _record(RunDir(run_dir, None), rank)
    if record is None or record[2] < since:  # none, or an earlier pause's
        return ""
    tid, name, at, read, written = record
    io = procfs.io_counters(pid, tid)
    if io is None:
        return ""  # the thread ended (or the process): it keeps nothing alive now
    span = max(now - at, 1e-3)
    if read < 0 or written < 0:  # its bytes could not be read when it took over
        read, written = io.rchar, io.wchar
    moved = (("writing", io.wchar - written), ("reading", io.rchar - read))
    rates = [f"{verb} {human_bytes(n / span)}/s" for verb, n in moved if n > 0]  # a slow upload's bytes too
    how = " and ".join(rates) if rates else "running Python code"  # no byte: its CPU-backed stack changes moved
    return f"waits for its thread `{name}` (tid {tid}), which works: {how}"


def _record(run: RunDir, rank: int) -> Optional[tuple[int, str, float, int, int]]:
    """(tid, name, since, bytes read then, written then) from the rank's mover file; None where it does not fit."""
    try:
        data = json.loads(run.read(os.path.join(P.RANKS_DIR, str(rank), P.RANK_MOVER), MAX_RECORD))
    except (OSError, UnsafeFile, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    tid, name, at = data.get("tid"), data.get("name"), data.get("at")
    read, written = data.get("read"), data.get("written")
    if not (isinstance(tid, int) and tid > 0 and isinstance(name, str) and isinstance(at, (int, float))
            and isinstance(read, int) and isinstance(written, int)):  # fmt: skip
        return None
    return tid, " ".join(name.split())[:60], float(at), read, written
