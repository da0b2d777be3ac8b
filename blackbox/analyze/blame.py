"""One blame, from the per-rank states (analyze.states): the suspects are the ranks the waiting ones wait for — a rank
proven to be waiting is never a suspect — and the category is the suspect's own state. Where the flight recorder
(or the NCCL watchdog's lines) says which collective each process group is stuck at, the blame follows the group
each waiter waits in: from every waiter to the members that never entered its collective, on to the ranks that
wait for nobody. In a crash the earliest failure is the cause, except a collective timeout or a lost peer: there
the rank that raised is the victim and the suspect is the rank that never arrived; a job that could not set up
its network is its own category, and so are ranks that never arrived on a host this node lost at the moment the
job stopped (a host down or the network cut). Used by the report and, through it, by `blackbox run`'s verdict, incident,
alerts and index. Pure; imports the stdlib, the shared words, the flight-recorder adapter, the rank states and
analyze.nodes (the ranks on lost hosts)."""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from signal import SIGTERM
from typing import Any, Optional

from ..adapters import flight_recorder as fr
from ..detections import plural_ranks
from .nodes import Cut
from .states import RankState, error_kind, exception_frames, exception_key, exception_line, exception_where, is_victim

# Which kind of elsewhere is the likelier cause when ranks that wait are absent and the others differ.
_PRIORITY = ("dead", "raised", "exited", "stopped", "traced", "kernel", "gil", "data", "checkpoint", "io", "eval",
             "compute")  # fmt: skip
_STUCK = ("dead", "raised", "exited", "stopped", "traced", "kernel", "gil")  # stuck whatever the others do
HANG_CATEGORY = {
    "data": "hang.data_loading", "checkpoint": "hang.checkpoint_io", "io": "hang.io", "compute": "hang.compute",
    "eval": "hang.compute", "gil": "hang.compute", "stopped": "hang.stopped", "traced": "hang.stopped",
    "kernel": "hang.kernel", "collective": "hang.collective", "exited": "crash.exit", "raised": "crash.exception",
    "unknown": "hang.unknown", "poll": "hang.poll",
}  # fmt: skip
ERROR_CATEGORY = {"cuda_error": "crash.cuda_error", "network_setup": "crash.network_setup", "oom": "crash.oom",
                  "comm_timeout": "crash.comm_timeout"}  # fmt: skip


@dataclass
class Context:
    """What the blame needs beyond the ranks: how the bundle was triggered and the job-wide evidence."""

    rule: str  # stall | frozen | gpu_idle | exception | rank_death | console | exit | manual
    console: Optional[str] = None  # the console trigger's category: crash.oom, crash.cuda_error, ...
    stuck: list[fr.Stuck] = field(default_factory=list)  # per group, the collective it is stuck at
    # a collective the ranks did not agree on (flight recorder, DETAIL's fingerprints, the watchdog's sizes): each
    # rank's call ("ALLREDUCE [25]"), and where (the group and the sequence number)
    mismatch: dict[int, str] = field(default_factory=dict)
    mismatch_at: str = ""
    oom_ranks: list[int] = field(default_factory=list)
    kernel_oom: bool = False
    progressing: Optional[bool] = None  # on request: whether heartbeats show the job stepping
    absent: list[int] = field(default_factory=list)  # ranks of the world in no bundle given
    unseen: list[int] = field(default_factory=list)  # ranks no evidence speaks of, none expected: never a suspect
    queued: list[int] = field(default_factory=list)  # ranks whose stuck collective is scheduled, not started
    network: list[str] = field(default_factory=list)  # lines that say the network could not be set up
    cuda_lines: list[tuple[Optional[int], str]] = field(default_factory=list)  # the console's CUDA errors
    duplicate_gpu: list[int] = field(default_factory=list)  # ranks NCCL found on one GPU
    ops: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seq) -> the stuck collective's op
    waited: dict[int, float] = field(default_factory=dict)  # rank -> share of its run spent waiting (time ledger)
    cut: dict[int, Cut] = field(default_factory=dict)  # ranks on a host this node lost when the job stopped


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
    exceptions = sorted((s.exception for s in states if s.exception is not None), key=exception_key)
    first = exceptions[0] if exceptions else None
    crashed = any(s.where in ("dead", "raised") for s in states) or _left_early(states)
    crash_rule = ctx.rule in ("exception", "rank_death", "console", "exit")
    timed_out = first is not None and error_kind(first) in ("comm_timeout", "network_setup", "cuda_error")
    if ctx.console or timed_out or crash_rule or (crashed and ctx.rule in ("manual", "unknown")):
        b = _crash(states, ctx, exceptions)
    elif ctx.network and any(s.setup for s in states):
        b = _network(states, ctx, exceptions)
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


