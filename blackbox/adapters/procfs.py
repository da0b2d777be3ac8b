"""Linux /proc: process identity (pid + start time, so a reused pid is never mistaken for a rank),
liveness, children and signal masks. May import the stdlib, psutil and blackbox._recorder.protocol."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Optional

import psutil

from .._recorder.protocol import parse_proc_stat


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z, T ...
    ppid: int
    start_ticks: int


def proc_stat(pid: int) -> Optional[ProcStat]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid, start = parse_proc_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return ProcStat(state, ppid, start)


def is_alive(pid: int, start_ticks: int = 0) -> bool:
    """True while `pid` runs and is the same process (same start time) as the one recorded."""
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return not start_ticks or st.start_ticks == start_ticks


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_if_same(pid: int, start_ticks: int, sig: int) -> bool:
    """Send `sig` to `pid` only if it is still the process we recorded; never to a recycled pid."""
    if pid <= 1 or not is_alive(pid, start_ticks):
        return False
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def has_handler(pid: int, sig: int = signal.SIGUSR1) -> bool:
    """Whether `pid` catches `sig` (SigCgt in /proc/PID/status): without a handler it would die of it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except (OSError, ValueError):
        pass
    return False
