"""From a bundle to a verdict: category, phase, suspect ranks, evidence marked observed or inferred, and
next actions. Pure: reads the Bundle object only. Imports the stdlib and blackbox's model and reader."""

from __future__ import annotations

import bisect
import json
import re
from datetime import datetime
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import comm_log, cuda_memory, stacks
from ..adapters import flight_recorder as fr
from ..adapters.cuda_memory import human
from ..bundle import layout as L
from ..bundle.evidence import exception_records, per_rank
from ..bundle.reader import Bundle, integer, number
from ..detections import ON_REQUEST_RULES, Trigger, life_stage, plural_ranks
from .actions import Blocked, Facts, next_actions
from .blame import ERROR_CATEGORY, Blame, Context, blame
from .evidence import findings as evidence_findings
from .gpus import gpu_findings, gpu_series
from .model import Finding, RankRow, Report, Verdict
from .motion import findings as motion_findings
from .nodes import node_findings, preempted_before, unreachable
from .sources import flight_recorder_dumps, hosts, rank_hosts
from .stackgroups import RankStack, group, rank_stack, signature
from .states import JobEvidence, RankState, exception_line, job_evidence, late_arrival, read_state
from .timeshare import findings as time_findings
from .timeshare import time_ledger

CONSOLE_LINES = 15


def _rows(bundle: Bundle, node: str, rank_stacks: dict[int, RankStack], tree: Optional[str]) -> list[RankRow]:
    """One row per rank: from its heartbeat where the recorder ran, else from the manifest and its stacks."""
    rows: dict[int, RankRow] = {}
    rank_nodes = bundle.manifest.get("rank_nodes")  # merged node bundles: which node each rank came from
    rank_nodes = rank_nodes if isinstance(rank_nodes, dict) else {}
    for rank_id in bundle.ranks():
        name = L.rank_member(rank_id, L.HEARTBEAT)
        if name not in bundle.files:
            continue
        hb = bundle.json(name)
        if not isinstance(hb, dict):
            continue
        rank = integer(hb.get("rank"))
        rank = rank_id if rank is None else rank
        host = str(rank_nodes.get(str(rank), node))
        top_frame, top_path = _top(rank_stacks.get(rank), tree)
        rows[rank] = RankRow(
            rank=rank, node=host, pid=integer(hb.get("pid")) or 0, state=str(hb.get("state", "unknown")),
            step=integer(hb.get("step", 0)), phase=str(hb.get("phase", "unknown")),
            top_frame=top_frame, top_path=top_path,
            idle_s=number(hb.get("idle_s")), alive=bool(hb.get("alive")),
            collective=str(hb.get("collective")) if hb.get("phase") == "collective" else None,
            last_step_s=number(hb.get("last_step_dt")),
        )  # fmt: skip
    for entry in bundle.local_ranks():
        rank, pid = integer(entry.get("rank")), integer(entry.get("pid"))
        if rank is None or pid is None or rank in rows:
            continue
        rs = rank_stacks.get(rank)
        host = str(entry.get("node") or rank_nodes.get(str(rank), node))
        top_frame, top_path = _top(rs, tree)
        rows[rank] = RankRow(rank=rank, node=host, pid=pid, state="running" if entry.get("alive") else "gone",
                             step=None, phase=rs.waits_in if rs else "unknown", top_frame=top_frame,
                             alive=bool(entry.get("alive")), top_path=top_path)  # fmt: skip
    return [rows[r] for r in sorted(rows)]