def _left_early(states: list[RankState]) -> bool:
    """A rank exited while others were still running (left the training loop), not only finishing."""
    return any(s.where == "exited" for s in states) and any(s.where != "exited" and not s.exiting for s in states)


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


@dataclass
class Waits:
    """Who waits for whom, from the collective each group is stuck at: the roots are the ranks the waiters wait
    for, following waiters that are themselves missing from another group's collective; a cycle is a deadlock."""

    roots: list[int]
    waiters: list[int]
    cycle: list[int]
    via: str  # the collective the first root never entered: "all_reduce #10 of group 0"


def waits(ctx: Context) -> Optional[Waits]:
    edges: dict[int, set[int]] = {}
    via: dict[int, str] = {}
    for st in ctx.stuck:
        # a member no evidence speaks of is no suspect by its absence, unless it is the only one (by elimination)
        blind = set(st.untraced) & set(ctx.unseen)
        targets = set(st.missing) or set(st.untraced) - blind or (blind if len(blind) == 1 else set())
        for w in st.waiting:
            edges.setdefault(w, set()).update(targets)
        for t in targets:
            via.setdefault(t, f"{ctx.ops.get((st.group, st.seq), 'collective')} #{st.seq} of group {st.group}")
    if not any(edges.values()):
        return None
    roots: set[int] = set()
    seen: set[int] = set()
    todo = [w for w, t in edges.items() if t]
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        if not edges.get(r):
            roots.add(r)
        todo.extend(edges.get(r, ()))
    waiters = sorted(w for w in edges if edges[w])
    cycle = [] if roots else sorted(seen)
    first_root = min(roots) if roots else None
    return Waits(sorted(roots), waiters, cycle, via.get(first_root, "") if first_root is not None else "")


def describe(s: RankState, others: list[RankState]) -> str:
    """One rank's state in plain words, for a summary."""
    r = f"rank {s.rank}"
    fixed = {"stopped": f"{r} is stopped (SIGSTOP or a debugger): {s.detail}",
             "traced": f"{r} is stopped under a debugger (ptrace): {s.detail}",
             "kernel": f"{r} is in an uninterruptible sleep in the kernel (a hung filesystem or device): {s.detail}",
             "gil": f"{r} holds the GIL in a native call (its liveness thread cannot run)"}  # fmt: skip
    if s.where in fixed:
        return fixed[s.where]
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
             "eval": "is in eval", "io": "is waiting for I/O",
             "poll": "sleeps and checks in a loop for something that never comes"}  # fmt: skip
    if s.where in doing:
        return f"{r} {doing[s.where]} ({s.detail.removeprefix('main thread in ')})"
    if s.kind == "waiting":
        return f"{r} waits in a collective: {s.detail}"
    return f"{r}: {s.detail}"


def _followed(states: list[RankState], ctx: Context) -> Optional[Blame]:
    """The blame the stuck collectives make: the ranks at the end of every waiter's wait, in their own state."""
    w = waits(ctx)
    if w is None:
        return None
    by_rank = {s.rank: s for s in states}
    w_ids = [r for r in w.waiters if r not in w.roots]
    if w.cycle:
        return Blame(w.cycle, "hang.collective", "collective", "medium", f"{plural_ranks(w.cycle)} wait for each other "
                     "across process groups: collectives issued in a different order on different ranks (a "
                     "deadlock)", [f"{plural_ranks(w.cycle)}: each waits in a group's collective another of them never "
                     "entered"])  # fmt: skip
    present = [by_rank[r] for r in w.roots if r in by_rank]
    missing_txt = f"never entered {w.via}" if w.via else "never entered the collective"
    inferred = [f"{plural_ranks(w.roots)} {missing_txt} that {plural_ranks(w_ids)} "
                f"{'waits' if len(w_ids) == 1 else 'wait'} in (the flight recorder's group status): "
                f"{'it holds' if len(w.roots) == 1 else 'they hold'} the others up; the waiters are "
                "victims"]  # fmt: skip
    if not present and w.roots and all(r in ctx.cut for r in w.roots):
        return _cut_off(w.roots, w_ids, missing_txt, ctx.cut, inferred)
    if not present:  # in no bundle given (another node's), or with no trace of its own
        return Blame(w.roots, "hang.collective", "collective", "medium", f"{plural_ranks(w.roots)} {missing_txt}, "
                     f"which {plural_ranks(w_ids)} {'waits' if len(w_ids) == 1 else 'wait'} in; no bundle given has "
                     f"{'its' if len(w.roots) == 1 else 'their'} stack", inferred)  # fmt: skip
    lead = _pick(present)[0] if len(present) > 1 else present[0]
    head = describe(lead, [s for s in states if s not in present]) if len(present) == 1 else (
        f"{plural_ranks(w.roots)} are in {'/'.join(sorted({s.where for s in present}))}")  # fmt: skip
    summary = (f"{head}, while {plural_ranks(w_ids)} {'waits' if len(w_ids) == 1 else 'wait'} for "
               f"{'it' if len(w.roots) == 1 else 'them'} in {w.via or 'a collective'}")  # fmt: skip
    if lead.kind == "unknown":
        summary = (f"{plural_ranks(w.roots)} {missing_txt}, which {plural_ranks(w_ids)} "
                   f"{'waits' if len(w_ids) == 1 else 'wait'} in; no source says where {plural_ranks(w.roots)} "
                   f"{'is' if len(w.roots) == 1 else 'are'} ({lead.detail})")  # fmt: skip
    confidence = _confidence(present, [s for s in states if s not in present])
    if lead.kind == "unknown":
        confidence = "medium"  # the recorder's status alone says it never arrived
    category = category_of(lead) if lead.kind != "unknown" else "hang.unknown"
    return Blame(sorted(w.roots), category, lead.phase if lead.kind != "unknown" else None, confidence, summary,
                 inferred)  # fmt: skip


