"""When to act (DESIGN.md §3): stall, frozen, exception and rank-death rules over heartbeat readings, which
ranks to blame, and which console lines mean the job is dying. Pure: no I/O, no clock of its own.
Imports the stdlib, blackbox.config and the heartbeat model."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from ..config import AUTO, RunConfig
from ..heartbeat import HeartbeatState

AUTO_FLOOR_S = 60.0  # `auto` never goes below this
AUTO_FACTOR = 5.0  # ... and is this many times the slowest step seen
AUTO_MIN_STEPS = 5  # before this many steps, `auto` uses the start-up timeout
PHASE_TIMEOUTS = {"checkpoint": "checkpoint_timeout", "eval": "eval_timeout"}
LIVE_STATES = ("starting", "running")

HANG_RULES = ("stall", "gpu_idle")  # kind "hang": collected, then (--on-stall kill) the job is ended
CRASH_RULES = ("exception", "rank_death", "console", "exit")  # kind "crash": what follows is the same episode


def incident_kind(rule: str) -> str:
    return "hang" if rule in HANG_RULES else "crash" if rule in CRASH_RULES else rule


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


@dataclass(frozen=True)
class RankFinding:
    rank: int
    pid: int
    step: int
    phase: str
    collective: str
    idle_s: float  # seconds since last progress (stall) or since the last liveness bump (frozen)
    timeout_s: float
    timeout_rule: str  # which timeout applied: startup, stall, auto, checkpoint, eval, frozen
    state: str
    exit_status: Optional[str] = None

    def describe(self) -> str:
        where = self.phase
        if self.phase == "collective" and self.collective != "none":
            where = f"collective {self.collective}"
        return f"rank {self.rank} (pid {self.pid}, step {self.step}, {where})"


@dataclass(frozen=True)
class Detection:
    rule: str  # stall | frozen | exception | rank_death | console
    ranks: tuple[int, ...]
    suspects: tuple[int, ...]
    reason: str  # why these suspects, one sentence
    findings: tuple[RankFinding, ...]

    def message(self) -> str:
        ranks = rank_ranges(self.suspects or self.ranks)
        if self.rule == "stall":
            first = (self.suspects or self.ranks)[0]
            f = next((f for f in self.findings if f.rank == first), self.findings[0])
            head = (
                f"stall: {_plural('rank', self.suspects or self.ranks)} {ranks} made no progress for "
                f"{f.idle_s:.0f} s ({f.timeout_rule} timeout {f.timeout_s:g} s)"
            )
        elif self.rule == "exception":
            return f"exception: {self.reason}"
        elif self.rule == "gpu_idle":
            return f"GPU idle: {self.reason}"
        elif self.rule == "console":
            return f"fatal output: {self.reason}; collecting before the launcher tears the ranks down"
        elif self.rule == "frozen":
            head = f"frozen: {_plural('rank', self.ranks)} {ranks} stopped answering (liveness thread silent)"
        else:
            head = f"rank death: {_plural('rank', self.ranks)} {ranks} exited without finishing"
        return f"{head}; {self.reason}"


def stall_timeout(hb: HeartbeatState, cfg: RunConfig) -> tuple[float, str]:
    """The timeout that applies to this rank now, and the name of the rule that chose it."""
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


def blame(stalled: list[RankView], everyone: list[RankView]) -> tuple[tuple[int, ...], str]:
    """The ranks that cause a stall, not the ones that wait for them, and why."""
    dead = [v for v in everyone if v.died]
    if dead:
        return _ids(dead), (
            f"{_plural('rank', _ids(dead))} {rank_ranges(_ids(dead))} died and the others wait for "
            f"{_verb(dead, 'it', 'them')}"
        )
    # A rank under a longer phase timeout (checkpoint, eval) is not "stalled" yet, but if it has not progressed
    # since the stalled ranks stopped, it is the likelier cause: they may be waiting for it.
    stopped_at = max(v.hb.last_progress for v in stalled)
    quiet = [v for v in everyone if v.alive and v.hb.state in LIVE_STATES and v not in stalled
             and v.hb.last_progress <= stopped_at + 1.0]  # fmt: skip
    waiting = [v for v in stalled if v.hb.phase == "collective"]
    elsewhere = [v for v in stalled + quiet if v.hb.phase != "collective"]
    if waiting and elsewhere:
        ops = sorted({v.hb.collective for v in waiting})
        phases = sorted({v.hb.phase for v in elsewhere})
        return _ids(elsewhere), (
            f"{_plural('rank', _ids(waiting))} {rank_ranges(_ids(waiting))} {_verb(waiting, 'waits', 'wait')} in "
            f"{'/'.join(ops)} while "
            f"{_plural('rank', _ids(elsewhere))} {rank_ranges(_ids(elsewhere))} never arrived "
            f"(phase {'/'.join(phases)})"
        )
    by_op: dict[str, list[RankView]] = {}
    for v in waiting:
        by_op.setdefault(v.hb.collective, []).append(v)
    if len(by_op) > 1 and not elsewhere:  # every rank waits, but not in the same collective: a mismatch
        smallest = min(len(group) for group in by_op.values())
        odd = [v for group in by_op.values() if len(group) == smallest for v in group]
        calls = "; ".join(f"{_plural('rank', _ids(g))} {rank_ranges(_ids(g))} in {op}"
                          for op, g in sorted(by_op.items()))  # fmt: skip
        suspects = _ids(odd) if len(odd) < len(waiting) else _ids(waiting)
        return suspects, f"the ranks wait in different collectives ({calls}): a collective mismatch"
    steps = {v.hb.step for v in stalled}
    if len(steps) > 1:
        low = min(steps)
        behind = [v for v in stalled if v.hb.step == low]
        return _ids(behind), (
            f"{_plural('rank', _ids(behind))} {rank_ranges(_ids(behind))} {_verb(behind, 'is', 'are')} "
            f"behind at step {low} while others reached step {max(steps)}"
        )
    if not quiet and len(stalled) < len([v for v in everyone if v.alive and v.hb.state in LIVE_STATES]):
        return _ids(stalled), "the other ranks are still making progress"
    return _ids(stalled), "no rank stands out from the heartbeats alone: compare their stacks"


class Rules:
    """Evaluates the rules each poll; each episode is reported once (a stall again only after progress)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._stall_reported: dict[int, float] = {}  # rank -> last_progress value when reported
        self._frozen_reported: dict[tuple[int, int], int] = {}  # (rank, pid) -> liveness counter
        self._death_reported: set[tuple[int, int]] = set()  # (rank, pid)

    def evaluate(self, views: list[RankView], now: float) -> list[Detection]:
        out: list[Detection] = []
        # A rank whose main thread raised is about to die, and the launcher will then tear the others down:
        # this is the moment to catch the survivors. Its death afterwards is the same episode.
        raised = [v for v in views if v.alive and v.hb.state == "exception" and (v.rank, v.hb.pid) not in
                  self._death_reported]  # fmt: skip
        if raised:
            self._death_reported.update((v.rank, v.hb.pid) for v in raised)
            findings = tuple(self._finding(v, now, now - v.hb.last_progress, "exception") for v in raised)
            out.append(Detection("exception", _ids(raised), _ids(raised),
                                 f"{_plural('rank', _ids(raised))} {rank_ranges(_ids(raised))} raised an uncaught "
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
            out.append(Detection("rank_death", _ids(deaths), _ids(deaths), reasons, findings))

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
                "frozen", _ids(frozen), _ids(frozen),
                "the process exists but its recorder thread has not run: the GIL is held or the process is stopped",
                findings,
            ))  # fmt: skip

        stalled = []
        for v in live:
            timeout, _ = stall_timeout(v.hb, self.cfg)
            if now - v.hb.last_progress > timeout:
                stalled.append(v)
            else:
                self._stall_reported.pop(v.rank, None)  # progress again: re-arm
        fresh = [v for v in stalled if self._stall_reported.get(v.rank) != v.hb.last_progress]
        if fresh:
            for v in stalled:
                self._stall_reported[v.rank] = v.hb.last_progress
            suspects, reason = blame(stalled, views)
            # a suspect under a longer phase timeout is not "stalled" yet, but its facts belong to the finding
            involved = stalled + [v for v in views if v.rank in suspects and v not in stalled]
            findings = tuple(
                self._finding(v, now, now - v.hb.last_progress, *stall_timeout(v.hb, self.cfg)[::-1]) for v in involved
            )
            out.append(Detection("stall", _ids(stalled), suspects, reason, findings))
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


def _verb(views: list[RankView], one: str, many: str) -> str:
    return one if len(views) == 1 else many


def _plural(word: str, items: tuple[int, ...]) -> str:
    return word if len(items) == 1 else word + "s"


def rank_ranges(ranks: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2, 5'."""
    parts: list[str] = []
    items = sorted(ranks)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(parts)


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
        for line in buf[:cut].decode("utf-8", "replace").splitlines():
            m = _FATAL.search(line[:MAX_LINE])
            if m and m.lastgroup:
                out.append((m.lastgroup, line.strip()[:500]))
        return out
