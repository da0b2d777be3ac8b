"""What each rank's evidence is, at a glance: which of stack, position in the collectives, memory and last words
the bundle holds for it, and why any is missing; and, for a rank with no flight-recorder trace, what its own ring
says it last did. Pure: reads the Bundle only (untrusted). Imports the stdlib, the protocol, the bundle layout
and reader, the flight-recorder adapter's file names and the report's model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import flight_recorder as fr
from ..bundle import layout as L
from ..bundle.reader import Bundle, integer, number
from .model import Finding

LISTED = 8  # ranks with something missing named one by one; the others counted
WHY = {  # collection.unanswered, as the collector wrote it
    "stopped": "stopped: it could not answer",
    "frozen": "its liveness thread did not run (the GIL held, or stuck): it could not answer",
    "no answer": "it did not answer in time",
    "ended": "it ended before answering",
    "not asked": "the dump request could not be written",
}


@dataclass(frozen=True)
class RankEvidence:
    rank: int
    stack: list[str]  # where its stack comes from: py-spy, faulthandler, its own dump
    position: list[str]  # where its place in the collectives comes from: flight recorder, its ring
    memory: bool  # a CUDA memory snapshot
    last_words: list[str]  # what it left on its own: a fatal signal's dump, SIGTERM's, an exception
    why: Optional[str]  # why it wrote no dump of its own, when it did not

    @property
    def complete(self) -> bool:
        """A stack and a position: what a reader needs to say where the rank is."""
        return bool(self.stack and self.position)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "complete": self.complete}


def per_rank(bundle: Bundle, ranks: list[int]) -> list[RankEvidence]:
    traces = {fr.rank_of(name) for name in bundle.files if L.is_flight_recorder_dump(name)}
    unanswered = bundle.section("collection").get("unanswered")
    unanswered = unanswered if isinstance(unanswered, dict) else {}
    out = []
    for rank in ranks:
        why = unanswered.get(str(rank))
        out.append(_one(bundle, rank, rank in traces, WHY.get(why) if isinstance(why, str) else _ended(bundle, rank)))
    return out


def _ended(bundle: Bundle, rank: int) -> Optional[str]:
    """'it had ended (exited with code 1)' for a rank no longer alive when the bundle was made."""
    hb = bundle.json(L.rank_member(rank, L.HEARTBEAT))
    if not isinstance(hb, dict) or hb.get("alive") is not False:
        return None
    status = hb.get("exit_status")
    return "it had ended" + (f" ({str(status)[:80]})" if isinstance(status, str) and status else "")


def _one(bundle: Bundle, rank: int, traced: bool, why: Optional[str]) -> RankEvidence:
    """One rank's evidence: its members (written by the collector, or copied from its own directory)."""
    names = set(bundle.rank_files(rank))

    def has(name: str) -> bool:  # a non-empty member, or one of a numbered kind ("stacks-%d.txt")
        prefix = L.rank_member(rank, name.partition("%d")[0])
        return any(n.startswith(prefix) and bundle.files[n] for n in names)

    stack = [label for label, name in (("py-spy", L.PYSPY + ".json"), ("faulthandler", P.RANK_STACKS),
                                       ("its own dump", P.RANK_PYDUMP)) if has(name)]  # fmt: skip
    position = ["flight recorder"] if traced or has(P.RANK_FR_JSON) else []
    if any(e.get("phase") == "collective" for e in _ring(bundle, rank)):  # it says which collective it was at
        position.append("its ring")
    last = [label for label, name in (("fatal signal", P.RANK_FATAL), ("SIGTERM", P.RANK_SIGTERM),
                                      ("exception", P.RANK_EXCEPTIONS)) if has(name)]  # fmt: skip
    return RankEvidence(rank, stack, position, has(P.RANK_MEMORY_SNAPSHOT), last, why)


def _ring(bundle: Bundle, rank: int) -> list[dict[str, Any]]:
    hb = bundle.json(L.rank_member(rank, L.HEARTBEAT))
    ring = hb.get("ring") if isinstance(hb, dict) else None
    return [e for e in ring if isinstance(e, dict)] if isinstance(ring, list) else []


def findings(bundle: Bundle, evidence: list[RankEvidence], suspects: list[int]) -> list[Finding]:
    """One line for the whole world, one for each rank (up to LISTED) with something missing, and the ring's last
    edges for a suspect with no flight-recorder trace."""
    if not evidence:
        return []
    lacking = [e for e in evidence if not e.complete]
    out = [Finding("observed", f"evidence: {len(evidence) - len(lacking)}/{len(evidence)} rank(s) with a stack and "
                   "their place in the collectives", "manifest.json: collection.unanswered, ranks/*")]  # fmt: skip
    for e in lacking[:LISTED]:
        out.append(Finding("observed", f"rank {e.rank}'s evidence: {describe(e)}", L.rank_member(e.rank, "")))
    if len(lacking) > LISTED:
        out.append(Finding("observed", f"{len(lacking) - LISTED} more rank(s) lack a stack or a place in the "
                           "collectives", "ranks/*"))  # fmt: skip
    for e in evidence:
        if e.rank in suspects and "flight recorder" not in e.position and "its ring" in e.position:
            line = last_edges(_ring(bundle, e.rank))
            if line:
                out.append(Finding("observed", f"rank {e.rank}'s own record (its ring): {line}",
                                   L.rank_member(e.rank, L.HEARTBEAT)))  # fmt: skip
    return out


def describe(e: RankEvidence) -> str:
    """'stack from py-spy; no place in the collectives (stopped: it could not answer); last words: SIGTERM'."""
    parts = [f"stack from {' and '.join(e.stack)}" if e.stack else "no stack",
             f"place in the collectives from {' and '.join(e.position)}" if e.position
             else "no place in the collectives"]  # fmt: skip
    if e.memory:
        parts.append("a memory snapshot")
    if e.last_words:
        parts.append(f"last words: {', '.join(e.last_words)}")
    return "; ".join(parts) + (f" ({e.why})" if e.why else "")


def last_edges(ring: list[dict[str, Any]]) -> str:
    """What the ring's newest edges say: the last collective entered and whether it was left, and the phase it
    is in since when: 'last entered all_reduce #812 at 12:03:01 UTC, never left; in phase collective since …'."""
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
    now = entries[-1]
    step = integer(now.get("step"))
    at_step = f", at step {step}" if step is not None else ""
    out.append(f"in phase {str(now.get('phase'))[:40]} since {_clock(now)}{at_step}")
    return "; ".join(out)


def _clock(entry: dict[str, Any]) -> str:
    wall = number(entry.get("start_wall")) or 0.0
    try:
        return time.strftime("%H:%M:%S UTC", time.gmtime(wall))
    except (OverflowError, OSError, ValueError):
        return "?"