def _cut_off(roots: list[int], w_ids: list[int], missing_txt: str, cut: dict[int, Cut],
             inferred: list[str]) -> Blame:  # fmt: skip
    """The ranks the others wait for live on hosts this node lost when the job stopped: no stack of theirs can say
    more, and the likeliest cause is between the hosts (a host down, the network cut), not in the job's code."""
    hosts = sorted({cut[r].host for r in roots})
    since = min((c.since for r in roots if (c := cut[r]).since is not None), default=None)
    at = f" since {time.strftime('%H:%M:%S', time.gmtime(since))} UTC" if since is not None else ""
    how = ("the coordinator there stopped answering" if all(cut[r].how == "unanswered" for r in roots) else
           "blackbox's supervisor there fell silent")  # fmt: skip
    there = ", ".join(f"`{h}`" for h in hosts)
    summary = (f"{plural_ranks(roots)} on {there} {missing_txt}, which {plural_ranks(w_ids)} "
               f"{'waits' if len(w_ids) == 1 else 'wait'} in; this host has heard nothing from {there}{at} ({how}): "
               "the host is down or the network between the hosts is cut")  # fmt: skip
    why = (
        f"{there} went quiet on the coordination when the ranks stopped: the waiters cannot be told apart from "
        "victims of a network partition or a lost host; that host's bundle, where it wrote one, shows its side"
    )
    return Blame(sorted(roots), "hang.network", "collective", "medium", summary, [*inferred, why])


def _partition(waiting: list[RankState], ctx: Context) -> Blame:
    """Every rank with evidence waits in one collective while a node of the job lost another when they stopped: the
    ranks beyond the cut with no evidence here are the ones to look at (their host down, or the network cut); where
    the ranks beyond the cut wait here too, alive, the hosts only lost each other: a partition, every rank its
    victim."""
    lost = sorted(r for r in ctx.cut if r in ctx.absent or r in ctx.unseen)
    there = ", ".join(f"`{h}`" for h in sorted({c.host for c in ctx.cut.values()}))
    since = min((c.since for c in ctx.cut.values() if c.since is not None), default=None)
    at = f" at {time.strftime('%H:%M:%S', time.gmtime(since))} UTC" if since is not None else ""
    if lost:
        summary = (f"every rank with evidence waits in a collective, and {there} went quiet on the coordination{at}, "
                   f"when the ranks stopped ({plural_ranks(lost)} there, with no evidence here): the host is down or "
                   "the network between the hosts is cut")  # fmt: skip
        return Blame(lost, "hang.network", "collective", "medium", summary)
    summary = (f"every rank waits in a collective, alive, and the hosts lost each other on the coordination{at}, when "
               f"the ranks stopped ({there}): the network between the hosts is cut (a partition); every rank is its "
               "victim")  # fmt: skip
    return Blame([], "hang.network", "collective", "medium", summary)


def _pick(elsewhere: list[RankState]) -> list[RankState]:
    """Among ranks that are not waiting, those in the likeliest place to hold the others up."""
    for place in _PRIORITY:
        chosen = [s for s in elsewhere if s.where == place]
        if chosen:
            return chosen
    return elsewhere


