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


# --- the flight recorder's arrival order, and the report's "where the time went" ------------------------------------
def _dump(times: dict[int, int], group: str = "0") -> dict[str, Any]:
    return {"entries": [{"process_group": [group, "default_pg"], "collective_seq_id": seq, "time_created_ns": t}
                        for seq, t in times.items()]}  # fmt: skip


def test_the_flight_recorder_says_who_came_last() -> None:
    from blackbox.adapters.flight_recorder import arrivals

    # GIVEN rank 1 enqueuing each of 20 collectives 30 ms after rank 0, but for two, and a collective only rank 0 has
    fast = _dump({seq: seq * 10**9 for seq in range(21)})
    slow = _dump({seq: seq * 10**9 + (30_000_000 if seq % 10 else -1) for seq in range(20)})
    (a,) = arrivals({0: fast, 1: slow})
    assert (a.group, a.collectives, a.latest()) == ("0", 20, (1, 18))
    # junk entries are left out; one rank alone compares nothing
    junk = {"entries": [None, {"process_group": "0", "collective_seq_id": "3"}, {"collective_seq_id": 1}]}
    assert arrivals({0: junk, 1: junk}) == [] and arrivals({0: fast}) == []


def test_where_the_time_went_from_the_heartbeats_and_events() -> None:
    import json

    from blackbox.analyze.timeshare import findings, rank_shares, time_ledger
    from blackbox.bundle.reader import Bundle

    ledger = [0.0, 30.0, 55.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # compute 30 s, data 55 s, backward 1 s
    hb = {"ledger": ledger, "phase": "data", "phase_age_s": 4.0}
    seconds, shares = rank_shares(hb) or (0.0, {})
    assert seconds == 90.0 and shares == {"compute": 0.3333, "data": 0.6556, "backward": 0.0111}
    assert rank_shares({"ledger": [1, 2]}) is None and rank_shares({"phase": "data"}) is None  # layout 1, junk
    waiter = {"ledger": [0.0, 30.0, 1.0, 0.0, 0.0, 0.0, 59.0, 0.0], "phase": "backward", "phase_age_s": 0.0}
    events = [{"event": "straggler", "time": "t1", "ranks": [1], "phase": "data", "factor": 2.6,
               "details": {"1": {"phase": "data", "factor": 2.6, "shares": {"data": 0.61},
                                 "others_shares": {"data": 0.01}}}},
              {"event": "straggler", "ranks": ["x"]}, "not an event"]  # fmt: skip
    files = {
        "ranks/0/heartbeat.json": json.dumps(waiter).encode(),
        "ranks/1/heartbeat.json": json.dumps(hb).encode(),
        "events.jsonl": "\n".join(map(json.dumps, events)).encode(),
    }
    time = time_ledger(Bundle("b", {"schema_version": 2}, files, []), [0, 1], {0: "n", 1: "n"})
    assert [r["rank"] for r in time["ranks"]] == [0, 1] and time["data_share"] == round(60 / 180, 4)
    (episode,) = time["stragglers"]
    assert (episode["rank"], episode["phase"], episode["factor"], episode["ended"]) == (1, "data", 2.6, None)
    texts = [text for text, _ in findings(time, [])]
    assert texts[0].startswith("rank 1 was a straggler from t1: 61% of each step in data (others 1%), 2.6x")
    assert "the ranks spent 33% of their time waiting for data (rank 1: 66%)" in texts
