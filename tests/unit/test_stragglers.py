"""Fail-slow, on hand-made time ledgers: the rank the others wait for is named after three slow windows, in the phase
where its extra time goes, and cleared when it keeps pace again; a healthy job and one whose every rank jitters are
never named. Pure (blackbox.supervisor.stragglers)."""

from __future__ import annotations

import random
from typing import Any, Callable

from blackbox._recorder import protocol as P
from blackbox.supervisor.stragglers import STRAGGLER_WINDOWS, Stragglers, describe
from tests.unit.test_rules import hb

Shares = dict[str, float]  # seconds per step, by phase


def run(plan: Callable[[int, int], Shares], ranks: int, seconds: float, poll: float = 1.0,
        window: float = 15.0) -> list[dict[str, Any]]:  # fmt: skip
    """Feed `seconds` of polls; `plan(rank, window number)` gives each rank's seconds per step in each phase."""
    s = Stragglers(1.5, window)
    spent = [dict.fromkeys(P.LEDGER_PHASES, 0.0) for _ in range(ranks)]
    steps = [0.0] * ranks
    events: list[dict[str, Any]] = []
    t = 0.0
    while t <= seconds:
        for r in range(ranks):
            per_step = plan(r, int(t // window))
            step_s = sum(per_step.values())
            steps[r] += poll / step_s
            for phase, v in per_step.items():
                spent[r][phase] += poll / step_s * v
        states = [hb(r, step=int(steps[r]), phase="compute", phase_start=t,
                     ledger=tuple(spent[r][p] for p in P.LEDGER_PHASES)) for r in range(ranks)]  # fmt: skip
        events += [{**e, "t": t} for e in s.feed(states, t)]
        t += poll
    return events


def synchronous(slow: Shares, others: Shares) -> tuple[Shares, Shares]:
    """The same step time on every rank: the others wait (in backward, as under DDP) while the slow one works."""
    step = max(sum(slow.values()), sum(others.values()))
    return ({**slow, "backward": slow.get("backward", 0.0) + step - sum(slow.values())},
            {**others, "backward": others.get("backward", 0.0) + step - sum(others.values())})  # fmt: skip


def test_a_slow_loader_is_named_after_three_windows_then_cleared() -> None:
    # GIVEN rank 1 whose batches take 60 ms more from window 2 to window 6 (a slow disk), under DDP
    fast = {"data": 0.007, "compute": 0.04, "backward": 0.05}
    slow, waiting = synchronous({"data": 0.067, "compute": 0.04, "backward": 0.05}, fast)

    def plan(rank: int, window: int) -> Shares:
        if 2 <= window < 6:
            return slow if rank == 1 else waiting
        return fast

    events = run(plan, ranks=2, seconds=150)
    # THEN one event names rank 1 and `data`, three windows after the onset, and one says it recovered
    (started,) = [e for e in events if e["event"] == "straggler"]
    assert started["ranks"] == [1] and started["phase"] == "data" and started["factor"] > 1.5
    assert 2 * 15 + STRAGGLER_WINDOWS * 15 - 15 <= started["t"] <= 2 * 15 + 60
    line = describe(1, started["details"]["1"])
    assert line.startswith("rank 1 spends ") and " % of each step in data (others " in line and "the median" in line
    (ended,) = [e for e in events if e["event"] == "straggler_end"]
    assert ended["ranks"] == [1] and ended["t"] > started["t"]


def test_a_slow_compute_rank_among_four_is_named_in_compute() -> None:
    fast = {"data": 0.002, "compute": 0.03, "backward": 0.03}
    slow, waiting = synchronous({"data": 0.002, "compute": 0.09, "backward": 0.03}, fast)
    events = run(lambda rank, w: slow if rank == 2 else waiting, ranks=4, seconds=60)
    (started,) = [e for e in events if e["event"] == "straggler"]
    assert started["ranks"] == [2] and started["phase"] == "compute"


def test_a_healthy_job_and_a_jittery_one_are_never_named() -> None:
    healthy = {"data": 0.005, "compute": 0.04, "backward": 0.05}
    assert run(lambda rank, w: healthy, ranks=2, seconds=300) == []
    rng = random.Random(7)

    def jitter(rank: int, window: int) -> Shares:  # each rank's compute varies by up to ±40 % from window to window
        return {"data": 0.005, "compute": 0.04 * rng.uniform(0.6, 1.4), "backward": 0.05}

    assert run(jitter, ranks=8, seconds=300) == []


def test_off_and_too_few_steps_say_nothing() -> None:
    slow, waiting = synchronous({"data": 0.5, "compute": 0.04}, {"data": 0.01, "compute": 0.04})
    assert run(lambda rank, w: slow if rank else waiting, ranks=2, seconds=5 * 15 + 1, window=15.0)
    s = Stragglers(0, 15.0)
    assert s.feed([hb(0, ledger=(0.0,) * 8)], 100.0) == [] and not s.on
    # a step every 10 s: fewer than MIN_STEPS in a 15 s window says too little to name anyone
    glacial, _ = synchronous({"data": 9.0, "compute": 1.0}, {"data": 0.1, "compute": 1.0})
    assert run(lambda rank, w: glacial, ranks=2, seconds=200) == []