def _on_request(states: list[RankState], ctx: Context) -> Optional[Blame]:
    """On request, a job that progresses is `ok` (its slowest rank named); one in which nobody waits for anybody
    and nothing is stuck, too."""
    waiting = [s for s in states if s.kind == "waiting"]
    others = [s for s in states if s.kind != "waiting"]
    if ctx.progressing:
        slow = others if waiting else []
        ids = sorted(s.rank for s in slow)
        be, them = ("is", "it") if len(ids) == 1 else ("are", "them")
        if ids:
            summary = (
                f"the job is progressing; {plural_ranks(ids)} {be} the slowest: the others wait for {them} "
                "in a collective"
            )
            inferred = [f"{plural_ranks(ids)} {be} the slowest: the ones the others wait for in a collective while "
                        "the job progresses"]  # fmt: skip
            return Blame(ids, "ok", slow[0].phase, "low", summary, inferred)
        return _slowest_by_ledger(states, ctx) or Blame([], "ok", None, "low", "the job is progressing")
    stuck = any(s.where in _STUCK for s in others) or bool(waiting and others) or waits(ctx) is not None
    if stuck or _odd_ops(waiting) or ctx.mismatch:
        return None
    unknown = sorted(s.rank for s in others if s.kind == "unknown")
    if unknown:  # "nobody stands out" needs every rank's place: no stack and no trace is no sign of health
        be = "is" if len(unknown) == 1 else "are"
        return Blame(unknown, "hang.unknown", None, "low", f"no source says where {plural_ranks(unknown)} {be} (no "
                     "stack, no place in the collectives): this collection cannot tell a hung job from a healthy "
                     "one")  # fmt: skip
    return Blame([], "ok", None, "low", "no rank stands out: none waits for another, none is stopped or gone")


LEDGER_GAP = 0.25  # a rank this much less of its run waiting than the median of the others' is one they wait for


def _slowest_by_ledger(states: list[RankState], ctx: Context) -> Optional[Blame]:
    """When the dump instant caught no rank waiting (a job that steps: the waits come and go), the time ledgers say
    who the others wait for: the ranks that spent far less of the run waiting for their peers than the others."""
    waited = ctx.waited
    if len(waited) < 2:
        return None
    ids = sorted(r for r, share in waited.items()
                 if statistics.median(v for o, v in waited.items() if o != r) - share >= LEDGER_GAP)  # fmt: skip
    if not ids or len(ids) * 2 > len(waited):  # half the ranks or more: nothing stands out
        return None
    others = statistics.median(v for r, v in waited.items() if r not in ids)
    by_rank = {s.rank: s for s in states}
    be, them = ("is", "it") if len(ids) == 1 else ("are", "them")
    theirs = ", ".join(f"{waited[r]:.0%}" for r in ids)
    summary = (f"the job is progressing; {plural_ranks(ids)} {be} the slowest: over the run the other ranks spent "
               f"{others:.0%} of their time waiting for their peers (in collectives and backward), "
               f"{plural_ranks(ids)} {theirs}")  # fmt: skip
    inferred = [f"{plural_ranks(ids)} {be} the slowest: the others spend their time waiting for {them} (the time "
                "ledgers; no rank was inside a collective at the dump)"]  # fmt: skip
    phase = by_rank[ids[0]].phase if ids[0] in by_rank else None
    return Blame(ids, "ok", phase, "low", summary, inferred)


# Functions of the paths that run collectives on some ranks only: saving, evaluating, logging, the main process's.
OFF_PATH = re.compile(r"checkpoint|save|eval|valid|^log$|^log_|_log_|metric|sync_dist|rank_zero|main_process|report",
                      re.IGNORECASE)  # fmt: skip


def odd_ones(calls: dict[int, str], states: list[RankState]) -> list[int]:
    """The ranks that called the odd collective: the smallest groups of one call. When every call has as many ranks
    (two ranks: each is the other's odd one), the ranks whose call came from a checkpoint, eval or logging path —
    a collective run on some ranks only — rather than the training step's own."""
    groups: dict[str, list[int]] = {}
    for rank, call in calls.items():
        groups.setdefault(call, []).append(rank)
    smallest = min(len(g) for g in groups.values())
    odd = sorted(r for g in groups.values() if len(g) == smallest for r in g)
    if len(groups) < 2 or any(len(g) != smallest for g in groups.values()):
        return odd
    by_rank = {s.rank: s for s in states}
    off = [r for r in odd if r in by_rank and _off_path(by_rank[r])]
    return sorted(off) if off and len(off) < len(odd) else odd


