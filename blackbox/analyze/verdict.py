"""From a bundle to a verdict: category, phase, suspect ranks, evidence marked observed or inferred, and
next actions. Pure: reads the Bundle object only. Imports the stdlib and blackbox's model and reader."""

from __future__ import annotations

from typing import Any, Optional

from ..adapters import stacks
from ..bundle.reader import Bundle
from .model import Finding, RankRow, Report, Verdict

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


def _rows(bundle: Bundle, node: str) -> list[RankRow]:
    rows = []
    for name in sorted(bundle.files):
        if not (name.startswith("ranks/") and name.endswith("/heartbeat.json")):
            continue
        hb = bundle.json(name)
        if not isinstance(hb, dict):
            continue
        try:
            rows.append(
                RankRow(
                    rank=int(hb["rank"]), node=node, pid=int(hb["pid"]), state=str(hb.get("state", "unknown")),
                    step=int(hb.get("step", 0)), phase=str(hb.get("phase", "unknown")),
                    top_frame=_top_frame(bundle, int(hb["rank"])),
                    idle_s=_float(hb.get("idle_s")), alive=bool(hb.get("alive")),
                    collective=str(hb.get("collective")) if hb.get("phase") == "collective" else None,
                )
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(rows, key=lambda r: r.rank)


def _top_frame(bundle: Bundle, rank: int) -> Optional[str]:
    thread, _ = main_stack(bundle, rank)
    frame = thread.top_user_frame() if thread is not None else None
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


def analyze(bundle: Bundle) -> Report:
    m = bundle.manifest
    node = str(m.get("node", "unknown"))
    trigger = str(m.get("trigger", "unknown"))
    rows = _rows(bundle, node)
    by_rank = {r.rank: r for r in rows}
    detection = bundle.json("detection.json")
    detection = detection if isinstance(detection, dict) else {}
    suspects = _int_list(detection.get("suspects"))
    reason = str(detection.get("reason", ""))
    findings: list[Finding] = []
    for row in rows:
        where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
        idle = f", no progress for {row.idle_s:.0f} s" if row.idle_s is not None else ""
        life = "" if row.alive else f", process gone ({row.state})"
        findings.append(Finding("observed", f"rank {row.rank} (pid {row.pid}) at step {row.step}, {where}{idle}{life}",
                                f"ranks/{row.rank}/heartbeat.json"))  # fmt: skip
        thread, source = main_stack(bundle, row.rank)
        if thread is not None and row.top_frame:
            findings.append(Finding("observed", f"rank {row.rank}'s main thread is in {row.top_frame}", source))

    phase = by_rank[suspects[0]].phase if suspects and suspects[0] in by_rank else None
    dead = [r for r in rows if not r.alive and r.state not in ("exited",)]
    if trigger == "stall" or detection.get("rule") == "stall":
        if any(r.rank in suspects for r in dead):
            category = "crash.signal"
        else:
            category = _HANG_BY_PHASE.get(phase or "", "hang.unknown")
        confidence = "medium" if suspects and len(suspects) < len(rows) else "low"
        summary = f"The job stalled: {reason}." if reason else "The job stalled."
    elif trigger in ("rank-death", "exit") or detection.get("rule") == "rank_death":
        exc = [r for r in rows if r.state == "exception"]
        category = "crash.exception" if exc else "crash.signal"
        if not suspects:
            suspects = [r.rank for r in (exc or dead)]
        confidence = "medium" if suspects else "low"
        summary = f"Rank(s) {', '.join(map(str, suspects)) or '?'} ended abnormally" + (
            f": {reason}." if reason else "."
        )
    elif trigger == "frozen":
        category, confidence = _HANG_BY_PHASE.get(phase or "", "hang.unknown"), "low"
        summary = f"A rank stopped answering: {reason}." if reason else "A rank stopped answering."
    else:
        category, confidence = "ok", "low"
        summary = f"Collected on request ({trigger}); no rule had fired."
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
