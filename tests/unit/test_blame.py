"""The diagnosis in its parts, on small hand-made evidence: where a thread waits (frames.where), one rank's state
from its sources (analyze.states.classify), and the one blame over all ranks (analyze.blame). Pure."""

from __future__ import annotations

from blackbox.adapters.stacks import Frame, ThreadStack
from blackbox.analyze.blame import Context, blame, category_of, describe
from blackbox.analyze.states import Fact, RankState, classify
from blackbox.frames import where

TORCH = "/venv/lib/python3.11/site-packages/torch"
LIBTORCH = f"{TORCH}/lib/libtorch_cpu.so"


def thread(*frames: tuple[str, str]) -> ThreadStack:
    """Frames outermost first, as (function, file)."""
    return ThreadStack("1", "MainThread", False, tuple(Frame(file, 1, fn) for fn, file in frames))


BACKWARD = (("<module>", "/job/train.py"), ("backward", f"{TORCH}/_tensor.py"),
            ("_engine_run_backward", f"{TORCH}/autograd/graph.py"))  # fmt: skip


# --- frames.where: the places real frameworks wait ------------------------------------------------------------
def test_ddp_backward_is_ambiguous_without_native_frames_and_settled_with_them() -> None:
    assert where(thread(*BACKWARD)).kind == "ambiguous"
    waiting = thread(*BACKWARD, ("torch::autograd::Engine::execute", LIBTORCH),
                     ("c10d::Reducer::finalize_backward", LIBTORCH), ("std::condition_variable::wait",
                                                                      "/usr/lib/libstdc++.so.6.0.30"))  # fmt: skip
    w = where(waiting)
    assert (w.kind, w.native) == ("collective", True) and "Reducer" in w.what
    computing = thread(*BACKWARD, ("torch::autograd::Engine::execute", LIBTORCH), ("at::native::addmm", LIBTORCH))
    assert where(computing).kind == "compute"