def _off_path(s: RankState) -> bool:
    """Whether a rank's collective came from a checkpoint, eval or logging path (its exception's or stack's frames)."""
    functions = [str(f.get("function")) for f in (s.exception or {}).get("traceback") or [] if isinstance(f, dict)]
    functions += [f.text.removeprefix("main thread in ").split(" (")[0] for f in s.facts if f.stack]
    return any(OFF_PATH.search(fn) for fn in functions)


def _calls(calls: dict[int, str]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, call in sorted(calls.items()):
        groups.setdefault(call, []).append(rank)
    return "; ".join(f"{plural_ranks(r)} in {c}" for c, r in sorted(groups.items(), key=lambda kv: kv[1]))


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


# why a pending collective is the rank's own GPU work, not a wait for a peer (states._queued)
QUEUED_WHY = "every member enqueued it and none started it, or the group is the rank alone"


def _hang(states: list[RankState], ctx: Context) -> Blame:
    waiting = [s for s in states if s.kind == "waiting"]
    elsewhere = [s for s in states if s.kind == "elsewhere"]
    unknown = [s for s in states if s.kind == "unknown"]
    if ctx.rule in ("manual", "unknown"):
        quiet = _on_request(states, ctx)
        if quiet is not None:
            return quiet
    followed = _followed(states, ctx)
    if followed is not None:
        return followed
    if waiting and ctx.queued and {s.rank for s in waiting} <= set(ctx.queued):
        ids = sorted(ctx.queued)
        return Blame(ids, "hang.compute", "compute", "medium", f"{plural_ranks(ids)} enqueued the group's collective "
                     f"and no peer is missing ({QUEUED_WHY}): the GPU still runs the work queued before it, a long "
                     "kernel", [f"{plural_ranks(ids)}: the collective is scheduled behind earlier GPU work, not "
                     "waiting for a peer"])  # fmt: skip
    if ctx.mismatch and not elsewhere:
        odd = odd_ones(ctx.mismatch, states)
        why = [f"the ranks' calls differ at {ctx.mismatch_at or 'the same sequence number'}"]
        return Blame(odd, "hang.collective", "collective", "medium", f"the ranks are in different collectives (a "
                     f"collective mismatch: {_calls(ctx.mismatch)}); {plural_ranks(odd)} called the odd one",
                     why)  # fmt: skip
    if waiting and (elsewhere or unknown):
        chosen = _pick(elsewhere) if elsewhere else unknown
        ids, w_ids = sorted(s.rank for s in chosen), sorted(s.rank for s in waiting)
        head = describe(chosen[0], [s for s in states if s not in chosen]) if len(chosen) == 1 else (
            f"{plural_ranks(ids)} are in {'/'.join(sorted({s.where for s in chosen}))}")  # fmt: skip
        summary = (f"{head}, while {plural_ranks(w_ids)} {'waits' if len(w_ids) == 1 else 'wait'} for "
                   f"{'it' if len(ids) == 1 else 'them'} in a collective ({waiting[0].detail})")  # fmt: skip
        inferred = [f"{plural_ranks(ids)} {'holds' if len(ids) == 1 else 'hold'} the others up: {plural_ranks(w_ids)} "
                    f"{'waits' if len(w_ids) == 1 else 'wait'} in a collective (victims, not causes)"]  # fmt: skip
        rest = [s for s in states if s not in chosen]
        confidence = "low" if chosen[0].kind == "unknown" else _confidence(chosen, rest)
        return Blame(ids, category_of(chosen[0]), chosen[0].phase, confidence, summary, inferred)
    odd_ops = _odd_ops(waiting) if waiting and not (elsewhere or unknown) else []
    if odd_ops and not ctx.absent:
        by_op: dict[str, list[int]] = {}
        for s in waiting:
            by_op.setdefault(str(s.op), []).append(s.rank)
        calls = "; ".join(f"{plural_ranks(r)} in {op}" for op, r in sorted(by_op.items(), key=lambda kv: kv[1]))
        return Blame(odd_ops, "hang.collective", "collective", "medium", f"the ranks wait in different collectives "
                     f"({calls}): a collective mismatch", [f"{plural_ranks(odd_ops)} called a collective the others "
                     "did not (their stacks)"])  # fmt: skip
    if waiting and not elsewhere and not unknown:
        return _all_wait(waiting, ctx)
    if elsewhere:
        # ranks that finished and exited hold no one up where the ones still there finished too: these cannot exit
        chosen = _pick([s for s in elsewhere if s.exiting] or elsewhere)
        ids = sorted(s.rank for s in chosen)
        everyone = len(chosen) == len(states)
        summary = describe(chosen[0], [s for s in states if s not in chosen]) if len(chosen) == 1 else (
            f"{plural_ranks(ids)} are all in {chosen[0].where}" + (
                "" if everyone else " while the others are elsewhere or unknown"))  # fmt: skip
        inferred = [f"{plural_ranks(sorted(s.rank for s in unknown))}: no source settles where "
                    f"{'it is' if len(unknown) == 1 else 'they are'} (a C call, perhaps a collective wait)"] if \
            unknown else []  # fmt: skip
        rest = [s for s in states if s not in chosen]
        confidence = "low" if everyone and len(states) > 1 else _confidence(chosen, rest)
        return Blame(ids, category_of(chosen[0]), chosen[0].phase, confidence, summary, inferred)
    ids = sorted(s.rank for s in unknown)
    return Blame(ids, "hang.unknown", None, "low", "no rank's state could be settled from the evidence")


def _all_wait(waiting: list[RankState], ctx: Context) -> Blame:
    seqs = {s.seq for s in waiting if s.seq is not None}
    if ctx.cut and len(seqs) <= 1:  # every rank with evidence waits in one collective, and hosts lost each other
        return _partition(waiting, ctx)
    if ctx.absent:
        ids = sorted(ctx.absent)
        return Blame(ids, "hang.collective", "collective", "low", f"every rank in these bundles waits in a collective; "
                     f"{plural_ranks(ids)} (in no bundle given) never arrived")  # fmt: skip
    if len(ctx.unseen) > 1:  # the one that never arrived is among the ranks with no evidence: none is named
        return Blame([], "hang.collective", "collective", "low", "every rank with evidence waits in a collective; "
                     f"{plural_ranks(ctx.unseen)} have none, the one the others wait for among them")  # fmt: skip
    if ctx.unseen:  # by elimination: every other rank of the world waits
        return Blame(list(ctx.unseen), "hang.collective", "collective", "low", "every other rank waits in a "
                     f"collective; {plural_ranks(ctx.unseen)}, with no evidence, never arrived")  # fmt: skip
    ids = sorted(s.rank for s in waiting)
    summary = "every rank waits in a collective" + (
        f" (at different sequence numbers: {sorted(seqs)})" if len(seqs) > 1 else
        ": one rank's GPU may still run the work queued before it (a long kernel; NCCL's flight recorder keeps no "
        "start times unless TORCH_NCCL_ENABLE_TIMING=1), or a deadlock, or a peer outside this job (another node, "
        "a subgroup)")  # fmt: skip
    return Blame(ids, "hang.collective", "collective", "low", summary)


def _network(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]]) -> Blame:
    """The job could not set up its communication (rendezvous, gloo's full mesh, NCCL's bootstrap): the ranks that
    failed or wait in set-up, and the addresses the evidence names."""
    failed = sorted({int(str(e.get("rank"))) for e in exceptions if error_kind(e) == "network_setup"})
    if ctx.duplicate_gpu:  # NCCL found two ranks on one GPU: those ranks, whoever reported it
        failed = sorted(ctx.duplicate_gpu)
    in_setup = sorted(s.rank for s in states if s.setup and s.kind == "waiting")
    ids = failed or in_setup or sorted(s.rank for s in states)
    line = next((e for e in exceptions if error_kind(e) == "network_setup"), None)
    said = exception_line(line) if line is not None else (ctx.network[0] if ctx.network else "")
    summary = (f"The job could not set up its network: {plural_ranks(ids)} could not connect to "
               f"{'its' if len(ids) == 1 else 'their'} peers while creating the process group"
               + (f" ({said[:200]})" if said else ""))  # fmt: skip
    inferred = ["a rendezvous / network set-up failure: the ranks never reached training; the address a rank "
                "advertises is what its hostname resolves to (gloo) or the interface NCCL picks"]  # fmt: skip
    if in_setup and failed and set(in_setup) - set(failed):
        inferred.append(f"{plural_ranks(sorted(set(in_setup) - set(failed)))} still wait in process-group set-up "
                        "(victims of the same failure)")  # fmt: skip
    first = line or (exceptions[0] if exceptions else None)
    return Blame(ids, "crash.network_setup" if failed or ctx.rule != "stall" else "hang.network_setup", "startup",
                 "high" if failed and ctx.network else "medium", summary, inferred, first)  # fmt: skip


