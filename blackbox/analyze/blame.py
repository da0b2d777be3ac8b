"""One blame, from the per-rank states (analyze.states): the suspects are the ranks the waiting ones wait for — a rank
proven to be waiting is never a suspect — and the category is the suspect's own state. In a crash the earliest
failure is the cause, except a collective timeout: there the rank that raised is the victim and the suspect is the
rank that never arrived. Used by the report and, through it, by `blackbox run`'s verdict, incident, alerts and
index. Pure; imports the stdlib, the shared words and the rank states."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from signal import SIGTERM
from typing import Any, Optional

from ..detections import plural_ranks
from .states import PEER_LOSS, RankState, exception_line, is_comm_timeout

# Which kind of elsewhere is the likelier cause when ranks that wait are absent and the others differ.
_PRIORITY = ("dead", "raised", "exited", "stopped", "traced", "kernel", "gil", "data", "checkpoint", "eval",
             "compute")  # fmt: skip
_STUCK = ("dead", "raised", "exited", "stopped", "traced", "kernel", "gil")  # stuck whatever the others do
HANG_CATEGORY = {
    "data": "hang.data_loading", "checkpoint": "hang.checkpoint_io", "compute": "hang.compute", "eval": "hang.compute",
    "gil": "hang.compute", "stopped": "hang.stopped", "traced": "hang.stopped", "kernel": "hang.kernel",
    "collective": "hang.collective", "exited": "crash.exit", "raised": "crash.exception", "unknown": "hang.unknown",
}  # fmt: skip
_CUDA_ERROR = re.compile(r"CUDA error|CUBLAS_STATUS|cuDNN error|NCCL error|illegal memory access|device-side assert",
                         re.IGNORECASE)  # fmt: skip


@dataclass
class Context:
    """What the blame needs beyond the ranks: how the bundle was triggered and the job-wide evidence."""

    rule: str  # stall | frozen | gpu_idle | exception | rank_death | console | exit | manual
    console: Optional[str] = None  # the console trigger's category: crash.oom, crash.cuda_error, ...
    missing: list[int] = field(default_factory=list)  # ranks that never entered a collective others wait in (FR)
    mismatch_odd: list[int] = field(default_factory=list)  # the minority of a collective mismatch (FR)
    oom_ranks: list[int] = field(default_factory=list)
    kernel_oom: bool = False
    progressing: Optional[bool] = None  # on request: whether heartbeats show the job stepping
    absent: list[int] = field(default_factory=list)  # ranks of the world in no bundle given


@dataclass
class Blame:
    suspects: list[int]
    category: str
    phase: Optional[str]
    confidence: str
    summary: str
    inferred: list[str] = field(default_factory=list)  # why, in plain words (inferred findings)
    first_exception: Optional[dict[str, Any]] = None


def blame(states: list[RankState], ctx: Context) -> Blame:
    by_rank = {s.rank: s for s in states}
    exceptions = sorted((s.exception for s in states if s.exception is not None), key=_time)
    first = exceptions[0] if exceptions else None
    crashed = any(s.where in ("dead", "raised") or (s.where == "exited" and s.left_early) for s in states)
    crash_rule = ctx.rule in ("exception", "rank_death", "console", "exit")
    timed_out = first is not None and is_comm_timeout(first)
    if ctx.console or timed_out or crash_rule or (crashed and ctx.rule in ("manual", "unknown")):
        b = _crash(states, ctx, exceptions)
    else:
        b = _hang(states, ctx)
    if b.category == "crash.signal" and ctx.kernel_oom:
        b.category = "crash.host_oom"
        b.summary += " The kernel's OOM killer was active on this node."
    if ctx.oom_ranks and b.category in ("crash.exception", "crash.signal", "crash.exit"):
        b.category, b.suspects = "crash.oom", sorted(ctx.oom_ranks)
    if b.phase is None and b.suspects and b.suspects[0] in by_rank:
        b.phase = by_rank[b.suspects[0]].phase
    return b


def category_of(s: RankState) -> str:
    """The category a suspect's own state makes."""
    if s.where == "dead":
        return "crash.exit" if (s.exit_code or 0) > 0 else "crash.signal"
    if s.kind == "waiting":
        return "hang.collective"
    return HANG_CATEGORY.get(s.where, "hang.unknown")


def _confidence(suspects: list[RankState], others: list[RankState]) -> str:
    """High when two or more independent sources agree on every suspect and at least one other rank is proven to
    wait; medium when one does; low otherwise."""
    if not suspects:
        return "low"
    agree = min(s.agreeing() for s in suspects)
    waiting = any(o.kind == "waiting" for o in others)
    if agree >= 2 and (waiting or not others) and not any(s.conflicts for s in suspects):
        return "high"
    return "medium" if agree >= 1 else "low"


