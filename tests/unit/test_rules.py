"""The rules (stall, busy, frozen, rank death, and the slow-phase note): pure functions over hand-made heartbeat
readings. Progress is anything that moves — a step, a batch, a forward call, the main thread's stack, I/O — and a
stall is a job in which nothing moves: healthy long pauses of every kind are tried as hard as hangs. The rules say
which ranks they fired on; who caused it is the analysis's blame (tests/unit/test_blame.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from blackbox.config import load_run_config
from blackbox.detections import Detection
from blackbox.heartbeat_reader import HeartbeatState
from blackbox.supervisor.rules import RankView, Rules, busy_timeout, pause_timeout, stall_timeout


def hb(rank: int, **kw: Any) -> HeartbeatState:
    base = dict(
        version=3, pid=1000 + rank, start_ticks=1, rank=rank, local_rank=rank, world_size=2, mode="rank",
        wall0=0.0, mono0=0.0, step=10, last_progress=100.0, last_step_dt=0.1, slowest_step_dt=0.2,
        phase="compute", phase_start=100.0, collective="none", collective_seq=0, state="running",
        liveness=1, liveness_time=100.0, dump_request=0, dump_ack=0, data_wait_total=0.0, batches=10,
    )  # fmt: skip
    base.update(kw)
    return HeartbeatState(**base)


def cfg(**flags: Any) -> Any:
    return load_run_config(flags, {})


def live(state: HeartbeatState, now: float, **kw: Any) -> RankView:
    """A live rank whose liveness thread ticked at `now` (it answers), with I/O as given."""
    return RankView(replace(state, liveness_time=now), True, **kw)


def waiting(rank: int, now: float, **kw: Any) -> RankView:
    """A rank parked in a collective since t=100 (blocked in C: its stack does not change), liveness ticking."""
    return live(hb(rank, phase="collective", collective="barrier", **kw), now)


def run(rules: Rules, frames: Any) -> list[tuple[float, Detection]]:
    """Feed (now, views) pairs; every detection with the time it came."""
    return [(now, d) for now, views in frames for d in rules.evaluate(views, now)]


# --- stalls: nothing moves ---------------------------------------------------------------------------------


def test_stall_when_nothing_moves_names_the_ranks_and_leaves_the_blame_to_the_analysis() -> None:
    # GIVEN rank 0 waiting in all_reduce and rank 1 in compute, nothing moving since t=100
    rules = Rules(cfg(stall_timeout="5"))
    views = [waiting(0, 106.0), live(hb(1), 106.0)]
    # WHEN evaluated before and after the timeout
    assert rules.evaluate(views, now=104.0) == []
    (d,) = rules.evaluate(views, now=106.0)
    # THEN both are stalled, each with its facts; no suspect is named before the evidence is read
    assert d.rule == "stall" and d.ranks == (0, 1) and not d.same_episode
    assert [f.phase for f in d.findings] == ["collective", "compute"]
    assert d.message() == "stall: ranks 0-1 made no progress of any kind for 6 s (stall timeout 5 s)"


def test_the_watch_is_told_when_the_next_stall_timeout_runs_out() -> None:
    # GIVEN nothing moving since t=100, rank 1 on a FIFO (30 s) and rank 0 in all_reduce (the start-up timeout)
    rules = Rules(cfg())
    views = [waiting(0, 110.0, step=0), live(hb(1, step=0, phase="data"), 110.0, leaf="fifo")]
    # THEN the first timeout to run out is rank 1's, at t=130, whatever the phase of the polls
    assert rules.evaluate(views, now=110.0) == [] and rules.due == 130.0
    (d,) = rules.evaluate(views, now=130.05)
    assert d.ranks == (1,)
    # AND once rank 1 is reported, the next is rank 0's start-up timeout
    assert rules.due == 100.0 + 1800.0
    # AND with no rank alive there is nothing to wait for
    rules.evaluate([], now=131.0)
    assert rules.due is None


def test_a_rank_waiting_for_a_peer_that_moves_is_not_stalled_whatever_moves() -> None:
    # GIVEN rank 1 waiting at a barrier since t=100 (auto: 60 s), and rank 0 at work without a step, moving only by
    # one signal at a time: its I/O (a checkpoint written), its stack (metrics in Python), its forward calls (an
    # evaluation), its batches (a validation loader)
    c = cfg()
    kinds = {
        "io": lambda t: {"io_at": t},
        "stack": lambda t: {"stack_time": t, "stack_changes": int(t)},
        "forwards": lambda t: {"forwards_time": t, "forwards": int(t) * 3},
        "batches": lambda t: {"last_progress": t, "batches": 10 + int(t)},
    }
    for kind, moves in kinds.items():
        rules = Rules(c)
        detections = []
        for t in range(101, 400, 2):  # 300 s of work, far past the 60 s auto timeout
            fields = moves(float(t))
            io = {"io_at": fields.pop("io_at")} if "io_at" in fields else {}
            views = [live(hb(0, phase="checkpoint" if kind == "io" else "compute", **fields), t, **io),
                     waiting(1, t)]  # fmt: skip
            detections += [(t, d) for d in rules.evaluate(views, float(t))]
        # THEN neither is stalled, nor busy (300 s < the 1800 s busy timeout): one slow-phase note at the auto
        # timeout, naming rank 0 as the one at work and rank 1 as waiting
        # (the pause counts from the last step: for the loader, from the first reading, t=101)
        first = 163 if kind == "batches" else 161
        assert [(t, d.rule, d.ranks) for t, d in detections] == [(first, "slow_phase", (0,))], (kind, detections)
        note = detections[0][1]
        assert "rank 1 waits for it" in note.reason and "not a stall" in note.reason, note.reason
        assert [f.rank for f in note.findings] == [0, 1] and note.findings[1].doing.startswith("waits (collective")


def test_the_stall_counts_from_the_last_motion_of_any_kind() -> None:
    # GIVEN rank 0 wrote (I/O) until t=250, then stopped; rank 1 waits throughout
    rules = Rules(cfg())
    detections = run(rules, [(t, [live(hb(0, phase="checkpoint"), t, io_at=min(t, 250.0)), waiting(1, t)])
                             for t in range(101, 400, 1)])  # fmt: skip
    stalls = [(t, d) for t, d in detections if d.rule == "stall"]
    # THEN the stall comes 60 s (auto) after the last byte, not after the last step, and not 30 min later for
    # being in `checkpoint` (a checkpoint blocked on a FIFO is a hang like any other)
    assert [(t, d.ranks) for t, d in stalls] == [(311, (0, 1))]
    assert {f.timeout_rule for f in stalls[0][1].findings} == {"auto"}


def test_a_checkpoint_blocked_on_a_fifo_is_a_stall_at_the_auto_timeout() -> None:
    # GIVEN the gallery's ckpt-hang: rank 0 in torch.save holding the GIL (its liveness silent), rank 1 waiting
    rules = Rules(cfg())
    frozen0 = RankView(hb(0, phase="checkpoint", liveness_time=100.0), True)
    (d,) = rules.evaluate([frozen0, waiting(1, 161.0)], now=161.0)
    assert d.rule == "stall" and d.ranks == (0, 1)


def test_stall_reported_once_then_rearmed_by_motion_and_a_new_incident_only_after_progress() -> None:
    rules = Rules(cfg(stall_timeout="5"))
    stuck = [live(hb(0), 110.0)]
    assert len(rules.evaluate(stuck, now=106.0)) == 1
    assert rules.evaluate(stuck, now=108.0) == []  # the same episode
    # a blip of motion (a stack change), then still again: the same incident (no step or batch since)
    blip = [live(hb(0, stack_time=107.0), 120.0)]
    (again,) = rules.evaluate(blip, now=113.0)
    assert again.same_episode
    # progress (a step) ends the episode: the next stall is a new incident
    moved = [live(hb(0, last_progress=114.0, step=11), 130.0)]
    assert rules.evaluate(moved, now=115.0) == []
    (third,) = rules.evaluate(moved, now=120.0)
    assert not third.same_episode


def test_a_rank_crossing_its_own_timeout_later_is_the_same_stall() -> None:
    # GIVEN rank 1 stalls first (its timeout is shorter), rank 0 crosses its own a moment later, nobody progressed
    rules = Rules(cfg(stall_timeout="auto", startup_timeout="100"))
    views = [live(hb(0, slowest_step_dt=30.0), 300.0), live(hb(1, slowest_step_dt=1.0), 300.0)]
    (first,) = rules.evaluate(views, now=170.0)  # rank 1: max(60, 5 x 1) = 60 s
    assert first.ranks == (1,) and not first.same_episode
    (second,) = rules.evaluate(views, now=260.0)  # rank 0: 5 x 30 = 150 s
    # THEN the second is marked as the same episode (no new incident), until a rank progresses
    assert second.ranks == (0,) and second.same_episode
    moved = [live(hb(0, last_progress=261.0, step=11), 300.0), views[1]]
    assert rules.evaluate(moved, now=262.0) == []
    (third,) = rules.evaluate(moved, now=420.0)
    assert not third.same_episode


def test_a_rank_parked_in_its_first_batch_is_not_sheltered_by_the_startup_timeout() -> None:
    # GIVEN rank 0 took its first batch and waits in backward; rank 1 never got its first batch (step 0, data)
    c = cfg(stall_timeout="auto", first_batch_timeout="20")
    rules = Rules(c)
    views = [live(hb(0, step=0, batches=1), 130.0), live(hb(1, step=0, batches=0, phase="data"), 130.0)]
    # THEN rank 1 is judged by the first-batch timeout, rank 0 still by the start-up one
    assert stall_timeout(views[1].hb, c, begun=True) == (20.0, "first_batch")
    assert stall_timeout(views[0].hb, c, begun=True) == (1800.0, "startup")
    assert stall_timeout(views[1].hb, c, begun=False) == (1800.0, "startup")
    (d,) = rules.evaluate(views, now=125.0)
    assert d.ranks == (1,) and d.findings[0].timeout_rule == "first_batch"
    # AND a job where nobody has taken a batch yet (loading the model) is still under the start-up timeout
    loading = [live(hb(r, step=0, batches=0, phase="data"), 130.0) for r in (0, 1)]
    assert Rules(c).evaluate(loading, now=125.0) == []


def test_auto_timeout_waits_for_five_steps_then_scales_with_the_slowest_step() -> None:
    c = cfg()
    assert stall_timeout(hb(0, step=0), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=4), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=5, slowest_step_dt=2.0), c) == (60.0, "auto")
    assert stall_timeout(hb(0, step=50, slowest_step_dt=30.0), c) == (150.0, "auto")
    # the phases do not stretch it: nothing moving in a checkpoint is as much a hang as anywhere
    assert stall_timeout(hb(0, step=50, phase="checkpoint"), c) == (60.0, "auto")
    assert stall_timeout(hb(0, step=50, phase="eval"), c) == (60.0, "auto")
    # a pause worth a note is that long from the first step on (the start-up timeout does not apply to it)
    assert pause_timeout(hb(0, step=0), c) == (60.0, "auto")


def test_explicit_timeout_applies_from_the_first_step_and_phases_extend_the_busy_rule() -> None:
    c = cfg(stall_timeout="10", checkpoint_timeout="600", busy_timeout="300")
    assert stall_timeout(hb(0, step=0), c) == (1800.0, "startup")
    assert stall_timeout(hb(0, step=1), c) == (10.0, "stall")
    assert busy_timeout(hb(0, step=9), c) == (300.0, "busy")
    assert busy_timeout(hb(0, step=9, phase="checkpoint"), c) == (600.0, "checkpoint")
    assert busy_timeout(hb(0, step=9, phase="eval"), c) == (1800.0, "eval")
    assert busy_timeout(hb(0, step=0), c) == (1800.0, "startup")


def test_a_moving_rank_keeps_ranks_that_progressed_earlier_from_stalling() -> None:
    # GIVEN rank 1 idle since t=100 and rank 0 taking steps: a rank that waits for one that progresses waits
    rules = Rules(cfg(stall_timeout="5"))
    views = [live(hb(0, last_progress=119.0), 120.0), live(hb(1), 120.0)]
    assert rules.evaluate(views, now=120.0) == []


def test_ranks_waiting_for_a_rank_of_another_node_that_works_are_not_stalled() -> None:
    # GIVEN both ranks of this node waiting since t=100, while node 1 (coordination) says its ranks moved until 250
    rules = Rules(cfg())
    detections = [(t, d) for t in range(101, 400) for d in rules.evaluate(
        [waiting(0, t), waiting(1, t)], float(t), (min(float(t), 250.0), "1"))]  # fmt: skip
    # THEN a note while node 1 works, and the stall 60 s after node 1's last motion
    assert [(t, d.rule) for t, d in detections] == [(161, "slow_phase"), (311, "stall")]
    assert detections[0][1].reason.startswith("no rank here has taken a step for 61 s; node 1 still works; ranks 0-1 "
                                              "wait for it")  # fmt: skip


# --- frozen: a rank whose liveness thread is silent ------------------------------------------------------------


def test_a_gil_holding_rank_whose_liveness_stops_is_a_hang_and_the_stall_that_follows_the_same_episode() -> None:
    # GIVEN rank 1 holding the GIL from t=100 (no liveness, no stack sample, no I/O) and rank 0 waiting for it,
    # before the 5th step (the start-up timeout, 30 min, governs the stall): the frozen rule comes first
    rules = Rules(cfg(frozen_timeout="30", startup_timeout="300"))
    gil = RankView(hb(1, step=3, liveness_time=100.0), True)
    frames = [(t, [waiting(0, t, step=3), gil]) for t in range(101, 420, 1)]
    detections = run(rules, frames)
    # THEN frozen at 30 s (a new incident), and the stall at 300 s is the same episode, not a second incident
    assert [(t, d.rule, d.ranks, d.same_episode) for t, d in detections] == [
        (131, "frozen", (1,), False), (401, "stall", (0, 1), True)]  # fmt: skip


def test_a_gil_holding_call_that_writes_or_a_peer_that_works_is_not_frozen() -> None:
    rules = Rules(cfg(frozen_timeout="30"))
    # GIVEN rank 1 holding the GIL in a native call that writes a checkpoint (its I/O moves), rank 0 waiting
    writing = [(t, [waiting(0, t), RankView(hb(1, liveness_time=100.0), True, io_at=float(t))])
               for t in range(101, 200)]  # fmt: skip
    # AND later rank 1 holds the GIL writing nothing while rank 0 still works (its stack moves)
    working = [(t, [live(hb(0, stack_time=float(t)), t), RankView(hb(1, liveness_time=100.0), True, io_at=199.0)])
               for t in range(200, 300)]  # fmt: skip
    detections = run(rules, writing + working)
    # THEN nothing but the slow-phase note: neither a stall nor a frozen rank
    assert [d.rule for _, d in detections] == ["slow_phase"]


def test_a_stopped_rank_is_stalled_first_at_the_auto_timeout_then_frozen_joins() -> None:
    rules = Rules(cfg())  # auto 60 s, frozen 120 s
    stopped = RankView(hb(1, liveness_time=100.0), True)
    detections = run(rules, [(t, [waiting(0, t), stopped]) for t in range(101, 230)])
    assert [(t, d.rule, d.same_episode) for t, d in detections] == [(161, "stall", False), (221, "frozen", True)]


# --- busy: moving, never a step ------------------------------------------------------------------------------


def test_an_endless_python_loop_is_caught_by_the_busy_rule_once() -> None:
    # GIVEN rank 1 spinning in Python (its stack changes at every sample) from t=100, never stepping; rank 0 waiting
    rules = Rules(cfg(busy_timeout="120"))
    frames = [(t, [waiting(0, t), live(hb(1, stack_time=float(t)), t)]) for t in range(101, 400)]
    detections = run(rules, frames)
    # THEN no stall (something moves); the slow-phase note at 60 s; the busy rule at 120 s, once
    assert [(t, d.rule, d.ranks) for t, d in detections] == [(161, "slow_phase", (1,)), (221, "busy", (1,))]
    busy = detections[1][1]
    assert busy.message().startswith("busy: rank 1 kept moving but took no step or batch for 121 s (busy timeout")
    assert [(f.rank, f.timeout_rule) for f in busy.findings] == [(1, "busy"), (0, "waiting")]
    assert busy.findings[0].doing == "compute: running Python code"


def test_busy_rule_gives_eval_checkpoint_and_startup_their_own_timeouts() -> None:
    c = cfg(busy_timeout="120", eval_timeout="600")
    for phase, step, fires in (("eval", 10, 701), ("compute", 0, 1901), ("compute", 10, 221)):
        rules = Rules(c)
        frames = [(t, [waiting(0, t, step=step), live(hb(1, phase=phase, step=step, stack_time=float(t)), t)])
                  for t in range(101, 2000, 10)]  # fmt: skip
        busy = [t for t, d in run(rules, frames) if d.rule == "busy"]
        assert busy == [fires], (phase, step, busy)


def test_a_long_validation_loader_is_progress_for_the_busy_rule() -> None:
    rules = Rules(cfg(busy_timeout="120"))
    frames = [(t, [waiting(0, t), live(hb(1, last_progress=float(t), batches=t), t)]) for t in range(101, 500, 5)]
    assert [d.rule for _, d in run(rules, frames)] == ["slow_phase"]


# --- the slow-phase note -----------------------------------------------------------------------------------------


def test_slow_phase_once_per_pause_rearmed_by_a_step_never_at_startup_or_when_still() -> None:
    rules = Rules(cfg())
    frames = []
    for t in range(101, 500):
        step = 10 if t < 300 else 11  # a step at t=300, then a second pause
        frames.append((t, [live(hb(0, step=step, stack_time=float(t)), t), waiting(1, t, step=step)]))
    notes = [(t, d.ranks) for t, d in run(rules, frames) if d.rule == "slow_phase"]
    assert notes == [(161, (0,)), (361, (0,))]
    # a job that has not begun (no batch, no step: loading its model) gets no note
    loading = [(t, [live(hb(0, step=0, batches=0, stack_time=float(t)), t)]) for t in range(101, 300)]
    assert run(Rules(cfg()), loading) == []


def test_a_first_step_that_compiles_for_minutes_is_a_slow_phase_counted_from_the_first_batch() -> None:
    # GIVEN both ranks took their first batch at t=100 (step 0: the start-up timeout governs a stall); rank 0 compiles
    # (Python, for minutes) while rank 1, compiled already, waits for it in backward
    rules = Rules(cfg())
    frames = [(t, [live(hb(0, step=0, batches=1, stack_time=float(t)), t),
                   live(hb(1, step=0, batches=1, phase="backward"), t)]) for t in range(100, 400)]  # fmt: skip
    detections = run(rules, frames)
    # THEN one note, 60 s after training began, never a stall or a busy rank (the start-up timeout, 30 min)
    assert [(t, d.rule, d.ranks) for t, d in detections] == [(161, "slow_phase", (0,))]
    assert detections[0][1].findings[1].doing.startswith("waits (backward")


def test_slow_phase_says_who_works_how_and_who_waits() -> None:
    rules = Rules(cfg())
    views = [live(hb(0, phase="checkpoint"), 161.0, io_at=160.0, io_written_1m=412_000_000),
             waiting(1, 161.0)]  # fmt: skip
    (d,) = rules.evaluate(views, now=161.0)
    assert d.message() == (
        "slow phase: rank 0 has taken no step for 61 s and still works; rank 0: checkpoint: writing 412 MB in the "
        "last minute; rank 1 waits for it (not a stall: blackbox does nothing)")  # fmt: skip
    assert d.findings[1].doing == "waits (collective barrier, still for 61 s)"


# --- deaths --------------------------------------------------------------------------------------------------


def test_rank_death_once_then_the_survivors_stall() -> None:
    rules = Rules(cfg(stall_timeout="5"))
    dead = RankView(hb(1, state="running"), False, "died of signal 9 (SIGKILL)")
    survivor = waiting(0, 120.0)
    detections = rules.evaluate([survivor, dead], now=120.0)
    death = next(d for d in detections if d.rule == "rank_death")
    stall = next(d for d in detections if d.rule == "stall")
    assert death.ranks == (1,) and "SIGKILL" in death.reason
    assert stall.ranks == (0,)
    assert [d.rule for d in rules.evaluate([survivor, dead], now=121.0)] == []


def test_clean_exit_is_not_a_death() -> None:
    rules = Rules(cfg())
    assert rules.evaluate([RankView(hb(0, state="exited"), False)], now=5000.0) == []


def test_exception_then_gone_is_a_death() -> None:
    rules = Rules(cfg())
    (d,) = rules.evaluate([RankView(replace(hb(0), state="exception"), False)], now=100.0)
    assert d.rule == "rank_death" and "raised an exception" in d.reason


# --- leaves: a definite one is judged on its floor whatever the step -----------------------------------------


def test_a_definite_leaf_is_judged_on_its_floor_at_any_step() -> None:
    c = cfg()  # auto: 30 min before the fifth step, 60 s after
    # a rank blocked opening a FIFO, stopped, or in a poll loop: 30 s at step 0 and step 2 as at step 50
    for step in (0, 2, 50):
        for leaf in ("fifo", "stopped"):
            assert stall_timeout(hb(0, step=step), c, leaf=leaf) == (30.0, f"leaf {leaf}")
    assert stall_timeout(hb(0, step=2), c, leaf="poll", whole_world=True) == (30.0, "leaf poll")
    # a poll loop while some rank of the world is not here yet may be a rendezvous: the start-up budget holds
    assert stall_timeout(hb(0, step=0), c, leaf="poll", whole_world=False) == (1800.0, "startup")
    # any other leaf keeps the step's timeouts
    assert stall_timeout(hb(0, step=2), c, leaf="") == (1800.0, "startup")
    assert stall_timeout(hb(0, step=2), c, leaf="other") == (1800.0, "startup")
    # a timeout given is kept (never longer than the step's own): 10 s at step 0 for the FIFO, not 30 min
    assert stall_timeout(hb(0, step=0), cfg(stall_timeout="10"), leaf="fifo") == (10.0, "leaf fifo")
    assert stall_timeout(hb(0, step=50), cfg(stall_timeout="10"), leaf="fifo") == (10.0, "stall")


def test_a_rank_blocked_on_a_fifo_in_its_first_batch_is_a_stall_at_30_s() -> None:
    # GIVEN rank 1 blocked opening its shard (a FIFO: a dead mount) at step 0 while rank 0 waits in all_reduce #1
    rules = Rules(cfg())
    frames = [(t, [waiting(0, t, step=0), live(hb(1, step=0, phase="data"), t, leaf="fifo")])
              for t in range(101, 140)]  # fmt: skip
    # THEN the stall comes 30 s after the job last moved, not after the start-up timeout; rank 1 by its leaf
    ((t, d),) = run(rules, frames)
    assert t == 131 and d.rule == "stall" and d.ranks == (1,)
    assert {f.rank: f.timeout_rule for f in d.findings} == {1: "leaf fifo", 0: "startup"}
