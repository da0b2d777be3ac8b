"""Fail-slow: the straggler, named while the job runs. In synchronous training every rank steps at the same rate;
the rank the others wait for spends the least time waiting (in collectives, and in backward, where DDP and FSDP
wait for the gradient collectives) and the most in its own work (data, compute, checkpoint, eval). Over each
window, a rank whose own work per step exceeds the median of the others' by the factor (and by a noticeable share
of the step) is slow; slow for STRAGGLER_WINDOWS windows in a row, it is a straggler until it is not slow for
RECOVERY_WINDOWS in a row. Pure: readings in, events out; no I/O, no clock of its own.
Imports the stdlib, the rank protocol and the heartbeat model."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Optional

from .._recorder import protocol as P
from ..heartbeat_reader import HeartbeatState

WAITING = P.WAITING_PHASES  # where a rank waits for its peers (and, in backward, also computes)
OWN = ("compute", "data", "checkpoint", "eval", "other")  # its own work: the others wait while it does this
STRAGGLER_WINDOWS = 3  # windows in a row a rank must be slow in before it is named
RECOVERY_WINDOWS = 2  # ... and not slow in before its episode ends
MIN_STEPS = 3  # per window: fewer steps say too little (and no steps at all is a stall, not slowness)
MIN_EXTRA = 0.05  # the extra own work must also be this share of the median step: no alarm over microseconds


@dataclass(frozen=True)
class Reading:
    step: int
    spent: dict[str, float]  # seconds per phase so far (HeartbeatState.time_spent)


@dataclass(frozen=True)
class Window:
    """One rank over one window: per step, the seconds in each phase and in all."""

    rank: int
    per_step: dict[str, float]

    @property
    def step_s(self) -> float:
        return sum(self.per_step.values())

    @property
    def own_s(self) -> float:
        return sum(self.per_step.get(p, 0.0) for p in OWN)

    def shares(self) -> dict[str, float]:
        total = self.step_s
        return {p: round(v / total, 3) for p, v in self.per_step.items() if total > 0 and v > 0}


def windows(start: dict[int, Reading], end: dict[int, Reading]) -> list[Window]:
    """Each rank present at both ends, with enough steps between them."""
    out = []
    for rank in sorted(set(start) & set(end)):
        a, b = start[rank], end[rank]
        steps = b.step - a.step
        if steps < MIN_STEPS:
            continue
        per_step = {p: max(0.0, b.spent.get(p, 0.0) - a.spent.get(p, 0.0)) / steps for p in P.LEDGER_PHASES}
        out.append(Window(rank, per_step))
    return out


def slow_ranks(ws: list[Window], factor: float) -> dict[int, dict[str, Any]]:
    """rank -> what makes it slow in this window: its own work against the median of the others'."""
    out: dict[int, dict[str, Any]] = {}
    if len(ws) < 2:
        return out
    median_step = statistics.median(w.step_s for w in ws)
    for w in ws:
        others = [o for o in ws if o.rank != w.rank]
        median_own = statistics.median(o.own_s for o in others)
        extra = w.own_s - median_own
        if median_own <= 0 or w.own_s < factor * median_own or extra < MIN_EXTRA * median_step:
            continue
        typical = {p: statistics.median(o.per_step.get(p, 0.0) for o in others) for p in P.LEDGER_PHASES}
        phase = max(OWN, key=lambda p: w.per_step.get(p, 0.0) - typical[p])
        typical_step = sum(typical.values())
        out[w.rank] = {
            "phase": phase, "factor": round(w.own_s / median_own, 2), "own_s": round(w.own_s, 4),
            "others_own_s": round(median_own, 4), "step_s": round(w.step_s, 4), "shares": w.shares(),
            "others_shares": {p: round(v / typical_step, 3) for p, v in typical.items() if v > 0 and typical_step},
        }  # fmt: skip
    return out


class Stragglers:
    """Fed every poll; says when a straggler episode starts and ends (events: `straggler`, `straggler_end`)."""

    def __init__(self, factor: float, window_s: float) -> None:
        self.factor = factor
        self.window_s = window_s
        self.on = factor > 0 and window_s > 0
        self._start: dict[int, Reading] = {}
        self._since: Optional[float] = None
        self._slow: dict[int, int] = {}  # rank -> windows in a row it was slow in
        self._fine: dict[int, int] = {}  # active rank -> windows in a row it was not
        self.active: dict[int, dict[str, Any]] = {}  # rank -> its episode's detail (what `straggler` said)

    def feed(self, states: list[HeartbeatState], now: float) -> list[dict[str, Any]]:
        if not self.on:
            return []
        if self._since is not None and now - self._since < self.window_s:
            return []  # read the ledgers at the windows' edges only
        readings = {hb.rank: Reading(hb.step, hb.time_spent(now)) for hb in states if hb.ledger}
        if self._since is None:
            self._start, self._since = readings, now
            return []
        ws = windows(self._start, readings)
        self._start, self._since = readings, now
        slow = slow_ranks(ws, self.factor)
        events: list[dict[str, Any]] = []
        started = []
        for w in ws:
            if w.rank in slow:
                self._slow[w.rank] = self._slow.get(w.rank, 0) + 1
                self._fine.pop(w.rank, None)
                if w.rank not in self.active and self._slow[w.rank] >= STRAGGLER_WINDOWS:
                    self.active[w.rank] = slow[w.rank]
                    started.append(w.rank)
            else:
                self._slow.pop(w.rank, None)
                if w.rank in self.active:
                    self._fine[w.rank] = self._fine.get(w.rank, 0) + 1
                    if self._fine[w.rank] >= RECOVERY_WINDOWS:
                        detail = self.active.pop(w.rank)
                        del self._fine[w.rank]
                        events.append({"event": "straggler_end", "ranks": [w.rank], "phase": detail["phase"],
                                       "shares": w.shares()})  # fmt: skip
        if started:
            worst = max(started, key=lambda r: slow[r]["factor"])
            events.insert(0, {"event": "straggler", "ranks": started, "phase": slow[worst]["phase"],
                              "factor": slow[worst]["factor"], "window_s": self.window_s,
                              "details": {str(r): slow[r] for r in started}})  # fmt: skip
        return events


def describe(rank: int, detail: dict[str, Any]) -> str:
    """One line: "rank 1 spends 61 % of each step in data (others 7 %): 1.6x the median step's own work" (with
    a multiplication sign)."""
    phase = detail["phase"]
    mine = round(100 * detail["shares"].get(phase, 0.0))
    theirs = round(100 * detail["others_shares"].get(phase, 0.0))
    times = "\u00d7"
    return (
        f"rank {rank} spends {mine} % of each step in {phase} (others {theirs} %): {detail['factor']:.1f}{times} "
        "the median step's own work"
    )