def _odd_ops(waiting: list[RankState]) -> list[int]:
    """Ranks that wait in a different collective from the rest (read from their stacks): the smallest groups; every
    rank when the groups are the same size. Empty when they all wait in the same one, or an op is unknown."""
    by_op: dict[str, list[int]] = {}
    for s in waiting:
        if s.op is None:
            return []
        by_op.setdefault(s.op, []).append(s.rank)
    if len(by_op) < 2:
        return []
    smallest = min(len(r) for r in by_op.values())
    return sorted(r for ranks in by_op.values() if len(ranks) == smallest for r in ranks)


def _pick(elsewhere: list[RankState]) -> list[RankState]:
    """Among ranks that are not waiting, those in the likeliest place to hold the others up."""
    for place in _PRIORITY:
        chosen = [s for s in elsewhere if s.where == place]
        if chosen:
            return chosen
    return elsewhere


def describe(s: RankState, others: list[RankState]) -> str:
    """One rank's state in plain words, for a summary."""
    r = f"rank {s.rank}"
    if s.where == "stopped":
        return f"{r} is stopped (SIGSTOP or a debugger): {s.detail}"
    if s.where == "traced":
        return f"{r} is stopped under a debugger (ptrace): {s.detail}"
    if s.where == "kernel":
        return f"{r} is in an uninterruptible sleep in the kernel (a hung filesystem or device): {s.detail}"
    if s.where == "gil":
        return f"{r} holds the GIL in a native call (its liveness thread cannot run)"
    if s.where == "exited":
        waiting = [o.rank for o in others if o.where not in ("exited",)]
        at = f" at step {s.step}" if s.step is not None else ""
        return f"{r} left the training loop{at} and exited 0" + (
            f" while {plural_ranks(waiting)} waited" if waiting else "")  # fmt: skip
    if s.where == "dead":
        if s.exit_code is not None and s.exit_code > 0:
            return f"{r} exited with exit code {s.exit_code} without raising"
        return f"{r} died: {s.detail}"
    if s.where == "raised" and s.exception is not None:
        return f"{r} raised {s.exception.get('type')}"
    doing = {"data": "is loading data", "checkpoint": "is in checkpoint I/O", "compute": "is computing",
             "eval": "is in eval"}  # fmt: skip
    if s.where in doing:
        return f"{r} {doing[s.where]} ({s.detail.removeprefix('main thread in ')})"
    if s.kind == "waiting":
        return f"{r} waits in a collective: {s.detail}"
    return f"{r}: {s.detail}"


