"""What each rank's evidence is, in the report's words: one finding for the world, one for each rank that lacks a
stack or a place in the collectives (bundle.evidence), and, for a suspect with no flight-recorder trace, what its
own ring says it last did. Pure: reads the Bundle only (untrusted). Imports the stdlib, the bundle's layout, reader
and evidence, the analysis' sources and the report's model."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..bundle import layout as L
from ..bundle.evidence import RankEvidence, describe, ring
from ..bundle.reader import Bundle, integer, number
from . import sources
from .model import Finding

LISTED = 8  # ranks with something missing named one by one; the others counted


def findings(bundle: Bundle, evidence: list[RankEvidence], suspects: list[int]) -> list[Finding]:
    """One line for the whole world, one for each rank (up to LISTED) with something missing, and the ring's last
    edges for a suspect with no flight-recorder trace."""
    if not evidence:
        return []
    lacking = [e for e in evidence if not e.complete]
    out = [Finding("observed", f"evidence: {len(evidence) - len(lacking)}/{len(evidence)} rank(s) with a stack and "
                   "their place in the collectives", "manifest.json: collection.unanswered, ranks/*")]  # fmt: skip
    out += _unread(bundle)
    for e in lacking[:LISTED]:
        out.append(Finding("observed", f"rank {e.rank}'s evidence: {describe(e)}", L.rank_member(e.rank, "")))
    if len(lacking) > LISTED:
        out.append(Finding("observed", f"{len(lacking) - LISTED} more rank(s) lack a stack or a place in the "
                           "collectives", "ranks/*"))  # fmt: skip
    detected = sources.detected(bundle)
    for e in evidence:
        if e.rank in suspects and "flight recorder" not in e.position and "its ring" in e.position:
            # a detected hang's rank is read as it stood when the collection began, as its flight recorder would be
            started = sources.collection_started(bundle, e.rank) if e.rank in detected else None
            edges, later = as_of(ring(bundle, e.rank), started)
            line = last_edges(edges)
            if line and later:
                line += f"; {later} edge(s) after the collection began left out (the dump signal woke it)"
            if line:
                out.append(Finding("observed", f"rank {e.rank}'s own record (its ring): {line}",
                                   L.rank_member(e.rank, L.HEARTBEAT)))  # fmt: skip
    return out


def as_of(ring: list[dict[str, Any]], started: Optional[float]) -> tuple[list[dict[str, Any]], int]:
    """The ring's edges up to `started` (wall clock; None: all of them), and how many came later."""
    if started is None:
        return ring, 0
    kept = [e for e in ring if (number(e.get("start_wall")) or 0.0) <= started]
    return kept, len(ring) - len(kept)


def _unread(bundle: Bundle) -> list[Finding]:
    """Why py-spy took no stack, or not every one, or took them without suspending the ranks, where the collection
    says so (no ptrace in a pod, a seccomp profile, py-spy missing): the ranks' own dumps are then what is sure."""
    steps = bundle.manifest.get("steps")
    spy = [s for s in steps if isinstance(s, dict) and s.get("name") == "py-spy"] if isinstance(steps, list) else []
    out = []
    for step in spy[:1]:
        detail = str(step.get("detail"))[:400]
        if step.get("status") in ("failed", "partial"):
            taken = "not taken" if step["status"] == "failed" else "taken in part"
            out.append(Finding("observed", f"stacks from outside (py-spy) {taken}: {detail}", f"{L.MANIFEST}: steps"))
        elif "(ptrace refused)" in detail:
            out.append(Finding("observed", f"stacks from outside (py-spy) read without suspending the ranks: "
                               f"{detail}", f"{L.MANIFEST}: steps"))  # fmt: skip
    return out


def last_edges(ring: list[dict[str, Any]]) -> str:
    """What the ring's newest edges say: the last collective entered and whether it was left, the newest of its
    default group's collectives torch had counted by its last edge, and the phase it is in since when: 'last entered
    all_reduce #812 at 12:03:01 UTC, never left; had issued collective #812 of its default group by 12:03:01 UTC
    (torch's count); in phase collective since …'."""
    entries = [e for e in ring if isinstance(e, dict) and integer(e.get("n")) is not None
               and number(e.get("start_wall")) is not None]  # fmt: skip
    entries.sort(key=lambda e: integer(e.get("n")) or 0)
    if not entries:
        return ""
    collective = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].get("phase") == "collective"), None)
    out = []
    if collective is not None:
        c = entries[collective]
        left = "never left" if collective == len(entries) - 1 else f"left at {_clock(entries[collective + 1])}"
        out.append(f"last entered {str(c.get('collective'))[:40]} #{integer(c.get('seq'))} at {_clock(c)}, {left}")
    counted = _counted_since(entries, collective)
    if counted is not None:
        out.append(f"had issued collective #{integer(counted.get('issued'))} of its default group by "
                   f"{_clock(counted)} (torch's count)")  # fmt: skip
    now = entries[-1]
    step = integer(now.get("step"))
    at_step = f", at step {step}" if step is not None else ""
    out.append(f"in phase {str(now.get('phase'))[:40]} since {_clock(now)}{at_step}")
    return "; ".join(out)


def _counted_since(entries: list[dict[str, Any]], collective: Optional[int]) -> Optional[dict[str, Any]]:
    """The newest edge with torch's count of the default group's collectives, where that count says more than the
    last collective entered from Python: collectives issued from C++ (DDP's, FSDP's) since it was left, or no Python
    collective at all. None where the Python collective is the newest word (entered and not left, or nothing since)."""
    counted = next((e for e in reversed(entries) if integer(e.get("issued"))), None)
    if counted is None or collective is None:
        return counted
    if collective == len(entries) - 1:
        return None
    left = integer(entries[collective + 1].get("issued")) or 0
    return counted if (integer(counted.get("issued")) or 0) > left else None


def _clock(entry: dict[str, Any]) -> str:
    wall = number(entry.get("start_wall")) or 0.0
    try:
        return time.strftime("%H:%M:%S UTC", time.gmtime(wall))
    except (OverflowError, OSError, ValueError):
        return "?"
