"""From a bundle to a verdict: category, phase, suspect ranks, evidence marked observed or inferred, and
next actions. Pure: reads the Bundle object only. Imports the stdlib and blackbox's model and reader."""

from __future__ import annotations

import json
from typing import Any, Optional

from ..adapters import stacks
from ..bundle.reader import Bundle
from .model import Finding, RankRow, Report, Verdict
from .stackgroups import RankStack, group, rank_stack

_HANG_BY_PHASE = {
    "data": "hang.data_loading",
    "checkpoint": "hang.checkpoint_io",
    "collective": "hang.collective",
    "compute": "hang.compute",
    "eval": "hang.compute",
    "startup": "hang.unknown",
}
CONSOLE_LINES = 15


def _newest(bundle: Bundle, rank: int, prefix: str, suffix: str) -> Optional[str]:
    """The bundle member ranks/<rank>/<prefix><n><suffix> with the highest n."""
    best: tuple[int, str] | None = None
    head = f"ranks/{rank}/{prefix}"
    for name in bundle.files:
        if name.startswith(head) and name.endswith(suffix) and name[len(head) : len(name) - len(suffix)].isdigit():
            n = int(name[len(head) : len(name) - len(suffix)])
            if best is None or n > best[0]:
                best = (n, name)
    return best[1] if best else None


def main_stack(bundle: Bundle, rank: int) -> tuple[Optional[stacks.ThreadStack], Optional[str]]:
    """The rank's main thread from its newest dump: the recorder's JSON dump, else faulthandler's."""
    name = _newest(bundle, rank, "pydump-", ".json")
    if name is not None:
        thread = stacks.main_thread(stacks.from_pydump(bundle.json(name)))
        if thread is not None:
            return thread, name
    names = bundle.json(f"ranks/{rank}/threads.json")
    for candidate in (_newest(bundle, rank, "stacks-", ".txt"), f"ranks/{rank}/sigterm.txt"):
        if candidate is None or candidate not in bundle.files:
            continue
        dumps = stacks.parse_faulthandler(bundle.text(candidate), names if isinstance(names, dict) else None)
        if dumps:
            thread = stacks.main_thread(dumps[-1])
            if thread is not None:
                return thread, candidate
    return None, None