def _hang(states: list[RankState], ctx: Context) -> Blame:
    waiting = [s for s in states if s.kind == "waiting"]
    elsewhere = [s for s in states if s.kind == "elsewhere"]
    unknown = [s for s in states if s.kind == "unknown"]
    missing = [s for s in states if s.rank in ctx.missing]
    inferred: list[str] = []
    if ctx.rule in ("manual", "unknown") and ctx.progressing:
        slow = elsewhere or missing or unknown if waiting else []
        ids = sorted(s.rank for s in slow)
        summary = "the job is progressing" + (
            f"; {plural_ranks(ids)} {'is' if len(ids) == 1 else 'are'} the slowest: the others wait for "
            f"{'it' if len(ids) == 1 else 'them'} in a collective" if ids else "")  # fmt: skip
        if ids:
            inferred.append(f"{plural_ranks(ids)} {'is' if len(ids) == 1 else 'are'} the slowest: the ones the others "
                            "wait for in a collective while the job progresses")  # fmt: skip
        return Blame(ids, "ok", slow[0].phase if slow else None, "low", summary, inferred)
    odd_ops = _odd_ops(waiting) if waiting and not (elsewhere or unknown or missing) else []
    if ctx.rule in ("manual", "unknown") and not (waiting and (elsewhere or unknown or missing)) and not any(
            s.where in _STUCK for s in elsewhere) and not odd_ops:  # fmt: skip
        # on request, nobody waits for anybody and nothing is stuck: no sign of a hang
        return Blame([], "ok", None, "low", "no rank stands out: none waits for another, none is stopped or gone")
    if ctx.mismatch_odd and not elsewhere:
        odd = sorted(ctx.mismatch_odd)
        why = ["the flight recorder's entries differ at the same sequence number"]
        return Blame(odd, "hang.collective", "collective", "medium", f"the ranks are in different collectives (a "
                     f"collective mismatch); {plural_ranks(odd)} called the odd one", why)  # fmt: skip
    if waiting and (elsewhere or unknown or missing):
        if elsewhere:
            chosen = _pick(elsewhere)
            if missing and {s.rank for s in missing} <= {s.rank for s in elsewhere}:
                chosen = missing
        elif missing:
            chosen = missing
        else:
            chosen = unknown
        ids = sorted(s.rank for s in chosen)
        w_ids = sorted(s.rank for s in waiting)
        head = describe(chosen[0], [s for s in states if s not in chosen]) if len(chosen) == 1 else (
            f"{plural_ranks(ids)} are in {'/'.join(sorted({s.where for s in chosen}))}")  # fmt: skip
        summary = (f"{head}, while {plural_ranks(w_ids)} {'waits' if len(w_ids) == 1 else 'wait'} for "
                   f"{'it' if len(ids) == 1 else 'them'} in a collective ({waiting[0].detail})")  # fmt: skip
        inferred.append(f"{plural_ranks(ids)} {'holds' if len(ids) == 1 else 'hold'} the others up: "
                        f"{plural_ranks(w_ids)} {'waits' if len(w_ids) == 1 else 'wait'} in a collective (victims, "
                        "not causes)")  # fmt: skip
        confidence = _confidence(chosen, [s for s in states if s not in chosen])
        if chosen[0].kind == "unknown":
            confidence = "low"
        return Blame(ids, category_of(chosen[0]), chosen[0].phase, confidence, summary, inferred)
    if odd_ops and not ctx.absent:
        by_op: dict[str, list[int]] = {}
        for s in waiting:
            by_op.setdefault(str(s.op), []).append(s.rank)
        calls = "; ".join(f"{plural_ranks(r)} in {op}" for op, r in sorted(by_op.items(), key=lambda kv: kv[1]))
        return Blame(odd_ops, "hang.collective", "collective", "medium", f"the ranks wait in different collectives "
                     f"({calls}): a collective mismatch", [f"{plural_ranks(odd_ops)} called a collective the others "
                     "did not (their stacks)"])  # fmt: skip
    if waiting and not elsewhere and not unknown:
        if ctx.absent:
            ids = sorted(ctx.absent)
            return Blame(ids, "hang.collective", "collective", "low",
                         f"every rank in these bundles waits in a collective; {plural_ranks(ids)} "
                         "(in no bundle given) never arrived", inferred)  # fmt: skip
        seqs = {s.seq for s in waiting if s.seq is not None}
        ids = sorted(s.rank for s in waiting)
        summary = "every rank waits in a collective" + (
            f" (at different sequence numbers: {sorted(seqs)})" if len(seqs) > 1 else
            ": a deadlock, or a peer outside this job (another node, a subgroup)")  # fmt: skip
        return Blame(ids, "hang.collective", "collective", "low", summary, inferred)
    if elsewhere:
        chosen = _pick(elsewhere)
        ids = sorted(s.rank for s in chosen)
        everyone = len(chosen) == len(states)
        if len(chosen) == 1:
            summary = describe(chosen[0], [s for s in states if s not in chosen])
        else:
            summary = f"{plural_ranks(ids)} are all in {chosen[0].where}" + (
                "" if everyone else " while the others are elsewhere or unknown")  # fmt: skip
        if unknown:
            inferred.append(
                f"{plural_ranks(sorted(s.rank for s in unknown))}: no source settles where "
                f"{'it is' if len(unknown) == 1 else 'they are'} (a C call, perhaps a collective wait)"
            )
        confidence = (
            "low" if everyone and len(states) > 1 else _confidence(chosen, [s for s in states if s not in chosen])
        )
        return Blame(ids, category_of(chosen[0]), chosen[0].phase, confidence, summary, inferred)
    ids = sorted(s.rank for s in unknown)
    return Blame(ids, "hang.unknown", None, "low", "no rank's state could be settled from the evidence", inferred)