def _crash(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]]) -> Blame:
    by_rank = {s.rank: s for s in states}
    first = exceptions[0] if exceptions else None
    kinds = [error_kind(e) for e in exceptions]
    if ctx.console == "crash.oom" and ctx.oom_ranks:
        ids = sorted(ctx.oom_ranks)
        return Blame(ids, "crash.oom", None, "high", f"{plural_ranks(ids)} ran out of memory", [], first)
    # a rank's own failure (an OOM, a CUDA fault, its own error) outranks what the console says of the network
    own = [k for k in kinds if k not in ("comm_timeout", "peer_loss", "network_setup")]
    if ctx.console == "crash.network_setup" or "network_setup" in kinds or (ctx.network and not own):
        return _network(states, ctx, exceptions)
    cuda = _cuda(states, ctx, exceptions)
    if cuda is not None:
        return cuda
    if ctx.mismatch and not any(error_kind(e) == "oom" for e in exceptions):  # the job died of it
        odd = odd_ones(ctx.mismatch, states)
        return Blame(odd, "crash.collective_mismatch", "collective", "medium" if len(odd) < len(ctx.mismatch) else
                     "low", f"The ranks called different collectives at {ctx.mismatch_at or 'one sequence number'} "
                     f"({_calls(ctx.mismatch)}); {plural_ranks(odd)} called the odd one", [
                         "a collective mismatch: every rank waits in a call no peer matches (a rank-dependent branch, "
                         "a collective on some ranks only)"], first)  # fmt: skip
    causes = [e for e in exceptions if not is_victim(e) and by_rank.get(int(str(e.get("rank")))) is not None]
    oom = bool(causes) and error_kind(causes[0]) == "oom"  # an OOM is the rank's own failure, whatever timed out
    if not oom and (ctx.console == "crash.comm_timeout" or (first is not None and error_kind(first) == "comm_timeout")):
        return _timeout(states, ctx, exceptions)
    return _first_failure(states, ctx, exceptions, causes)


