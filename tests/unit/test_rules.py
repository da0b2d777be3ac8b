"""Stall, frozen and rank-death rules: pure functions over heartbeat readings. They say which ranks a rule fired
on; who caused it is the analysis's blame (tests/unit/test_blame.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from blackbox.config import load_run_config
from blackbox.heartbeat_reader import HeartbeatState
from blackbox.supervisor.rules import RankView, Rules, stall_timeout


def hb(rank: int, **kw: Any) -> HeartbeatState:
    base = dict(
        version=1, pid=1000 + rank, start_ticks=1, rank=rank, local_rank=rank, world_size=2, mode="rank",
        wall0=0.0, mono0=0.0, step=10, last_progress=100.0, last_step_dt=0.1, slowest_step_dt=0.2,
        phase="compute", phase_start=100.0, collective="none", collective_seq=0, state="running",
        liveness=1, liveness_time=100.0, dump_request=0, dump_ack=0, data_wait_total=0.0, batches=0,
    )  # fmt: skip
    base.update(kw)
    return HeartbeatState(**base)


def cfg(**flags: Any) -> Any:
    return load_run_config(flags, {})


def test_stall_names_the_ranks_it_fired_on_and_leaves_the_blame_to_the_analysis() -> None:
    # GIVEN rank 0 waiting in all_reduce and rank 1 in compute, both idle past a 5 s timeout
    rules = Rules(cfg(stall_timeout="5"))
    views = [
        RankView(hb(0, phase="collective", collective="all_reduce", liveness_time=106.0), True),
        RankView(hb(1, liveness_time=106.0), True),
    ]
    # WHEN evaluated before and after the timeout
    assert rules.evaluate(views, now=104.0) == []
    (d,) = rules.evaluate(views, now=106.0)
    # THEN both are stalled, each with its facts; no suspect is named before the evidence is read
    assert d.rule == "stall" and d.ranks == (0, 1) and not d.same_episode
    assert [f.phase for f in d.findings] == ["collective", "compute"]
    assert d.message() == "stall: ranks 0-1 made no progress for 6 s (stall timeout 5 s)"


def test_a_rank_crossing_its_own_timeout_later_is_the_same_stall() -> None:
    # GIVEN rank 1 stalls first (its timeout is shorter), rank 0 crosses its own a moment later, nobody progressed
    rules = Rules(cfg(stall_timeout="auto", startup_timeout="100"))
    views = [RankView(hb(0, slowest_step_dt=30.0, liveness_time=300.0), True),
             RankView(hb(1, slowest_step_dt=1.0, liveness_time=300.0), True)]  # fmt: skip
    (first,) = rules.evaluate(views, now=170.0)  # rank 1: max(60, 5 x 1) = 60 s
    assert first.ranks == (1,) and not first.same_episode
    (second,) = rules.evaluate(views, now=260.0)  # rank 0: 5 x 30 = 150 s
    # THEN the second is marked as the same episode (no new incident), until a rank progresses
    assert second.ranks == (0,) and second.same_episode
    moved = [RankView(hb(0, last_progress=261.0, step=11, liveness_time=300.0), True), views[1]]
    assert rules.evaluate(moved, now=262.0) == []
    (third,) = rules.evaluate(moved, now=420.0)
    assert not third.same_episode


def test_a_rank_parked_in_its_first_batch_is_not_sheltered_by_the_startup_timeout() -> None:
    # GIVEN rank 0 took its first batch and waits in backward; rank 1 never got its first batch (step 0, data)
    c = cfg(stall_timeout="auto", first_batch_timeout="20")
    rules = Rules(c)
    views = [RankView(hb(0, step=0, batches=1, phase="compute", liveness_time=130.0), True),
             RankView(hb(1, step=0, batches=0, phase="data", liveness_time=130.0), True)]  # fmt: skip
    # THEN rank 1 is judged by the first-batch timeout, rank 0 still by the start-up one
    assert stall_timeout(views[1].hb, c, begun=True) == (20.0, "first_batch")
    assert stall_timeout(views[0].hb, c, begun=True) == (1800.0, "startup")
    assert stall_timeout(views[1].hb, c, begun=False) == (1800.0, "startup")
    (d,) = rules.evaluate(views, now=125.0)
    assert d.ranks == (1,) and d.findings[0].timeout_rule == "first_batch"
    # AND a job where nobody has taken a batch yet (loading the model) is still under the start-up timeout
    loading = [RankView(hb(r, step=0, batches=0, phase="data", liveness_time=130.0), True) for r in (0, 1)]
    assert Rules(c).evaluate(loading, now=125.0) == []


def test_stall_reported_once_then_rearmed_by_progress() -> None:
    rules = Rules(cfg(stall_timeout="5"))
    stuck = [RankView(hb(0, liveness_time=110.0), True)]
    assert len(rules.evaluate(stuck, now=106.0)) == 1
    assert rules.evaluate(stuck, now=108.0) == []  # the same episode
    moved = [RankView(hb(0, last_progress=107.0, step=11, liveness_time=110.0), True)]
    assert rules.evaluate(moved, now=108.0) == []  # progress re-arms
    assert len(rules.evaluate(moved, now=113.0)) == 1


def test_auto_timeout_waits_for_five_steps_then_scales_with_the_slowest_step() -> None:
    c = cfg()
    assert stall_timeout(hb(0, step=0), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=4), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=5, slowest_step_dt=2.0), c) == (60.0, "auto")
    assert stall_timeout(hb(0, step=50, slowest_step_dt=30.0), c) == (150.0, "auto")


def test_explicit_timeout_applies_from_the_first_step_and_phases_extend_it() -> None:
    c = cfg(stall_timeout="10", checkpoint_timeout="600")
    assert stall_timeout(hb(0, step=0), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=1), c) == (10.0, "stall")
    assert stall_timeout(hb(0, step=9, phase="checkpoint"), c) == (600.0, "checkpoint")
    assert stall_timeout(hb(0, step=9, phase="eval"), c) == (1800.0, "eval")


def test_a_rank_in_a_long_checkpoint_is_not_stalled() -> None:
    rules = Rules(cfg(stall_timeout="5", checkpoint_timeout="300"))
    views = [RankView(hb(0, phase="checkpoint", liveness_time=200.0), True)]
    assert rules.evaluate(views, now=200.0) == []


def test_a_quiet_rank_in_a_long_checkpoint_is_in_the_stall_facts() -> None:
    # GIVEN rank 1 waiting in all_reduce past its timeout, and rank 0 in a checkpoint (a longer timeout) that has
    # not progressed since either
    rules = Rules(cfg(stall_timeout="5", checkpoint_timeout="300"))
    views = [RankView(hb(0, phase="checkpoint", liveness_time=110.0), True),
             RankView(hb(1, phase="collective", collective="all_reduce", liveness_time=110.0), True)]  # fmt: skip
    (d,) = rules.evaluate(views, now=110.0)
    # THEN only rank 1 is stalled, and rank 0's facts (in checkpoint, its longer timeout) come with it
    assert d.ranks == (1,)
    assert [(f.rank, f.phase, f.timeout_rule) for f in d.findings] == [
        (1, "collective", "stall"),
        (0, "checkpoint", "checkpoint"),
    ]


def test_only_the_stalled_rank_is_named_when_the_others_progress() -> None:
    rules = Rules(cfg(stall_timeout="5"))
    views = [
        RankView(hb(0, last_progress=119.0, liveness_time=120.0), True),
        RankView(hb(1, liveness_time=120.0), True),
    ]
    (d,) = rules.evaluate(views, now=120.0)
    assert d.ranks == (1,) and [f.rank for f in d.findings] == [1]


def test_frozen_rank() -> None:
    rules = Rules(cfg(frozen_timeout="30"))
    views = [RankView(hb(0, last_progress=140.0, liveness_time=100.0), True)]
    (d,) = rules.evaluate(views, now=140.0)
    assert d.rule == "frozen" and d.ranks == (0,)
    assert rules.evaluate(views, now=141.0) == []


def test_rank_death_once_then_the_survivors_stall() -> None:
    rules = Rules(cfg(stall_timeout="5"))
    dead = RankView(hb(1, state="running"), False, "died of signal 9 (SIGKILL)")
    waiting = RankView(hb(0, phase="collective", collective="all_reduce", liveness_time=120.0), True)
    detections = rules.evaluate([waiting, dead], now=120.0)
    death = next(d for d in detections if d.rule == "rank_death")
    stall = next(d for d in detections if d.rule == "stall")
    assert death.ranks == (1,) and "SIGKILL" in death.reason
    assert stall.ranks == (0,)
    assert [d.rule for d in rules.evaluate([waiting, dead], now=121.0)] == []


def test_clean_exit_is_not_a_death() -> None:
    rules = Rules(cfg())
    assert rules.evaluate([RankView(hb(0, state="exited"), False)], now=5000.0) == []


def test_exception_then_gone_is_a_death() -> None:
    rules = Rules(cfg())
    (d,) = rules.evaluate([RankView(replace(hb(0), state="exception"), False)], now=100.0)
    assert d.rule == "rank_death" and "raised an exception" in d.reason