def _crash(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]]) -> Blame:
    by_rank = {s.rank: s for s in states}
    first = exceptions[0] if exceptions else None
    if ctx.console == "crash.oom" and ctx.oom_ranks:
        ids = sorted(ctx.oom_ranks)
        return Blame(ids, "crash.oom", None, "high", f"{plural_ranks(ids)} ran out of memory", [], first)
    if ctx.console == "crash.comm_timeout" or (first is not None and is_comm_timeout(first)):
        # the rank that raised first is the victim: the suspect is the one that never arrived
        rest = [s for s in states if s.kind != "waiting"]
        chosen = _pick([s for s in rest if s.kind == "elsewhere"]) if rest else []
        if not chosen:
            chosen = [by_rank[r] for r in ctx.missing if r in by_rank] or [s for s in rest if s.kind == "unknown"]
        ids = sorted(s.rank for s in chosen)
        raisers = sorted({int(str(e.get("rank"))) for e in exceptions if is_comm_timeout(e)})
        summary = "A collective timed out" + (
            f" on {plural_ranks(raisers)}" if raisers else "") + (
            f"; {describe(chosen[0], [])} — the rank the others waited for" if len(ids) == 1 else
            f"; suspect {plural_ranks(ids)}: not in the collective the others waited in" if ids else
            "; no rank stands out as the one that never arrived")  # fmt: skip
        inferred = [f"{plural_ranks(raisers)} raised the timeout: victims of the rank that never arrived"] if \
            raisers else []  # fmt: skip
        return Blame(ids, "crash.comm_timeout", chosen[0].phase if chosen else None,
                     _confidence(chosen, [s for s in states if s not in chosen]) if ids else "low", summary,
                     inferred, first)  # fmt: skip
    if ctx.console in ("crash.cuda_error",) and first is not None:
        r = int(str(first.get("rank")))
        return Blame([r], "crash.cuda_error", _exc_phase(by_rank.get(r)), "medium",
                     f"A CUDA or NCCL error; suspect rank {r}.", [], first)  # fmt: skip
    causes = [e for e in exceptions if not PEER_LOSS.search(str(e.get("message", "")))
              and by_rank.get(int(str(e.get("rank")))) is not None
              and by_rank[int(str(e.get("rank")))].kind != "waiting"]  # fmt: skip
    signal_dead = [s for s in states if s.where == "dead" and s.exception is None and not (s.exit_code or 0) > 0]
    exit_dead = [s for s in states if s.where == "dead" and s.exception is None and (s.exit_code or 0) > 0]
    early = [s for s in states if s.where == "exited" and any(o.where != "exited" for o in states)]
    # SIGTERM is how the launcher tears the other ranks down after the first failure: a rank ended by it is that
    # failure's victim (when every rank was, it is the job's own end: the scheduler's, or a user's)
    torn = [s for s in signal_dead if s.exit_code == -SIGTERM]
    if torn and (len(torn) < len(signal_dead) or exit_dead or early or causes):
        signal_dead = [s for s in signal_dead if s not in torn]
        notes = [f"{plural_ranks(sorted(s.rank for s in torn))} ended by SIGTERM: the launcher tearing the job down "
                 "after the first failure (victims, not causes)"]  # fmt: skip
    else:
        notes = []
    if causes and not (signal_dead and _later(causes[0], signal_dead)):
        e = causes[0]
        r = int(str(e.get("rank")))
        message = str(e.get("message"))
        oom = "OutOfMemoryError" in str(e.get("type")) or "out of memory" in message.lower()
        category = "crash.oom" if oom else "crash.cuda_error" if _CUDA_ERROR.search(message) else "crash.exception"
        confidence = "high" if ctx.rule == "exception" or len(exceptions) == 1 else "medium"
        return Blame([r], category, _exc_phase(by_rank.get(r)), confidence, f"Rank {r} raised "
                     f"{exception_line(e)} first.", [], e)  # fmt: skip
    for group, category in ((signal_dead, "crash.signal"), (exit_dead, "crash.exit"), (early, "crash.exit")):
        if group:
            ids = sorted(s.rank for s in group)
            others = [s for s in states if s not in group]
            summary = "; ".join(describe(s, others) for s in group[:3]) + (
                "; the others lost their peer." if any(o.exception for o in others) else ".")  # fmt: skip
            return Blame(ids, category, group[0].phase, _confidence(group, others), summary[0].upper() + summary[1:],
                         notes, first)  # fmt: skip
    if first is not None:  # only consequences (a peer went away): the first of them, with little confidence
        r = int(str(first.get("rank")))
        return Blame([r], "crash.exception", _exc_phase(by_rank.get(r)), "low",
                     f"Rank {r} raised {exception_line(first)} first (it says a peer went away; "
                     "no rank's own failure was recorded).", [], first)  # fmt: skip
    if ctx.console == "crash.signal":
        return Blame([], "crash.signal", None, "low", "A rank crashed with a fatal signal.", [], None)
    hung = _hang(states, ctx)
    return hung


def _time(exc: dict[str, Any]) -> float:
    t = exc.get("time")
    return float(t) if isinstance(t, (int, float)) else 0.0


def _later(exc: dict[str, Any], dead: list[RankState]) -> bool:
    """Whether an exception is a consequence of a death: ranks died without a record, and it says a peer left."""
    return bool(PEER_LOSS.search(str(exc.get("message", ""))))


def _exc_phase(s: Optional[RankState]) -> Optional[str]:
    """The phase an exception came from: read from its traceback (data, checkpoint), else compute."""
    if s is None or s.exception is None:
        return None
    from .states import exception_where

    w = exception_where(s.exception)
    return w.kind if w.kind in ("data", "checkpoint", "collective") else "compute"
