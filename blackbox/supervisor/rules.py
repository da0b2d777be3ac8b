"""When to act (DESIGN.md §3): stall, frozen, exception and rank-death rules over heartbeat readings, and which
console lines mean the job is dying. Which ranks cause an incident is not decided here: the analysis blames, on
the bundle's evidence (blackbox.analyze.blame). Pure: no I/O, no clock of its own.
Imports the stdlib, blackbox.config, the shared words and the heartbeat model."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Optional

from ..config import AUTO, RunConfig
from ..detections import Detection, RankFinding, plural_ranks
from ..heartbeat_reader import HeartbeatState

AUTO_FLOOR_S = 60.0  # `auto` never goes below this
AUTO_FACTOR = 5.0  # ... and is this many times the slowest step seen
AUTO_MIN_STEPS = 5  # before this many steps, `auto` uses the start-up timeout
PHASE_TIMEOUTS = {"checkpoint": "checkpoint_timeout", "eval": "eval_timeout"}
LIVE_STATES = ("starting", "running")


@dataclass(frozen=True)
class RankView:
    """One rank as the supervisor sees it at one poll."""

    hb: HeartbeatState
    alive: bool
    exit_status: Optional[str] = None  # "exit code 3" / "signal 9 (SIGKILL)" where the supervisor reaped it

    @property
    def rank(self) -> int:
        return self.hb.rank

    @property
    def died(self) -> bool:
        return not self.alive and self.hb.state in (*LIVE_STATES, "exception")


FIRST_BATCH_PHASES = ("data", "checkpoint")


def stall_timeout(hb: HeartbeatState, cfg: RunConfig, begun: bool = False) -> tuple[float, str]:
    """The timeout that applies to this rank now, and the name of the rule that chose it. `begun`: training has
    begun on some rank (a batch taken): a rank still before its first step, parked in data or checkpoint, is
    holding up peers that already wait for it — the first-batch timeout, not the start-up one."""
    if hb.step == 0 and begun and hb.phase in FIRST_BATCH_PHASES:
        return cfg.first_batch_timeout, "first_batch"
    if hb.step == 0 or (cfg.stall_timeout == AUTO and hb.step < AUTO_MIN_STEPS):
        timeout, rule = cfg.startup_timeout, "startup"
    elif cfg.stall_timeout == AUTO:
        timeout, rule = max(AUTO_FLOOR_S, AUTO_FACTOR * hb.slowest_step_dt), "auto"
    else:
        timeout, rule = float(cfg.stall_timeout), "stall"
    phase_option = PHASE_TIMEOUTS.get(hb.phase)
    if phase_option is not None:
        phase_timeout = float(getattr(cfg, phase_option))
        if phase_timeout > timeout:
            timeout, rule = phase_timeout, hb.phase
    return timeout, rule


class Rules:
    """Evaluates the rules each poll; each episode is reported once: a stall again only after progress, and a rank
    that crosses its own timeout while a stall is already reported (the waiting ranks, a moment later) joins that
    episode rather than making a new incident."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._stall_reported: dict[int, float] = {}  # rank -> last_progress value when reported
        self._frozen_reported: dict[tuple[int, int], int] = {}  # (rank, pid) -> liveness counter
        self._death_reported: set[tuple[int, int]] = set()  # (rank, pid)
        self._hang_mark: Optional[float] = None  # the newest progress seen when a stall was reported

    def evaluate(self, views: list[RankView], now: float) -> list[Detection]:
        out: list[Detection] = []
        # A rank whose main thread raised is about to die, and the launcher will then tear the others down:
        # this is the moment to catch the survivors. Its death afterwards is the same episode.
        raised = [v for v in views if v.alive and v.hb.state == "exception" and (v.rank, v.hb.pid) not in
                  self._death_reported]  # fmt: skip
        if raised:
            self._death_reported.update((v.rank, v.hb.pid) for v in raised)
            findings = tuple(self._finding(v, now, now - v.hb.last_progress, "exception") for v in raised)
            out.append(Detection("exception", _ids(raised), f"{plural_ranks(_ids(raised))} raised an uncaught "
                                 "exception and will exit", findings))  # fmt: skip
        deaths = [v for v in views if v.died and (v.rank, v.hb.pid) not in self._death_reported]
        if deaths:
            self._death_reported.update((v.rank, v.hb.pid) for v in deaths)
            findings = tuple(self._finding(v, now, 0.0, "death") for v in deaths)
            reasons = "; ".join(
                f"rank {v.rank} " + (v.exit_status or ("raised an exception" if v.hb.state == "exception"
                                                       else "was killed or exited abruptly"))
                for v in deaths
            )  # fmt: skip
            out.append(Detection("rank_death", _ids(deaths), reasons, findings))

        live = [v for v in views if v.alive and v.hb.state in LIVE_STATES]
        frozen = []
        for v in live:
            key = (v.rank, v.hb.pid)
            silent = now - v.hb.liveness_time
            if silent > self.cfg.frozen_timeout and self._frozen_reported.get(key) != v.hb.liveness:
                self._frozen_reported[key] = v.hb.liveness
                frozen.append(v)
        if frozen:
            findings = tuple(
                self._finding(v, now, now - v.hb.liveness_time, "frozen", self.cfg.frozen_timeout) for v in frozen
            )
            out.append(Detection(
                "frozen", _ids(frozen),
                "the process exists but its recorder thread has not run: the GIL is held or the process is stopped",
                findings,
            ))  # fmt: skip

        newest = max((v.hb.last_progress for v in live), default=None)
        if self._hang_mark is not None and newest is not None and newest > self._hang_mark:
            self._hang_mark = None  # a rank progressed: the stall episode is over
        begun = any(v.hb.batches > 0 or v.hb.step > 0 for v in views)
        stalled = []
        for v in live:
            timeout, _ = stall_timeout(v.hb, self.cfg, begun)
            if now - v.hb.last_progress > timeout:
                stalled.append(v)
            else:
                self._stall_reported.pop(v.rank, None)  # progress again: re-arm
        fresh = [v for v in stalled if self._stall_reported.get(v.rank) != v.hb.last_progress]
        if fresh:
            for v in stalled:
                self._stall_reported[v.rank] = v.hb.last_progress
            # the ranks under a longer timeout (checkpoint, eval, start-up) that have not progressed since the
            # stalled ones stopped belong to the facts: the others may be waiting for them
            stopped_at = max(v.hb.last_progress for v in stalled)
            quiet = [v for v in live if v not in stalled and v.hb.last_progress <= stopped_at + 1.0]
            findings = tuple(self._finding(v, now, now - v.hb.last_progress,
                                           *stall_timeout(v.hb, self.cfg, begun)[::-1])
                             for v in stalled + quiet)  # fmt: skip
            same = self._hang_mark is not None
            if not same:
                self._hang_mark = newest
            ranks = _ids(fresh) if same else _ids(stalled)
            out.append(Detection("stall", ranks, "", findings, same_episode=same))
        return out

    @staticmethod
    def _finding(v: RankView, now: float, idle: float, rule: str, timeout: float = 0.0) -> RankFinding:
        return RankFinding(
            rank=v.rank, pid=v.hb.pid, step=v.hb.step, phase=v.hb.phase, collective=v.hb.collective,
            idle_s=round(idle, 3), timeout_s=timeout, timeout_rule=rule, state=v.hb.state,
            exit_status=v.exit_status,
        )  # fmt: skip