def _rows(bundle: Bundle, node: str, rank_stacks: dict[int, RankStack]) -> list[RankRow]:
    """One row per rank: from its heartbeat where the recorder ran, else from the manifest and its stacks."""
    rows: dict[int, RankRow] = {}
    for name in sorted(bundle.files):
        if not (name.startswith("ranks/") and name.endswith("/heartbeat.json")):
            continue
        hb = bundle.json(name)
        if not isinstance(hb, dict):
            continue
        try:
            rank = int(hb["rank"])
            rows[rank] = RankRow(
                rank=rank, node=node, pid=int(hb["pid"]), state=str(hb.get("state", "unknown")),
                step=int(hb.get("step", 0)), phase=str(hb.get("phase", "unknown")),
                top_frame=_top_frame(rank_stacks.get(rank)),
                idle_s=_float(hb.get("idle_s")), alive=bool(hb.get("alive")),
                collective=str(hb.get("collective")) if hb.get("phase") == "collective" else None,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue
    job = bundle.manifest.get("job")
    for entry in job.get("local_ranks", []) if isinstance(job, dict) else []:
        try:
            rank, pid = int(entry["rank"]), int(entry["pid"])
        except (KeyError, TypeError, ValueError):
            continue
        if rank in rows:
            continue
        rs = rank_stacks.get(rank)
        rows[rank] = RankRow(rank=rank, node=node, pid=pid, state="running" if entry.get("alive") else "gone",
                             step=None, phase=rs.waits_in if rs else "unknown", top_frame=_top_frame(rs),
                             alive=bool(entry.get("alive")))  # fmt: skip
    return [rows[r] for r in sorted(rows)]


def _top_frame(rs: Optional[RankStack]) -> Optional[str]:
    frame = rs.thread.top_user_frame() if rs is not None else None
    return frame.describe() if frame is not None else None


def _float(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _rank_ids(bundle: Bundle) -> list[int]:
    ids = set()
    for name in bundle.files:
        parts = name.split("/")
        if len(parts) >= 3 and parts[0] == "ranks" and parts[1].isdigit():
            ids.add(int(parts[1]))
    return sorted(ids)


def _exceptions(bundle: Bundle, ranks: list[int]) -> list[dict[str, Any]]:
    """Uncaught main-thread exceptions of every rank, earliest first (the recorder's exceptions.jsonl)."""
    out = []
    for rank in ranks:
        for line in bundle.text(f"ranks/{rank}/exceptions.jsonl").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            main = isinstance(rec, dict) and rec.get("thread") == "MainThread"
            if main and isinstance(rec.get("time"), (int, float)):
                out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: r["time"])


_COMM_TIMEOUT = ("Timed out waiting", "Watchdog caught collective operation timeout", "DistBackendError",
                 "timed out", "Timeout")  # fmt: skip
_CONSOLE_CATEGORY = {
    "console-comm-timeout": "crash.comm_timeout", "console-oom": "crash.oom", "console-cuda-error": "crash.cuda_error",
    "console-segfault": "crash.signal",
}  # fmt: skip


_CRASH_SUMMARY = {
    "crash.comm_timeout": "A collective timed out", "crash.oom": "A rank ran out of memory",
    "crash.cuda_error": "A CUDA or NCCL error", "crash.signal": "A rank crashed with a fatal signal",
}  # fmt: skip


def _not_in_collective(rows: list[RankRow], rank_stacks: dict[int, RankStack]) -> list[int]:
    """Ranks that are not waiting in a collective (by heartbeat phase, else by stack) while others are."""
    waiting: list[int] = []
    elsewhere: list[int] = []
    for r in rows:
        rs = rank_stacks.get(r.rank)
        in_coll = r.phase == "collective" or (rs is not None and rs.waits_in == "collective")
        (waiting if in_coll else elsewhere).append(r.rank)
    return elsewhere if waiting and elsewhere else []


def analyze(bundle: Bundle) -> Report:
    m = bundle.manifest
    node = str(m.get("node", "unknown"))
    trigger = str(m.get("trigger", "unknown"))
    rank_stacks = {rs.rank: rs for rs in (rank_stack(bundle, r) for r in _rank_ids(bundle)) if rs is not None}
    rows = _rows(bundle, node, rank_stacks)
    by_rank = {r.rank: r for r in rows}
    groups = group(list(rank_stacks.values()))
    detection = bundle.json("detection.json")
    detection = detection if isinstance(detection, dict) else {}
    rule = str(detection.get("rule") or trigger.replace("-", "_"))
    suspects = _int_list(detection.get("suspects"))
    reason = str(detection.get("reason", ""))
    findings: list[Finding] = []
    for row in rows:
        where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
        idle = f", no progress for {row.idle_s:.0f} s" if row.idle_s is not None else ""
        life = "" if row.alive else f", process gone ({row.state})"
        step = f" at step {row.step}" if row.step is not None else ""
        source = f"ranks/{row.rank}/heartbeat.json" if row.step is not None else "manifest.json"
        findings.append(Finding("observed", f"rank {row.rank} (pid {row.pid}){step}, {where}{idle}{life}", source))
        rs = rank_stacks.get(row.rank)
        if rs is not None and row.top_frame:
            findings.append(Finding("observed", f"rank {row.rank}'s main thread is in {row.top_frame}", rs.source))
            for pid, worker in rs.workers:
                top = worker.top_user_frame()
                if top is not None:
                    text = f"rank {row.rank}'s DataLoader worker {pid} is in {top.describe()}"
                    findings.append(Finding("observed", text, f"ranks/{row.rank}/py-spy-worker-{pid}.json"))
    raised = _exceptions(bundle, list(by_rank) or _rank_ids(bundle))
    for exc in raised[:3]:
        text = f"rank {exc['rank']} raised {exc.get('type')}: {str(exc.get('message'))[:300]}"
        findings.append(Finding("observed", text, f"ranks/{exc['rank']}/exceptions.jsonl"))

    def phase_of(rank: int) -> Optional[str]:
        row = by_rank.get(rank)
        if row is None:
            return None
        rs = rank_stacks.get(rank)
        if row.phase in ("compute", "unknown", "startup") and rs is not None and rs.waits_in != "compute":
            return rs.waits_in  # the stack knows better (a C++-side wait, a worker's queue)
        return row.phase

    dead = [r for r in rows if not r.alive and r.state not in ("exited",)]
    confidence = "low"
    first = raised[0] if raised else None
    comm_timeout = first is not None and any(t in f"{first.get('type')} {first.get('message')}" for t in _COMM_TIMEOUT)
    if rule in ("stall", "frozen"):
        phase = phase_of(suspects[0]) if suspects else None
        category = (
            "crash.signal" if any(r.rank in suspects for r in dead) else _HANG_BY_PHASE.get(phase or "", "hang.unknown")
        )
        confidence = "medium" if suspects and len(suspects) < len(rows) else "low"
        what = "stalled" if rule == "stall" else "stopped answering"
        summary = f"The job {what}: {reason}." if reason else f"The job {what}."
    elif trigger in _CONSOLE_CATEGORY or (rule in ("exception", "rank_death", "exit", "console") and comm_timeout):
        category = _CONSOLE_CATEGORY.get(trigger, "crash.comm_timeout")
        if category == "crash.comm_timeout":
            # The rank that raised first is the victim: the suspect is the one that never arrived.
            suspects = _not_in_collective(rows, rank_stacks) or suspects
            confidence = "medium" if suspects else "low"
        elif first is not None:
            suspects = [first["rank"]]
            confidence = "medium"
        phase = phase_of(suspects[0]) if suspects else None
        summary = _CRASH_SUMMARY[category] + (f"; suspect rank(s) {', '.join(map(str, suspects))}." if suspects
                                              else ".")  # fmt: skip
    elif rule in ("exception", "rank_death", "exit", "console") or dead or raised:
        if first is not None:
            oom = "OutOfMemoryError" in str(first.get("type")) or "out of memory" in str(first.get("message"))
            category = "crash.oom" if oom else "crash.exception"
            suspects = [first["rank"]]
            confidence = "high" if rule == "exception" or len(raised) == 1 else "medium"
            summary = f"Rank {first['rank']} raised {first.get('type')} first: {str(first.get('message'))[:200]}"
        else:
            category = "crash.signal"
            suspects = suspects or [r.rank for r in dead]
            confidence = "medium" if suspects else "low"
            summary = f"Rank(s) {', '.join(map(str, suspects)) or '?'} ended abnormally" + (
                f": {reason}." if reason else ".")  # fmt: skip
        phase = phase_of(suspects[0]) if suspects else None
    else:
        # Collected on request: no rule fired. The stacks say who holds the others up, if anyone does.
        elsewhere = _not_in_collective(rows, rank_stacks)
        if elsewhere:
            suspects = elsewhere
            phase = phase_of(elsewhere[0])
            category = _HANG_BY_PHASE.get(phase or "", "hang.unknown")
            waiting = [r.rank for r in rows if r.rank not in elsewhere]
            summary = (f"Collected on request ({trigger}): rank(s) {', '.join(map(str, waiting))} wait in a collective "
                       f"while rank(s) {', '.join(map(str, elsewhere))} are elsewhere ({phase}); if the job is stuck, "
                       "they are holding it up.")  # fmt: skip
            findings.append(Finding("inferred", f"rank(s) {', '.join(map(str, elsewhere))} hold the others up: "
                                    "they are the only ones not waiting in a collective", "stack groups"))  # fmt: skip
        else:
            category, phase = "ok", None
            summary = f"Collected on request ({trigger}); no rule had fired and no rank stands out."
    if reason:
        findings.append(Finding("inferred", f"suspects: {reason}", "detection.json: the supervisor's blame rule"))
    # the suspects' facts first: they are the ones a reader needs
    findings.sort(key=lambda f: not any(f.text.startswith(f"rank {r} ") or f.text.startswith(f"rank {r}'")
                                        for r in suspects))  # fmt: skip
    verdict = Verdict(category, phase, suspects, confidence, summary)
    console = bundle.text("console-tail.log")
    _, marker, body = console.partition("\n# ---\n")  # after console.log's header, when the tail still has it
    tail = [line for line in (body if marker else console).splitlines() if line.strip()][-CONSOLE_LINES:]
    return Report(
        run_id=str(m.get("run_id", "unknown")), node=node, trigger=trigger, bundle=bundle.path, verdict=verdict,
        ranks=rows, findings=findings, next_actions=_next_actions(verdict, by_rank, node), console_tail=tail,
        stack_groups=[{"ranks": g.ranks, "waits_in": g.waits_in, "signature": g.signature, "frames": g.frames,
                       "odd": g.odd, "sources": g.sources, "describe": g.describe()} for g in groups],
    )  # fmt: skip


def _next_actions(verdict: Verdict, by_rank: dict[int, RankRow], node: str) -> list[str]:
    pids = [str(by_rank[r].pid) for r in verdict.suspect_ranks if r in by_rank and by_rank[r].alive]
    ranks = ", ".join(map(str, verdict.suspect_ranks)) or "?"
    actions = []
    if verdict.category.startswith("hang."):
        if pids:
            actions.append(f"While it hangs, look at rank {ranks}'s stack on {node}: py-spy dump --native --pid "
                           + " --pid ".join(pids))  # fmt: skip
        actions.append(
            f"Rerun with `blackbox run --on-stall keep` to keep the job alive for a debugger on rank {ranks}."
        )
        hints = {
            "hang.data_loading": "Check the dataset shard rank {r} reads and the DataLoader's num_workers/timeout.",
            "hang.checkpoint_io": "Check the checkpoint path rank {r} writes to: free disk, the filesystem's health.",
            "hang.compute": "Find the loop or native call rank {r} is in: its stack, and what differs on that rank.",
            "hang.collective": "Compare the collectives each rank issued: one rank called a different one or none.",
        }
        if verdict.category in hints:
            actions.insert(0, hints[verdict.category].format(r=ranks))
    elif verdict.category.startswith("crash."):
        actions.append(f"Read rank {ranks}'s error in the console tail and its torchelastic error file.")
        if verdict.category == "crash.signal":
            actions.append(f"Check the kernel log on {node} for the OOM killer or a segfault: dmesg -T | tail -50")
    else:
        actions.append("Compare steps and phases across ranks; the slowest rank is the first to look at.")
    return actions