def _cuda(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]]) -> Optional[Blame]:
    """A CUDA fault (also as NCCL reports it: `unhandled cuda error`): the first rank that raised one, else the
    first the console names."""
    by_rank = {s.rank: s for s in states}
    faulted = [e for e in exceptions if error_kind(e) == "cuda_error"]
    if faulted:
        r = int(str(faulted[0].get("rank")))
        others = sorted({int(str(e.get("rank"))) for e in faulted[1:]} - {r})
        return Blame([r], "crash.cuda_error", _exc_phase(by_rank.get(r)), "high" if not others else "medium",
                     f"Rank {r} raised {exception_line(faulted[0])} first: a CUDA fault"
                     + (f" ({plural_ranks(others)} reported CUDA errors after it)" if others else "") + ".",
                     [], faulted[0])  # fmt: skip
    ranks = [r for r, _ in ctx.cuda_lines if r is not None]
    if ctx.console == "crash.cuda_error" or (ranks and not exceptions):
        line = next(
            (text for r, text in ctx.cuda_lines if r is not None), ctx.cuda_lines[0][1] if ctx.cuda_lines else ""
        )
        ids = [ranks[0]] if ranks else []
        return Blame(ids, "crash.cuda_error", None, "medium" if ids else "low", "A CUDA or NCCL error" + (
            f" on rank {ids[0]}" if ids else "") + (f": {line[:200]}" if line else "") + ".", [],
            exceptions[0] if exceptions else None)  # fmt: skip
    return None


def _timeout(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]]) -> Blame:
    """A collective timed out: the rank that raised is the victim; the suspect is the one the others waited for."""
    first = exceptions[0] if exceptions else None
    raisers = sorted({int(str(e.get("rank"))) for e in exceptions if error_kind(e) == "comm_timeout"})
    followed = _followed(states, ctx)
    if followed is not None and followed.suspects and not set(followed.suspects) <= set(raisers):
        chosen_ids, phase, confidence = followed.suspects, followed.phase, followed.confidence
        head = followed.summary
    elif ctx.queued:
        chosen_ids, phase, confidence = sorted(ctx.queued), "compute", "medium"
        head = (f"{plural_ranks(chosen_ids)} enqueued it and no peer is missing ({QUEUED_WHY}): the GPU still ran "
                "the work queued before it, a long kernel")  # fmt: skip
    else:
        rest = [s for s in states if s.kind != "waiting"]
        chosen = _pick([s for s in rest if s.kind == "elsewhere"]) or [s for s in rest if s.kind == "unknown"]
        chosen_ids = sorted(s.rank for s in chosen)
        phase = chosen[0].phase if chosen else None
        confidence = _confidence(chosen, [s for s in states if s not in chosen]) if chosen else "low"
        head = (f"{describe(chosen[0], [])} — the rank the others waited for" if len(chosen) == 1 else
                f"suspect {plural_ranks(chosen_ids)}: not in the collective the others waited in" if chosen else
                "no rank stands out as the one that never arrived")  # fmt: skip
    summary = "A collective timed out" + (f" on {plural_ranks(raisers)}" if raisers else "") + f"; {head}"
    inferred = [f"{plural_ranks(raisers)} raised the timeout: victims of the rank that never arrived"] if \
        raisers else []  # fmt: skip
    return Blame(chosen_ids, "crash.comm_timeout", phase, confidence if chosen_ids else "low", summary, inferred, first)