def _ids(views: list[RankView]) -> tuple[int, ...]:
    return tuple(sorted(v.rank for v in views))


# --- fatal console lines --------------------------------------------------------------------------------
# What the job prints when it is about to die: collect at once, before the launcher tears the others down.
FATAL_LINES: tuple[tuple[str, str], ...] = (
    ("comm_timeout", r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck|"
                     r"Timed out waiting \d+ ?ms for (?:recv|send) operation"),
    ("cuda_error", r"CUDA error: |CUBLAS_STATUS_[A-Z_]+|cuDNN error|NCCL error|nccl(?:UnhandledCuda|Internal|"
                   r"System|Invalid)(?:Error|Usage)|an illegal memory access was encountered"),
    ("oom", r"CUDA out of memory|OutOfMemoryError|\bout of memory\b"),
    ("segfault", r"Segmentation fault|Fatal Python error|SIGSEGV|SIGBUS|SIGABRT|core dumped"),
    ("child_failed", r"ChildFailedError"),
    ("exception", r"^Traceback \(most recent call last\):"),
)  # fmt: skip
_FATAL = re.compile("|".join(f"(?P<{kind}>{rx})" for kind, rx in FATAL_LINES), re.MULTILINE | re.IGNORECASE)
MAX_LINE = 4096
# What any fatal line contains, lower-cased (FATAL_LINES' patterns): a chunk with none of them costs no pattern.
_FATAL_CANDIDATES = (b"watchdog", b"timed out", b"cuda", b"cublas", b"cudnn", b"nccl", b"illegal memory",
                     b"out of memory", b"outofmemoryerror", b"segmentation fault", b"fatal python error", b"sigsegv",
                     b"sigbus", b"sigabrt", b"core dumped", b"childfailederror", b"traceback")  # fmt: skip


class FatalLines:
    """Finds fatal lines in the job's output as it streams (bytes cut anywhere); thread-safe. Each match is
    (kind, the line). Pure: the caller decides what to do about a match."""

    def __init__(self) -> None:
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def feed(self, data: bytes, stream: int = 0) -> list[tuple[str, str]]:
        with self._lock:
            buf = self._partial.pop(stream, b"") + data
            cut = buf.rfind(b"\n") + 1
            rest = buf[cut:]
            self._partial[stream] = rest[-MAX_LINE:]
        out: list[tuple[str, str]] = []
        lower = buf[:cut].lower()
        if not any(c in lower for c in _FATAL_CANDIDATES):  # the common case: one fast scan, no pattern at all
            return out
        for line in buf[:cut].decode("utf-8", "replace").splitlines():
            if not any(c in line.lower().encode() for c in _FATAL_CANDIDATES):
                continue
            m = _FATAL.search(line[:MAX_LINE])
            if m and m.lastgroup:
                out.append((m.lastgroup, line.strip()[:500]))
        return out