def test_fsdp_functional_and_user_collectives_are_waits() -> None:
    fsdp = thread(("<module>", "/job/train.py"), ("forward", f"{TORCH}/nn/modules/module.py"),
                  ("foreach_all_gather", f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_collectives.py"),
                  ("all_gather_single", f"{TORCH}/distributed/distributed_c10d.py"))  # fmt: skip
    assert where(fsdp).kind == "collective"
    functional = thread(("step", "/job/train.py"), ("wait_tensor", f"{TORCH}/distributed/_functional_collectives.py"))
    assert where(functional).kind == "collective"
    buffers = thread(("<module>", "/job/train.py"), ("forward", f"{TORCH}/nn/parallel/distributed.py"),
                     ("_sync_buffers", f"{TORCH}/nn/parallel/distributed.py"))  # fmt: skip
    assert where(buffers).kind == "collective"


def test_data_checkpoint_and_user_compute() -> None:
    data = thread(("<module>", "/job/train.py"), ("__next__", f"{TORCH}/utils/data/dataloader.py"),
                  ("__getitem__", "/job/data.py"))  # fmt: skip
    w = where(data)
    assert (w.kind, w.what) == ("data", "__getitem__ (data.py:1)")
    assert where(thread(("save", f"{TORCH}/serialization.py"))).kind == "checkpoint"
    assert where(thread(("<module>", "/job/train.py"), ("spin", "/job/train.py"))).kind == "compute"
    assert where(ThreadStack("1", "MainThread", False, ())).kind == "ambiguous"


# --- analyze.states.classify: one rank from its facts -----------------------------------------------------------
STACK = "ranks/1/py-spy.json"
FR = "flight_recorder/ (rank 1's pg_status)"


def fact(says: str, text: str = "", source: str = "ranks/1/heartbeat.json", *, weak: bool = False,
         group: str = "0") -> Fact:  # fmt: skip
    """A hand-made fact: a stack's (source STACK) is marked as one; a flight recorder's (source FR) carries the
    group and sequence number its text names."""
    import re

    seq = re.search(r"#(\d+)", text)
    if source == FR:
        return Fact(source, says, text or says, group, int(seq.group(1)) if seq else None)
    op = text.removeprefix("main thread in ").split(" ")[0] if says == "waiting" and source == STACK else None
    return Fact(source, says, text or says, op=op, weak=weak, stack=source == STACK)


def test_stopped_process_wins_over_everything_it_cannot_say() -> None:
    facts = [fact("stopped", "/proc state T (stopped)", "ranks/1/proc.json"), fact("gil", "liveness silent"),
             fact("unanswered", "no stack")]  # fmt: skip
    st = classify(1, "n", 7, facts, "compute", 3)
    assert (st.kind, st.where) == ("elsewhere", "stopped")


def test_an_ambiguous_stack_is_settled_by_the_flight_recorder() -> None:
    facts = [fact("ambiguous", "main thread in _engine_run_backward", STACK),
             fact("waiting", "enqueued all_reduce #9 of group 0 and it has not completed", FR)]  # fmt: skip
    st = classify(0, "n", 7, facts, "compute", 3)
    assert (st.kind, st.where, st.seq) == ("waiting", "collective", 9)
    behind = [fact("ambiguous", "main thread in _engine_run_backward", STACK),
              fact("behind", "never enqueued collective #9", FR)]  # fmt: skip
    assert classify(0, "n", 7, behind, "compute", 3).where == "compute"  # backward, nothing pending: computing


def test_an_ambiguous_stack_alone_is_unknown_and_the_heartbeat_helps() -> None:
    assert classify(0, "n", 7, [fact("ambiguous", "main thread in backward", STACK)], "compute", 3).kind == "unknown"
    st = classify(0, "n", 7, [fact("ambiguous", "x", STACK), fact("data", "heartbeat phase data")], "data", 3)
    assert (st.kind, st.where) == ("elsewhere", "data")


def test_the_stack_outranks_the_heartbeat_and_the_disagreement_is_kept() -> None:
    facts = [fact("data", "main thread in __getitem__ (data.py:31)", STACK), fact("waiting", "heartbeat phase "
             "collective all_reduce")]  # fmt: skip
    st = classify(1, "n", 7, facts, "collective", 3)
    assert (st.kind, st.where) == ("elsewhere", "data")
    assert st.conflicts and "heartbeat phase collective" in st.conflicts[0]


def test_a_silent_liveness_thread_in_user_code_holds_the_gil() -> None:
    st = classify(1, "n", 7, [fact("compute", "main thread in <module> (train.py:9)", STACK), fact("gil")], "compute",
                  3)  # fmt: skip
    assert (st.where, st.phase) == ("gil", "compute")


def test_a_rank_whose_recorder_saw_it_sleep_and_check_polls_and_its_stack_says_where() -> None:
    # GIVEN a stack in user code (the loop) and a heartbeat whose recorder saw the main thread sleep on a timer
    polls = fact("poll", "its main thread sleeps on a timer, or sleeps and checks in a loop")
    st = classify(0, "n", 7, [fact("compute", "main thread in wait_for_lock (train.py:40)", STACK), polls], "compute",
                  3)  # fmt: skip
    # THEN it polls (its heartbeat says so; with the flight recorder's "never entered", two sources), where its stack
    # says, and the category says so
    assert (st.kind, st.where, st.detail, st.agreeing()) == ("elsewhere", "poll", "main thread in wait_for_lock "
                                                             "(train.py:40)", 1)  # fmt: skip
    assert category_of(st) == "hang.poll"
    assert describe(st, []) == ("rank 0 sleeps and checks in a loop for something that never comes (wait_for_lock "
                                "(train.py:40))")  # fmt: skip
    # AND a stack caught in the loop's check (a read, a store's round trip) is one snapshot against the recorder's
    # samples: it still polls, and the stack says where (the quiet gallery's store-poll was hang.io or
    # hang.collective by where the snapshot landed)
    for says, text in (("io", "main thread in recv (client.py:9)"), ("waiting", "main thread in check (store.py:9)")):
        st = classify(0, "n", 7, [fact(says, text, STACK), polls], "compute", 3)
        assert (st.where, st.detail, category_of(st)) == ("poll", text, "hang.poll"), says
    # AND so does a read the process table caught, with no stack at all
    st = classify(0, "n", 7, [fact("io", "blocked in read() of fd 5", "ranks/0/proc.json"), polls], "compute", 3)
    assert (st.where, st.detail) == ("poll", polls.text)
    # BUT a stack in data or checkpoint code says what the loop is for, a collective the flight recorder saw it
    # enter and never leave is where it waits, and a silent liveness thread holds the GIL
    data = classify(0, "n", 7, [fact("data", "main thread in __getitem__ (data.py:31)", STACK), polls], "compute", 3)
    assert data.where == "data"
    entered = fact("waiting", "all_reduce #12 entered, never completed", FR)
    assert classify(0, "n", 7, [entered, polls], "compute", 3).where == "collective"
    gil = classify(0, "n", 7, [fact("compute", "main thread in f (x.py:1)", STACK), polls, fact("gil")], "compute", 3)
    assert gil.where == "gil"


def test_an_exception_out_of_a_collective_is_a_victim() -> None:
    st = classify(0, "n", 7, [fact("waiting", "raised DistBackendError out of a collective",
                                   "ranks/0/exceptions.jsonl")], "collective", 3)  # fmt: skip
    assert (st.kind, st.where) == ("waiting", "collective")


# --- analyze.blame: the suspects are the ranks the waiting ones wait for -------------------------------------------
def state(rank: int, *facts: Fact, phase: str = "compute", exit_code: int | None = None):  # type: ignore[no-untyped-def]
    st = classify(rank, "n", 100 + rank, list(facts), phase, 3)
    if exit_code is not None:
        st.exit_code = exit_code
    return st


WAITING = fact("waiting", "main thread in c10d::Reducer::finalize_backward", STACK)


def test_two_ranks_the_waiter_is_never_the_suspect() -> None:
    b = blame(
        [
            state(0, WAITING),
            state(
                1,
                fact("data", "main thread in __getitem__ (data.py:31)", STACK),
                fact("data", "heartbeat phase data"),
                phase="data",
            ),
        ],
        Context("stall"),
    )
    assert (b.suspects, b.category, b.phase) == ([1], "hang.data_loading", "data")
    assert b.confidence == "high"  # stack and heartbeat agree, and rank 0 is proven to wait


def test_two_bad_ranks_of_four() -> None:
    data = fact("data", "main thread in __getitem__ (data.py:31)", STACK)
    b = blame([state(0, WAITING), state(1, WAITING), state(2, data, phase="data"), state(3, data, phase="data")],
              Context("stall"))  # fmt: skip
    assert (b.suspects, b.category) == ([2, 3], "hang.data_loading")


def test_a_stopped_rank_gets_its_own_words() -> None:
    stopped = fact("stopped", "/proc state T (stopped), wchan do_signal_stop", "ranks/1/proc.json")
    b = blame([state(0, fact("ambiguous", "main thread in backward", STACK)), state(1, stopped)], Context("stall"))
    assert (b.suspects, b.category) == ([1], "hang.stopped")
    assert "rank 1 is stopped (SIGSTOP or a debugger)" in b.summary


def test_exit_without_an_exception_and_an_early_clean_exit_are_crash_exit() -> None:
    dead = state(1, fact("dead", "torchrun saw it end with exitcode 3", "console-tail.log"), exit_code=3)
    b = blame([state(0, WAITING), dead], Context("rank_death"))
    assert (b.suspects, b.category) == ([1], "crash.exit")
    assert "Rank 1 exited with exit code 3 without raising" in b.summary
    early = classify(1, "n", 101, [fact("exited", "exited normally at step 20")], "compute", 20)
    victim = state(0, fact("waiting", "raised RuntimeError out of a collective", "ranks/0/exceptions.jsonl"))
    victim.exception = {"rank": 0, "time": 5.0, "type": "RuntimeError", "message": "Connection closed by peer"}
    b = blame([victim, early], Context("exception"))
    assert (b.suspects, b.category) == ([1], "crash.exit")
    assert "Rank 1 left the training loop at step 20 and exited 0 while rank 0 waited" in b.summary


def test_a_rank_that_cannot_exit_is_the_hang_not_the_rank_that_exited_0_before_it() -> None:
    # GIVEN training over: rank 1 exited 0, rank 0 is held at the interpreter's exit by a thread of its own
    done = classify(1, "n", 101, [fact("exited", "exited normally at step 40")], "compute", 40)
    held = fact("io", "finished but cannot exit: the interpreter waits for a thread of its own, which is blocked in "
                "read() of fd 7, /tmp/fifo (a fifo)", "ranks/0/proc.json")  # fmt: skip
    exiting = state(0, held, fact("compute", "main thread in _shutdown (threading.py:1590)", STACK, weak=True))
    exiting.exiting = True
    # THEN the stall, and the exception or exit rules alike, name the rank that cannot exit and what holds it
    for rule in ("stall", "exit"):
        b = blame([exiting, done], Context(rule))
        assert (b.suspects, b.category) == ([0], "hang.io"), rule
        assert "rank 0 is waiting for I/O (finished but cannot exit: the interpreter waits for a thread" in b.summary
    # BUT a rank still in its run when the other exited 0 was left behind: the early exit is the cause
    running = state(0, held, fact("compute", "main thread in train (train.py:9)", STACK))
    assert blame([running, done], Context("stall")).suspects == [1]


def test_all_ranks_named_only_when_they_all_stand_in_the_same_place() -> None:
    spin = fact("compute", "main thread in spin (train.py:9)", STACK)
    b = blame([state(0, spin), state(1, spin)], Context("stall"))
    assert b.suspects == [0, 1] and b.category == "hang.compute" and b.confidence == "low"
    # one rank in data, the other in an unsettled C call: the one in data, not both
    b = blame([state(0, fact("ambiguous", "main thread in backward", STACK)),
               state(1, fact("data", "main thread in __getitem__", STACK))],
              Context("stall"))  # fmt: skip
    assert b.suspects == [1]


def test_on_request_a_hung_job_gets_a_hang_and_a_quiet_one_ok() -> None:
    data = fact("data", "main thread in __getitem__ (data.py:31)", STACK)
    hung = blame([state(0, WAITING), state(1, data)], Context("manual", progressing=None))
    assert hung.category == "hang.data_loading" and hung.suspects == [1]
    moving = blame([state(0, WAITING), state(1, data)], Context("manual", progressing=True))
    assert moving.category == "ok" and moving.suspects == [1]  # the straggler, named
    spin = fact("compute", "main thread in forward (model.py:3)", STACK)
    assert blame([state(0, spin), state(1, spin)], Context("manual")).category == "ok"


def test_on_request_ranks_with_no_stack_are_unknown_not_ok() -> None:
    # GIVEN a collection from outside whose py-spy failed (not installed, or past its time): no source places a rank
    blind = blame([state(0), state(1)], Context("manual", progressing=None))
    # THEN the report cannot call the job healthy: it says it cannot tell, and which ranks it could not place
    assert (blind.category, blind.suspects, blind.confidence) == ("hang.unknown", [0, 1], "low"), blind
    assert blind.summary.startswith("no source says where ranks 0-1 are"), blind.summary
    spin = fact("compute", "main thread in forward (model.py:3)", STACK)
    half = blame([state(0, spin), state(1)], Context("manual", progressing=None))
    assert (half.category, half.suspects) == ("hang.unknown", [1]), half
    # AND a job the heartbeats show progressing is still `ok`, whatever the stacks
    assert blame([state(0), state(1)], Context("manual", progressing=True)).category == "ok"


def test_on_request_with_nobody_waiting_at_the_dump_the_ledgers_name_the_slowest() -> None:
    # a job that steps: the dump came while rank 0 was outside its wait (it waits 95 % of each step)
    spin = fact("compute", "main thread in forward (model.py:3)", STACK)
    ranks = [state(0, spin), state(1, spin)]
    slow = blame(ranks, Context("manual", progressing=True, waited={0: 0.95, 1: 0.04}))
    assert (slow.category, slow.suspects, slow.confidence) == ("ok", [1], "low"), slow
    assert "rank 1 is the slowest" in slow.summary and "95%" in slow.summary, slow.summary
    four = [state(r, spin) for r in range(4)]
    assert blame(four, Context("manual", progressing=True, waited={0: 0.9, 1: 0.88, 2: 0.1, 3: 0.91})).suspects == [2]
    # even shares (a healthy job), or most ranks "slow" (nothing stands out): nobody is named
    assert blame(ranks, Context("manual", progressing=True, waited={0: 0.35, 1: 0.3})).suspects == []
    assert blame(four, Context("manual", progressing=True, waited={0: 0.9, 1: 0.1, 2: 0.1, 3: 0.1})).suspects == []
    assert blame(ranks, Context("manual", progressing=True)).suspects == []  # no ledgers


def test_comm_timeout_blames_the_rank_that_never_arrived() -> None:
    victim = state(0, fact("waiting", "raised DistBackendError out of a collective", "ranks/0/exceptions.jsonl"))
    victim.exception = {"rank": 0, "time": 5.0, "type": "DistBackendError", "message": "[unbound_buffer.cc:78] Timed "
                        "out waiting 5000ms for recv operation to complete"}  # fmt: skip
    b = blame([victim, state(1, fact("compute", "main thread in <module> (train.py:9)", STACK))],
              Context("exception"))  # fmt: skip
    assert (b.suspects, b.category, b.phase) == ([1], "crash.comm_timeout", "compute")


def test_without_the_flight_recorder_a_mismatch_shows_in_the_stacks() -> None:
    # GIVEN a job collected without blackbox: three ranks in all_reduce, rank 2 in a barrier
    def in_op(op: str) -> Fact:
        return fact("waiting", f"main thread in {op} (distributed_c10d.py:3000)", STACK)

    states = [state(r, in_op("barrier" if r == 2 else "all_reduce")) for r in range(4)]
    b = blame(states, Context("manual"))
    assert (b.suspects, b.category) == ([2], "hang.collective")
    assert "ranks 0-1, 3 in all_reduce" in b.summary and "rank 2 in barrier" in b.summary
    # AND every rank in the same collective, sampled on request, is no sign of a hang by itself
    assert blame([state(r, in_op("all_reduce")) for r in range(4)], Context("manual")).category == "ok"


# --- analyze.states.read_state: a zombie says how it ended -------------------------------------------------------
def _zombie(exit_code: int | None) -> RankState:
    import json

    from blackbox.analyze.states import JobEvidence, read_state
    from blackbox.bundle.reader import Bundle

    hb = {"rank": 1, "pid": 51, "step": 20, "phase": "compute", "state": "exited", "alive": True}
    proc = {"pid": 51, "state": "Z (zombie)", "exit_code": exit_code}
    files = {"ranks/1/heartbeat.json": json.dumps(hb).encode(), "ranks/1/proc.json": json.dumps(proc).encode()}
    bundle = Bundle("b", {"schema_version": 1}, files, [])
    return read_state(bundle, 1, "n", None, JobEvidence(), None, {})


def test_a_zombie_that_exited_0_left_early_and_one_that_exited_3_died() -> None:
    # GIVEN a rank collected between its exit and its parent's wait (torchrun reaps every 0.1 s)
    # THEN the kernel's record of its end decides: exit code 0 is a rank that left, anything else a death with its code
    assert _zombie(0).where == "exited"
    dead = _zombie(3)
    assert (dead.where, dead.exit_code) == ("dead", 3)
    assert _zombie(-9).exit_code == -9 and _zombie(None).where == "dead"


def test_the_launchers_sigterm_is_a_victims_end() -> None:
    # GIVEN rank 1 killed by SIGKILL and rank 0 then ended by torchrun's SIGTERM, both seen dead at once
    killed = classify(1, "n", 11, [fact("dead", "ended: died of signal 9 (SIGKILL)")], "compute", 2)
    killed.exit_code = -9
    torn = classify(0, "n", 10, [fact("dead", "ended: died of signal 15 (SIGTERM)", "ranks/0/heartbeat.json")],
                    "compute", 3)  # fmt: skip
    torn.exit_code = -15
    b = blame([torn, killed], Context(rule="rank_death"))
    # THEN the suspect is the rank that died first of its own, and the SIGTERM is named as the teardown
    assert (b.category, b.suspects) == ("crash.signal", [1])
    assert any("SIGTERM" in text and "victims" in text for text in b.inferred)
    # AND when every rank was ended by SIGTERM (the scheduler's, a user's), they all are named, as before
    also = classify(1, "n", 11, [fact("dead", "ended: died of signal 15 (SIGTERM)")], "compute", 2)
    also.exit_code = -15
    both = blame([torn, also], Context(rule="rank_death"))
    assert (both.category, both.suspects) == ("crash.signal", [0, 1])


NO_CUDA = "Torch not compiled with CUDA enabled"


def _raised(rank: int, message: str, line: int, phase: str, t: float) -> RankState:
    st = state(rank, fact("raised", f"raised AssertionError: {message}", "ranks/N/exceptions.jsonl"), phase=phase)
    st.exception = {"rank": rank, "time": t, "type": "builtins.AssertionError", "message": message,
                    "traceback": [{"file": "/job/train.py", "line": 5, "function": "main"},
                                  {"file": f"{TORCH}/cuda/__init__.py", "line": line, "function": "init"}]}  # fmt: skip
    return st


def test_every_rank_raising_the_same_error_at_the_same_line_is_no_one_ranks_failure() -> None:
    # GIVEN both ranks of a job on a machine without CUDA: the same error, at the same line, a millisecond apart,
    # before their first step (as pytorch/examples' multigpu_torchrun.py does on a CPU)
    b = blame([_raised(0, NO_CUDA, 522, "startup", 5.002), _raised(1, NO_CUDA, 522, "startup", 5.001)],
              Context("exception"))  # fmt: skip
    # THEN both are named, not the one a millisecond ahead, and the phase is the one they raised in
    assert (b.suspects, b.category, b.phase) == ([0, 1], "crash.exception", "startup")
    assert b.summary == ("Ranks 0-1 raised AssertionError: Torch not compiled with CUDA enabled, each at the same line "
                         "(cuda/__init__.py:522): every rank failed the same way — the code or the set-up they share, "
                         "not one rank.")  # fmt: skip
    # BUT the same type raised at another line is two failures: the first is named, in the phase its traceback gives
    b = blame([_raised(0, NO_CUDA, 522, "compute", 5.002), _raised(1, NO_CUDA, 530, "compute", 5.001)],
              Context("exception"))  # fmt: skip
    assert (b.suspects, b.phase) == ([1], "compute")
    assert b.summary == f"Rank 1 raised AssertionError: {NO_CUDA} first."
    # AND two of three ranks raising the same are named as those two, not as every rank
    b = blame([_raised(0, "boom", 7, "eval", 5.002), _raised(2, "boom", 7, "eval", 5.001), state(1, WAITING)],
              Context("exception"))  # fmt: skip
    assert (b.suspects, b.phase) == ([0, 2], "eval")
    assert b.summary.endswith("(cuda/__init__.py:7): ranks 0, 2 failed the same way — the code or the set-up they "
                              "share, not one rank."), b.summary  # fmt: skip