def _top(rs: Optional[RankStack], tree: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """A rank's top user frame, and its file from the job's work tree (`in_tree`)."""
    frame = rs.thread.top_user_frame() if rs is not None else None
    return (frame.describe(), in_tree(frame.file, tree)) if frame is not None else (None, None)


def work_tree(bundle: Bundle) -> Optional[str]:
    """The root of the git work tree the job ran in (node.json), where it is known."""
    node = bundle.json(L.NODE)
    git = node.get("git") if isinstance(node, dict) else None
    top = git.get("toplevel") if isinstance(git, dict) else None
    return top.rstrip("/") if isinstance(top, str) and top.startswith("/") and len(top) > 1 else None


def in_tree(file: str, tree: Optional[str]) -> Optional[str]:
    """A file named from the job's work tree (`scripts/train.py`): the same in every clone of the project, another
    in another project; None for a file outside it, or where the tree is unknown."""
    return file[len(tree) + 1 :][:500] if tree and file.startswith(tree + "/") and "/../" not in file else None


def _int_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _rank_ids(bundle: Bundle) -> list[int]:
    return bundle.ranks()


def _exceptions(bundle: Bundle, ranks: list[int]) -> list[dict[str, Any]]:
    """Uncaught main-thread exceptions of every rank, earliest first (the recorder's exceptions.jsonl)."""
    return sorted((e for rank in ranks for e in exception_records(bundle, rank)), key=lambda r: float(r["time"]))


_CONSOLE_CATEGORY = {  # a console trigger's kind of fatal line
    "comm_timeout": "crash.comm_timeout", "oom": "crash.oom", "cuda_error": "crash.cuda_error",
    "segfault": "crash.signal",
}  # fmt: skip


def _exception_record(exc: dict[str, Any], tree: Optional[str]) -> dict[str, Any]:
    tb: list[Any] = exc["traceback"] if isinstance(exc.get("traceback"), list) else []
    frames = [stacks.Frame(str(f.get("file", "?")), int(f.get("line") or 0), str(f.get("function", "?")))
              for f in tb if isinstance(f, dict)]  # fmt: skip
    user = [f for f in frames if not f.is_library] or frames
    return {"rank": exc.get("rank"), "type": str(exc.get("type")), "message": exception_line(exc),
            "frame": user[-1].describe() if user else None, "path": in_tree(user[-1].file, tree) if user else None
            }  # fmt: skip


def _collective_findings(
    bundle: Bundle, torch_fr: Optional[tuple[Optional[str], str]], rows: list[RankRow]
) -> tuple[dict[int, dict[str, Any]], list[fr.Unjoined], list[fr.Mismatch], list[Finding], JobEvidence]:
    """The flight recorder's dumps (and the NCCL watchdog's lines in the console): per group, the collective it is
    stuck at and who never entered it; collectives that differ across ranks; PyTorch's own analyzer's word."""
    dumps, errors, moved = flight_recorder_dumps(bundle)
    findings = [Finding("observed", f"a flight-recorder trace could not be read: {e}", L.FLIGHT_RECORDER_DIR)
                for e in errors]  # fmt: skip
    if moved:
        text = (f"{plural_ranks(sorted(moved))} entered {sum(moved.values())} more collective(s) after the collection "
                "began (a native call ended early when blackbox's dump signal interrupted it, and the job moved on); "
                "their flight-recorder traces are read as they stood when it began")  # fmt: skip
        findings.append(Finding("observed", text, f"{L.FLIGHT_RECORDER_DIR}: entries' time_created_ns"))
    world = bundle.section("job").get("world_size")
    ev = job_evidence(bundle, dumps, world if isinstance(world, int) and 0 < world <= 1_000_000 else len(rows))
    extra = ev.console_statuses
    unjoined = fr.unjoined(dumps, extra, ev.ops, ev.entered) if dumps or extra else []
    mismatched = fr.mismatches(dumps, ev.entered) if dumps else []
    for st in ev.stuck:
        for r in st.late[:8]:
            findings.append(Finding("observed", f"rank {r} {late_arrival(r, st, ev)}, counted as waiting, not as the "
                                    "rank the others wait for",
                                    f"{L.FLIGHT_RECORDER_DIR}, {L.rank_member(r, L.HEARTBEAT)}"))  # fmt: skip
    for t in ev.console.timeouts[:8]:
        findings.append(Finding("observed", f"rank {t.rank}: the NCCL watchdog timed out on {t.op} #{t.seq}"
                                + (f" of group {t.group}" if t.group else "") + (
                                    f" (last enqueued #{t.last_enqueued}, last completed #{t.last_completed})"
                                    if t.last_enqueued is not None else ""), L.CONSOLE_TAIL))  # fmt: skip
    for mm in mismatched:
        calls = "; ".join(f"{plural_ranks(r)} called {call}" + (f" at {mm.where[call]}" if call in mm.where else "")
                          for call, r in sorted(mm.calls.items(), key=lambda kv: (len(kv[1]), kv[0])))  # fmt: skip
        findings.append(Finding("observed", f"collective #{mm.seq} of group {mm.group_name} is not the same on every "
                                f"rank: {calls}", f"{L.FLIGHT_RECORDER_DIR}: entries"))  # fmt: skip
    for u in unjoined:
        absent = u.missing or u.untraced
        text = (f"{plural_ranks(absent)} never entered {u.op} #{u.seq} (group {u.group_name}) that "
                f"{plural_ranks(u.waiting)} {'waits' if len(u.waiting) == 1 else 'wait'} in"
                + (f" at {u.where}" if u.where else "")
                + ("" if u.missing else " (no trace of theirs in the bundle: inferred from the others')"))  # fmt: skip
        seen = "; ".join(f"rank {r} last entered a collective at {w}" for r, w in sorted(u.last_seen.items()))
        findings.append(Finding("observed", text + (f" — {seen}" if seen else ""),
                                f"{L.FLIGHT_RECORDER_DIR}: pg_status and entries"))  # fmt: skip
    if torch_fr is not None:
        output, how = torch_fr
        missing = fr.analyzer_missing_ranks(output or "")
        if missing:
            source = "python -m torch.distributed.flight_recorder.fr_trace (normalised dumps)"
            findings.append(Finding("observed", f"PyTorch's flight-recorder analyzer: missing ranks {missing}", source))
        elif output is None or how != "PyTorch's analyzer ran":
            findings.append(Finding("observed", how, L.FLIGHT_RECORDER_DIR))
    return dumps, unjoined, mismatched, findings, ev


def _memory_findings(bundle: Bundle, ranks: list[int], findings: list[Finding], facts: Facts) -> list[int]:
    """OOM records (the message's figures, the last batch) and memory snapshots (the largest live allocations
    with the user frame that made them). Returns the ranks that ran out of memory."""
    oom_ranks = []
    for rank in ranks:
        source = L.rank_member(rank, P.RANK_OOM)
        for line in bundle.text(source).splitlines()[-1:]:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            oom_ranks.append(rank)
            parsed = cuda_memory.parse_oom(str(rec.get("message", "")))
            text = f"rank {rank} ran out of CUDA memory" + (f": {parsed.describe()}" if parsed else "")
            phase = f" in phase {rec.get('phase')} at step {rec.get('step')}" if rec.get("phase") else ""
            findings.append(Finding("observed", text + phase, source))
            if parsed and "reserved_unallocated" in parsed.sizes:
                facts.reserved_unallocated = cuda_memory.human(parsed.sizes["reserved_unallocated"])
            batch = rec.get("last_batch")
            if isinstance(batch, list) and batch:
                shapes = ", ".join(f"{b.get('path')} {b.get('shape')} {b.get('dtype')}" for b in batch[:6]
                                   if isinstance(b, dict))  # fmt: skip
                facts.last_batch[rank] = shapes
                findings.append(Finding("observed", f"rank {rank}'s last batch: {shapes}", source))
        snapshot = L.rank_member(rank, P.RANK_MEMORY_SNAPSHOT.partition("%d")[0])  # and the OOM ones
        for name in [n for n in bundle.rank_files(rank) if n.startswith(snapshot)]:
            facts.snapshots[rank] = name
            try:
                snap = cuda_memory.load_snapshot(bundle.files[name])
            except cuda_memory.SnapshotError as exc:
                findings.append(Finding("observed", f"rank {rank}'s memory snapshot could not be read: {exc}", name))
                continue
            top, allocated, reserved = cuda_memory.largest_allocations(snap)
            findings.append(Finding("observed", f"rank {rank}'s memory snapshot: {cuda_memory.human(allocated)} "
                                    f"allocated in {cuda_memory.human(reserved)} reserved", name))  # fmt: skip
            for a in top:
                findings.append(Finding("observed", f"rank {rank}: live allocation of {cuda_memory.human(a.size)}"
                                        + (f" from {a.frame}" if a.frame else ""), name))  # fmt: skip
    return oom_ranks


TIMELINE_HISTORIES = 1024  # ranks whose whole history the timeline draws: the suspects, then the lowest ranks


def _timeline(bundle: Bundle, rows: list[RankRow], suspects: list[int]) -> dict[str, Any]:
    """Each rank's step over time (the supervisor's heartbeat history, else its last progress alone), and the
    rank that stopped progressing first. Past TIMELINE_HISTORIES ranks the others keep their last progress only:
    no page draws 32,768 histories, and reading them costs a third of the report's time."""
    out: list[dict[str, Any]] = []
    drawn = set(suspects) | {row.rank for row in rows[:TIMELINE_HISTORIES]}
    for row in rows:
        samples = []
        history = bundle.json(L.rank_member(row.rank, L.HISTORY)) if row.rank in drawn else None
        for h in history if isinstance(history, list) else []:
            t = number(h.get("t")) if isinstance(h, dict) else None
            if t is not None and integer(h.get("step")) is not None:
                samples.append([t, integer(h.get("step")), str(h.get("phase", ""))])
        hb = bundle.json(L.rank_member(row.rank, L.HEARTBEAT))
        last = number(hb.get("last_progress_wall")) if isinstance(hb, dict) else None
        last = last if last is not None and last > 0 else None
        if last is not None and not samples:
            samples.append([last, row.step or 0, row.phase])
        out.append({"rank": row.rank, "node": row.node, "samples": samples[-500:], "last_progress": last})
    stopped = [t for t in out if t["last_progress"] is not None]
    first = min(stopped, key=lambda t: (t["last_progress"], t["rank"]))["rank"] if len(stopped) > 1 else None
    return {"ranks": out, "stopped_first": first, "end": _created(bundle)}


def _created(bundle: Bundle) -> Optional[float]:
    """When the bundle was written (wall time), from its manifest."""
    created = bundle.manifest.get("created")
    if isinstance(created, str):
        try:
            return datetime.fromisoformat(created).timestamp()
        except ValueError:
            return None
    return None


def _rank_summary(rows: list[RankRow], rank_stacks: dict[int, RankStack], suspects: list[int]) -> list[Finding]:
    """What each rank was doing: the suspects one by one, the others grouped by what they share (step, where,
    alive, main-thread frame), so that 4,095 ranks waiting in the same all_reduce are one line, not 8,190."""
    out: list[Finding] = []
    groups: dict[tuple[object, ...], list[RankRow]] = {}
    for row in rows:
        rs = rank_stacks.get(row.rank)
        if row.rank in suspects:
            out.extend(_one_rank(row, rs))
            continue
        key = (row.step, row.phase, row.collective, row.alive, row.state, row.top_frame)
        groups.setdefault(key, []).append(row)
    for members in groups.values():
        if len(members) == 1:
            out.extend(_one_rank(members[0], rank_stacks.get(members[0].rank)))
            continue
        row = members[0]
        ids = [m.rank for m in members]
        where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
        step = f" at step {row.step}" if row.step is not None else ""
        idles = [m.idle_s for m in members if m.idle_s is not None]
        idle = ""
        if idles:
            lo, hi = min(idles), max(idles)
            span = f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
            idle = f", no progress for {span} s"
        life = "" if row.alive else f", processes gone ({row.state})"
        frame = f"; main thread in {row.top_frame}" if row.top_frame else ""
        source = L.rank_member("*", L.HEARTBEAT) if row.step is not None else L.MANIFEST
        out.append(Finding("observed", f"{plural_ranks(ids)} ({len(ids)} ranks){step}, {where}{idle}{life}{frame}",
                           source + (", " + L.process_member("*", L.PYSPY) if frame else "")))  # fmt: skip
    return out


def _workers(ranks: list[int], rank_stacks: dict[int, RankStack]) -> dict[str, list[str]]:
    """Each rank's DataLoader workers, attached to its stack group: "pid: where its main thread is"."""
    out: dict[str, list[str]] = {}
    for rank in ranks:
        rs = rank_stacks.get(rank)
        for pid, worker in rs.workers if rs is not None else ():
            top = worker.top_user_frame()
            out.setdefault(str(rank), []).append(f"worker {pid}: {signature(worker)}" if top else f"worker {pid}")
    return out


def _one_rank(row: RankRow, rs: Optional[RankStack]) -> list[Finding]:
    where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
    idle = f", no progress for {row.idle_s:.0f} s" if row.idle_s is not None else ""
    life = "" if row.alive else f", process gone ({row.state})"
    step = f" at step {row.step}" if row.step is not None else ""
    source = L.rank_member(row.rank, L.HEARTBEAT) if row.step is not None else L.MANIFEST
    out = [Finding("observed", f"rank {row.rank} (pid {row.pid}){step}, {where}{idle}{life}", source)]
    if rs is not None and row.top_frame:
        out.append(Finding("observed", f"rank {row.rank}'s main thread is in {row.top_frame}", rs.source))
    return out


def _rank_states(bundle: Bundle, rank_stacks: dict[int, RankStack], rows: list[RankRow],
                 ev: JobEvidence) -> list[RankState]:  # fmt: skip
    """Every rank's state from every source (analyze.states), in rank order."""
    ages: dict[int, float] = {}
    for row in rows:
        hb = bundle.json(L.rank_member(row.rank, L.HEARTBEAT))
        age = hb.get("liveness_age_s") if isinstance(hb, dict) and hb.get("alive") else None
        if isinstance(age, (int, float)):
            ages[row.rank] = float(age)
    nodes = {row.rank: row.node for row in rows}
    node = str(bundle.manifest.get("node", "unknown"))
    entries: dict[int, dict[str, Any]] = {}
    for entry in bundle.local_ranks():
        if isinstance(entry.get("rank"), int):
            entries.setdefault(entry["rank"], entry)
    ordered = sorted(ages.values())
    out = []
    world = bundle.section("job").get("world_size")
    said = {e.rank for e in ev.console.exceptions} | {t.rank for t in ev.console.timeouts} | set(ev.console.setup_waits)
    said = {r for r in said if isinstance(world, int) and 0 <= r < world}  # ranks only the console speaks of
    for rank in sorted(set(nodes) | set(bundle.ranks()) | said):
        out.append(read_state(bundle, rank, nodes.get(rank, node), rank_stacks.get(rank), ev,
                              _peer_median(ordered, ages.get(rank)), entries.get(rank, {})))  # fmt: skip
    return out


def _peer_median(ordered: list[float], own: Optional[float]) -> Optional[float]:
    """The median of the other ranks' values: `ordered` is every rank's, sorted; `own` this rank's (or None)."""
    if own is None:
        return ordered[len(ordered) // 2] if ordered else None
    n = len(ordered) - 1
    if n <= 0:
        return None
    at = bisect.bisect_left(ordered, own)
    m = n // 2
    return ordered[m] if m < at else ordered[m + 1]


def _stopped_at(bundle: Bundle, rows: list[RankRow]) -> Optional[float]:
    """When the job's ranks stopped (wall time): the collection's time less the longest idle of a live rank."""
    idles = [r.idle_s for r in rows if r.idle_s is not None and r.alive]
    end = _created(bundle)
    return end - max(idles) if idles and end is not None else None


def _progressing(rows: list[RankRow]) -> Optional[bool]:
    """On request: whether the heartbeats show the job stepping (None: no heartbeats to tell)."""
    idles = [r.idle_s for r in rows if r.idle_s is not None and r.alive]
    if not idles:
        return None
    step_s = max([r.last_step_s for r in rows if r.last_step_s] or [0.0])
    return max(idles) < max(30.0, 5 * step_s)


def _state_findings(states: list[RankState], suspects: list[int]) -> list[Finding]:
    """Each suspect's state with the sources that say so, and every rank whose sources disagree."""
    out = []
    for s in states:
        if s.rank in suspects:
            sources = sorted({f.source for f in s.facts if f.says == s.where or (s.kind == "waiting" and f.says == (
                "waiting")) or (s.kind == "elsewhere" and f.says == "behind")})  # fmt: skip
            out.append(Finding("observed", f"rank {s.rank}'s state: {s.kind} ({s.where}) — {s.detail}"
                               + (f"; {len(sources)} source(s) agree" if sources else ""),
                               ", ".join(sources) or None))  # fmt: skip
            polls = next((f for f in s.facts if f.says == "poll"), None) if s.where == "poll" else None
            if polls is not None:  # what the loop may wait for, and that it does not move
                out.append(Finding("observed", f"rank {s.rank}: {polls.text}", polls.source))
        if s.conflicts:
            out.append(Finding("observed", f"rank {s.rank}: the sources disagree — classed {s.kind} ({s.where}) from "
                               f"{s.detail}; but " + "; ".join(s.conflicts[:3]), "per-rank sources"))  # fmt: skip
    return out


def _trigger(bundle: Bundle) -> tuple[str, str, dict[str, Any]]:
    """(the rule that made the bundle, its reason, the detection): a bundle collected for another node's incident
    is judged by that incident's rule."""
    detection = bundle.json(L.DETECTION)
    detection = detection if isinstance(detection, dict) else {}
    incident = bundle.section("incident")
    if bundle.trigger.remote and not detection and incident:
        detection = {"rule": incident.get("rule"), "ranks": incident.get("ranks"),
                     "reason": f"node {incident.get('origin')} reported: {incident.get('reason')}"}  # fmt: skip
    rule = str(detection.get("rule") or bundle.trigger.rule)
    return ("manual" if rule in ON_REQUEST_RULES else rule), str(detection.get("reason", "")), detection


def _console_category(bundle: Bundle, reason: str) -> Optional[str]:
    """A console trigger's category, judged again on its line: the live rule files every `NCCL error` under CUDA
    errors, but an `unhandled system error` is a network's, and a timeout's words are a timeout."""
    trigger = bundle.trigger
    if trigger.rule != "console":
        return None
    kind = comm_log.error_kind(reason)
    if kind == "peer_loss":
        return None
    return ERROR_CATEGORY.get(kind or "") or _CONSOLE_CATEGORY.get(trigger.kind or "")


def _evidence(bundle: Bundle, rows: list[RankRow], rank_stacks: dict[int, RankStack],
              facts: Facts) -> tuple[list[Finding], list[int], list[dict[str, Any]]]:  # fmt: skip
    """Findings read straight from the bundle (workers, missing ranks and nodes, exceptions, memory, kernel, disk,
    GPUs), and what the actions point at. Returns the findings, the ranks of the world in no bundle, and the
    recorder's exceptions."""
    findings: list[Finding] = []
    for row in rows:
        rs = rank_stacks.get(row.rank)
        for pid, worker in rs.workers if rs is not None else ():
            top = worker.top_user_frame()
            if top is not None:
                text = f"rank {row.rank}'s DataLoader worker {pid} is in {top.describe()}"
                findings.append(Finding("observed", text, L.process_member(row.rank, L.PYSPY, pid)))
    world = bundle.section("job").get("world_size")
    absent: list[int] = []
    if isinstance(world, int) and 0 < len(rows) < world <= len(rows) + 100_000:
        absent = [r for r in range(world) if r not in facts.by_rank]
        are = "is" if len(absent) == 1 else "are"
        findings.append(Finding("observed", f"{plural_ranks(absent)} of {world} {are} in none of the bundles given: "
                                "their node's bundle is missing (give every node's bundle to merge them)",
                                "manifest.json: job.world_size"))  # fmt: skip
    findings.extend(node_findings(bundle))
    raised = _exceptions(bundle, list(facts.by_rank) or _rank_ids(bundle))
    for exc in raised[:3]:
        findings.append(Finding("observed", f"rank {exc['rank']} raised {exception_line(exc)}",
                                L.rank_member(exc["rank"], P.RANK_EXCEPTIONS)))  # fmt: skip
    oom, ours = _kernel_oom(bundle.text(L.KERNEL_MESSAGES), {row.pid for row in facts.by_rank.values()})
    facts.kernel_oom = ours
    if oom is not None:
        findings.append(Finding("observed", ("the kernel log mentions the OOM killer: " if ours else "the kernel's "
                                "OOM killer ended a process that is none of this job's ranks (memory was short on "
                                "this node): ") + oom[:300], L.KERNEL_MESSAGES))  # fmt: skip
    node_facts = bundle.json(L.NODE)
    facts.hostname_note = _hostname_note(node_facts, bundle.json(L.NODE_ENV))
    disk = node_facts.get("run_dir_disk") if isinstance(node_facts, dict) else None
    if isinstance(disk, dict) and isinstance(disk.get("free"), int):
        facts.disk_free = f"{human(disk['free'])} free at {disk.get('path')}"
    for rank, rs in rank_stacks.items():
        if rs.workers:
            facts.stuck_workers[rank] = [pid for pid, _ in rs.workers]
        if rs.waits_in == "checkpoint":
            top = rs.thread.top_user_frame()
            facts.checkpoint_frame = top.describe() if top else None
    gpu_findings(bundle, findings)
    return findings, absent, raised


def _action_facts(facts: Facts, unjoined: list[fr.Unjoined], mismatched: list[fr.Mismatch],
                  first: Optional[dict[str, Any]], states: list[RankState], ev: JobEvidence) -> None:  # fmt: skip
    """What the next actions name: the collective never entered, the mismatch, the first exception and the file it
    names, what a rank blocked in I/O reads, the network set-up's addresses."""
    if unjoined:
        u = unjoined[0]
        facts.missing_collective = f"{u.op} #{u.seq} (group {u.group_name})"
    if mismatched:
        mm = mismatched[0]
        facts.mismatch = (
            "; ".join(
                f"{plural_ranks(r)} called {call.split(' ')[0]}" + (f" at {mm.where[call]}" if call in mm.where else "")
                for call, r in sorted(mm.calls.items(), key=lambda kv: (len(kv[1]), kv[0]))
            )
            + f" (collective #{mm.seq}, group {mm.group_name})"
        )
    if first is not None:
        tb = first.get("traceback") if isinstance(first.get("traceback"), list) else []
        at = f" at {tb[-1].get('file', '?').rsplit('/', 1)[-1]}:{tb[-1].get('line')}" if tb and isinstance(
            tb[-1], dict) else ""  # fmt: skip
        facts.exception = exception_line(first) + at
        path = re.search(r"'(/[^']+)'", exception_line(first))
        facts.exception_path = path.group(1) if path else None
    for s in states:
        io = next((f for f in s.facts if f.says == "io"), None)
        if io is not None:
            facts.blocked_io.setdefault(s.rank, Blocked(io.text, io.waited, io.by_thread))
    facts.network_lines = ev.console.network[:3] + ev.console.hostname_fallback[:1]
    facts.no_start = ev.console.no_start[:1]
    facts.remote_addresses = ev.console.remote_addresses[:4]


_OOM = re.compile(r"oom-kill|Out of memory|Killed process")
_OOM_PID = re.compile(r"Killed process (\d+)|[,:]pid=(\d+)")


def _kernel_oom(kernel: str, pids: set[int]) -> tuple[Optional[str], bool]:
    """The kernel log's OOM-killer line to show, and whether it is this job's: a line that names a killed pid names
    one of its ranks (an OOM kill of another process, an hour before, is no rank's death); a log whose lines name no
    pid at all (another format) is taken as before, as the job's."""
    lines = [line for line in kernel.splitlines() if _OOM.search(line)]
    if not lines:
        return None, False
    named = [(line, int(next(g for g in m.groups() if g))) for line in lines for m in _OOM_PID.finditer(line)]
    if not named:
        return lines[0], True
    mine = [line for line, pid in named if pid in pids]
    return (mine[0], True) if mine else (named[-1][0], False)


def analyze(bundle: Bundle, torch_fr: Optional[tuple[Optional[str], str]] = None) -> Report:
    """`torch_fr`: PyTorch's own analyzer's output and how it went, when the caller ran it
    (adapters.flight_recorder.torch_analyzer); the analysis itself stays pure. The steps: evidence readers →
    per-rank state (analyze.states) → blame, category and summary (analyze.blame) → findings and next actions."""
    m = bundle.manifest
    node = str(m.get("node", "unknown"))
    rank_stacks = {rs.rank: rs for rs in (rank_stack(bundle, r) for r in _rank_ids(bundle)) if rs is not None}
    tree = work_tree(bundle)
    rows = _rows(bundle, node, rank_stacks, tree)
    groups = group(list(rank_stacks.values()))
    rule, reason, detection = _trigger(bundle)
    options = bundle.section("collection").get("options")
    ending = preempted_before(bundle)
    facts = Facts(node, {r.rank: r for r in rows}, hosts=rank_hosts(bundle),
                  job_ended=isinstance(options, dict) and options.get("job_ends") is True,
                  preempted_node=ending.who if ending else None)  # fmt: skip
    findings, absent, raised = _evidence(bundle, rows, rank_stacks, facts)
    oom_ranks = _memory_findings(bundle, list(facts.by_rank) or _rank_ids(bundle), findings, facts)
    dumps, unjoined, mismatched, fr_findings, ev = _collective_findings(bundle, torch_fr, rows)
    findings.extend(fr_findings)
    facts.queued = ev.queued
    # per-rank state from every source, then one blame
    states = _rank_states(bundle, rank_stacks, rows, ev)
    state_of = {s.rank: s for s in states}
    for row in rows:  # without the recorder a rank's phase is what its state says (stack, native frames, /proc)
        st = state_of.get(row.rank)
        row.stage = life_stage(row.step, row.state, row.alive, bool(st and st.setup), bool(st and st.exiting))
        if st is not None and row.step is None:
            row.phase = st.phase if st.phase not in ("unknown", "ambiguous") else st.where
    calls, at = _mismatch(mismatched, ev)
    unseen = _unseen(bundle, state_of)
    blind = [] if _expected(bundle) else sorted(set(absent) | set(unseen))  # no evidence, and none was expected
    # lines that say the set-up failed; gloo's loopback fallback too, where the job spans several hosts (on one host
    # loopback works, and single-host jobs print it all the time)
    network = ev.console.network + ([reason] if comm_log.error_kind(reason) == "network_setup" else []) + (
        ev.console.hostname_fallback[:1] if hosts(bundle) > 1 else [])  # fmt: skip
    time = time_ledger(bundle, [r.rank for r in rows], {r.rank: r.node for r in rows})
    ctx = Context(rule=rule, console=_console_category(bundle, reason), stuck=ev.stuck, mismatch=calls, mismatch_at=at,
                  queued=ev.queued, oom_ranks=oom_ranks, kernel_oom=facts.kernel_oom, network=network,
                  absent=(absent or unseen) if _expected(bundle) else [], unseen=blind,
                  progressing=_progressing(rows) if rule == "manual" else None, cuda_lines=ev.console.cuda_errors,
                  ops={**ev.ops, **{(u.group, u.seq): u.op for u in unjoined}},
                  duplicate_gpu=ev.console.duplicate_gpu,
                  waited=_waited(time),
                  cut=unreachable(bundle, _stopped_at(bundle, rows)))  # fmt: skip
    b = blame(states, ctx)
    suspects = b.suspects
    summary = _summary(b, rule, Trigger(bundle.trigger.rule, bundle.trigger.kind).name, reason,
                       ending.words if ending else None)  # fmt: skip
    findings.extend(Finding("inferred", text, "per-rank states (analyze.states)") for text in b.inferred)
    findings = _state_findings(states, suspects) + findings
    first = b.first_exception if isinstance(b.first_exception, dict) else (raised[0] if raised else None)
    _action_facts(facts, unjoined, mismatched, first, states, ev)
    if reason:
        source = f"{L.DETECTION}, {L.CONSOLE_TAIL}" if detection.get("rule") == "console" else L.DETECTION
        findings.append(Finding("observed", f"trigger: {reason}", source))
    arrivals = fr.arrivals(dumps) if time["stragglers"] else []  # read only beside a straggler it would confirm
    findings.extend(Finding("observed", text, source) for text, source in time_findings(time, arrivals))
    findings.extend(Finding("observed", t, source) for t, source in motion_findings(bundle, [r.rank for r in rows]))
    evidence = per_rank(bundle, [r.rank for r in rows])
    findings.extend(evidence_findings(bundle, evidence, suspects))
    findings = _rank_summary(rows, rank_stacks, suspects) + findings
    # the suspects' facts first: they are the ones a reader needs
    findings.sort(key=lambda f: not any(f.text.startswith(f"rank {r} ") or f.text.startswith(f"rank {r}'")
                                        for r in suspects))  # fmt: skip
    confidence = b.confidence
    if blind:  # no evidence is not a suspect: it lowers the confidence
        confidence = "low"
        findings.append(Finding("observed", f"no evidence: {plural_ranks(blind)} of "
                                f"{bundle.section('job').get('world_size')} are in nothing this bundle holds "
                                "(neither suspects nor cleared)", "manifest.json: job.world_size"))  # fmt: skip
    verdict = Verdict(b.category, b.phase, suspects, confidence, summary)
    console = bundle.text(L.CONSOLE_TAIL)
    _, marker, body = console.partition("\n# ---\n")  # after console.log's header, when the tail still has it
    tail = [line for line in (body if marker else console).splitlines() if line.strip()][-CONSOLE_LINES:]
    return Report(
        run_id=str(m.get("run_id", "unknown")), node=node, trigger=str(m.get("trigger", "unknown")), bundle=bundle.path,
        verdict=verdict, ranks=rows, findings=findings, next_actions=next_actions(verdict, facts), console_tail=tail,
        collectives=[u.__dict__ for u in unjoined], exception=None if first is None else _exception_record(first, tree),
        timeline=_timeline(bundle, rows, suspects), gpus=gpu_series(bundle), time=time,
        evidence=[e.to_json() for e in evidence],
        stack_groups=[{"ranks": g.ranks, "waits_in": g.waits_in, "signature": g.signature, "frames": g.frames,
                       "odd": g.odd, "sources": g.sources, "describe": g.describe(),
                       "workers": _workers(g.ranks, rank_stacks)} for g in groups],
    )  # fmt: skip


def _hostname_note(node: Any, env: Any) -> Optional[str]:
    """This node's side of a network set-up, in words: what its hostname resolves to (gloo advertises that
    address), its interfaces, and whether GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are set."""
    if not isinstance(node, dict):
        return None
    parts = []
    res = node.get("hostname_resolves")
    if isinstance(res, dict):
        name, addrs = res.get("name"), res.get("addresses")
        if res.get("error"):
            parts.append(f"on {name}, the hostname `{name}` does not resolve ({str(res['error'])[:80]})")
        elif isinstance(addrs, list):
            loop = " — loopback only: gloo advertises it to the other nodes" if res.get("loopback_only") else ""
            parts.append(f"on {name}, the hostname `{name}` resolves to {', '.join(map(str, addrs[:4]))}{loop}")
    ifaces = node.get("interfaces")
    if isinstance(ifaces, dict):
        usable = [f"{i} {a[0]}" for i, a in sorted(ifaces.items()) if i != "lo" and isinstance(a, list) and a]
        if usable:
            parts.append(f"its interfaces: {', '.join(usable[:6])}")
    env = env if isinstance(env, dict) else {}
    parts.append(", ".join(f"{k}={env[k]}" if env.get(k) else f"{k} is not set"
                           for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")))  # fmt: skip
    return "; ".join(parts)


def _unseen(bundle: Bundle, state_of: dict[int, RankState]) -> list[int]:
    """Ranks of the world no evidence in the bundle speaks of (a bundle of console output alone: the ranks whose
    lines it does not hold)."""
    world = bundle.section("job").get("world_size")
    if not isinstance(world, int) or not state_of or not len(state_of) < world <= len(state_of) + 100_000:
        return []
    return [r for r in range(world) if r not in state_of]


def _expected(bundle: Bundle) -> bool:
    """Whether the bundle records that evidence of ranks it lacks was expected and did not come: one node's bundle
    of a job its multi-node section says spans several nodes (the others' ranks are in their own bundles)."""
    return hosts(bundle) > 1


def _waited(time: dict[str, Any]) -> dict[int, float]:
    """rank -> the share of its time since start-up spent where it waits for its peers (the time ledger)."""
    out = {}
    for row in time["ranks"]:
        shares = row["shares"]
        running = 1.0 - shares.get("startup", 0.0)
        if running > 0.01:
            out[row["rank"]] = min(1.0, sum(shares.get(p, 0.0) for p in P.WAITING_PHASES) / running)
    return out


def _mismatch(mismatched: list[fr.Mismatch], ev: JobEvidence) -> tuple[dict[int, str], str]:
    """Each rank's call at the first collective the ranks did not agree on (the flight recorder's entries, else
    DETAIL's fingerprints or the watchdog's sizes in the console), and where."""
    for mm in mismatched[:1]:
        return {r: call for call, ranks in mm.calls.items() for r in ranks}, f"#{mm.seq} of group {mm.group_name}"
    for group_id, seq, said in ev.mismatches[:1]:
        return said, f"#{seq} of group {group_id}"
    return {}, ""


def _summary(b: Blame, rule: str, trigger: str, reason: str, peer: Optional[str] = None) -> str:
    """The verdict's sentence: how the bundle came to be, then the blame's own words; first, where another node's
    preemption came before, that this followed it."""
    text = b.summary.rstrip(".")
    text = text[:1].upper() + text[1:]
    if peer:
        own = _summary(b, rule, trigger, reason)
        return f"{peer[:1].upper()}{peer[1:]}, and what failed here followed it: {own[:1].lower()}{own[1:]}"
    if rule == "manual":
        return f"Collected on request ({trigger}): {text[:1].lower() + text[1:]}."
    if rule in ("stall", "gpu_idle"):
        return f"The job stalled: {text[:1].lower() + text[1:]}."
    if rule == "frozen":
        return f"The job stopped answering: {text[:1].lower() + text[1:]}."
    return text + "."