def _first_failure(states: list[RankState], ctx: Context, exceptions: list[dict[str, Any]],
                   causes: list[dict[str, Any]]) -> Blame:  # fmt: skip
    """The earliest failure of a rank's own: its exception, else a death, else an early exit."""
    by_rank = {s.rank: s for s in states}
    first = exceptions[0] if exceptions else None
    signal_dead = [s for s in states if s.where == "dead" and s.exception is None and not (s.exit_code or 0) > 0]
    exit_dead = [s for s in states if s.where == "dead" and s.exception is None and (s.exit_code or 0) > 0]
    # a rank that exited while another is still in its run left the others behind; not when every rank still there
    # has finished too, held at the interpreter's exit (a thread it cannot exit without): that is the hang
    early = [s for s in states if s.where == "exited" and any(o.where != "exited" and not o.exiting
                                                               for o in states)]  # fmt: skip
    # SIGTERM is how the launcher tears the other ranks down after the first failure: a rank ended by it is that
    # failure's victim (when every rank was, it is the job's own end: the scheduler's, or a user's)
    torn = [s for s in signal_dead if s.exit_code == -SIGTERM]
    notes = []
    if torn and (len(torn) < len(signal_dead) or exit_dead or early or causes):
        signal_dead = [s for s in signal_dead if s not in torn]
        notes = [f"{plural_ranks(sorted(s.rank for s in torn))} ended by SIGTERM: the launcher tearing the job down "
                 "after the first failure (victims, not causes)"]  # fmt: skip
    if causes and not (signal_dead and _later(causes[0])):
        e = causes[0]
        r = int(str(e.get("rank")))
        kind = error_kind(e)
        category = ERROR_CATEGORY.get(kind or "", "crash.exception")
        confidence = "high" if ctx.rule == "exception" or len(exceptions) == 1 else "medium"
        same = _same_failure(causes)
        if len(same) > 1:  # not one rank's failure: which of them was first by a millisecond says nothing
            every = "every rank" if set(same) >= {st.rank for st in states} else plural_ranks(same)
            summary = (f"{plural_ranks(same).capitalize()} raised {exception_line(e)}, each at the same line "
                       f"({_raised_at(e)}): {every} failed the same way — the code or the set-up they share, not one "
                       "rank.")  # fmt: skip
            return Blame(same, category, _exc_phase(by_rank.get(r)), confidence, summary, [], e)
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
    return _hang(states, ctx)


def _later(exc: dict[str, Any]) -> bool:
    """Whether an exception is a consequence of a death: it says a peer left (ranks died without a record)."""
    return error_kind(exc) == "peer_loss"


def _exc_phase(s: Optional[RankState]) -> Optional[str]:
    """The phase an exception came from: read from its traceback (data, checkpoint, collective), else the phase the
    rank's recorder saw it raise in where that says more than compute (before its first step: startup), else
    compute."""
    if s is None or s.exception is None:
        return None
    w = exception_where(s.exception)
    if w.kind in ("data", "checkpoint", "collective"):
        return w.kind
    return s.phase if s.phase in ("startup", "data", "checkpoint", "eval") else "compute"


def _same_failure(causes: list[dict[str, Any]]) -> list[int]:
    """The ranks that raised the first cause's error — its type, raised at the same line (the message may name the
    rank) — when every cause is that one and more than one rank raised it; else none."""
    if len(causes) < 2:
        return []
    key = (causes[0].get("type"), _raised_at(causes[0]))
    if key[1] is None or any((c.get("type"), _raised_at(c)) != key for c in causes[1:]):
        return []
    ranks = sorted({int(str(c.get("rank"))) for c in causes})
    return ranks if len(ranks) > 1 else []


def _raised_at(exc: dict[str, Any]) -> Optional[str]:
    """`dir/file:line` of the innermost frame of an exception's traceback; None without one."""
    frames = exception_frames(exc)
    if not frames or not frames[-1].file:
        return None
    return f"{'/'.join(frames[-1].file.split('/')[-2:])}:{frames[-1].line}"
