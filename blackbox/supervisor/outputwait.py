"""Whether the job is blocked on its own output: blackbox's tee cannot write to blackbox's stdout or stderr (nothing
reads them: a pager, a log shipper that stopped, a terminal paused with Ctrl-S), so a rank that writes its output
blocks in write(). That is not a stall and never a reason to end the job: the rank is as alive as what reads its
output. Imports the stdlib and blackbox's /proc adapter."""

from __future__ import annotations

from typing import Optional

from ..adapters import procfs, proctree

BLOCKED_AFTER_S = 2.0  # the tee inside one write, its bytes not moving, this long: blackbox's output is not read
WORDS = "blocked writing its output: nothing reads blackbox's stdout or stderr"


class OutputWait:
    def __init__(self) -> None:
        self._since: Optional[float] = None  # when the tee was first seen stuck in a write
        self._written = -1  # the tee's bytes written at that poll
        self._targets: set[str] = set()  # what the tee's descriptors point to, while it is stuck

    def tee_stuck(self, tee: Optional[int], now: float) -> bool:
        """Whether the tee has been inside one write to blackbox's output, writing nothing, for BLOCKED_AFTER_S."""
        io = procfs.io_counters(tee) if tee is not None else None
        if tee is None or io is None or proctree.write_target(tee) is None or io.wchar != self._written:
            self._since, self._written, self._targets = None, io.wchar if io is not None else -1, set()
            return False
        if self._since is None:
            self._since, self._targets = now, proctree.fd_targets(tee)
        return now - self._since >= BLOCKED_AFTER_S

    def rank_blocked(self, pid: int) -> bool:
        """Whether a rank's main thread is writing to what the stuck tee reads: one of its pipes, or a pty whose
        master it holds."""
        target = proctree.write_target(pid)
        if target is None:
            return False
        return target in self._targets or (target.startswith("/dev/pts/") and "/dev/ptmx" in self._targets)
