"""What a bundle holds for each rank, at a glance: which of stack, position in the collectives, memory and last words,
and why any is missing. The collector writes it into the manifest as it closes a bundle; the report reads it again
from the members (the manifest is not trusted). Pure: reads a Bundle. Imports the stdlib, the protocol, the bundle
layout, reader and writer, and the flight-recorder adapter's file names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import flight_recorder as fr
from . import layout as L
from .reader import Bundle, expand_rank_table, integer, number, parse_json
from .writer import BundleWriter

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
    stack: list[str]  # where its stack comes from: py-spy, faulthandler, its own dump — or, for a rank that died
    # before it could be read, faulthandler at its SIGTERM or fatal signal, or the traceback of the exception it raised
    position: list[str]  # where its place in the collectives comes from: flight recorder, its ring, its join state
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
                                       ("its own dump", P.RANK_PYDUMP), ("faulthandler at SIGTERM", P.RANK_SIGTERM),
                                       ("faulthandler at its fatal signal", P.RANK_FATAL)) if has(name)]  # fmt: skip
    if _raised(bundle, rank):
        stack.append("its traceback")
    position = ["flight recorder"] if traced or has(P.RANK_FR_JSON) else []
    entries = ring(bundle, rank)
    # it says which collective it was at, its own (a Python collective) or torch's count (DDP's, FSDP's, from C++)
    if any(e.get("phase") == "collective" or integer(e.get("issued")) for e in entries):
        position.append("its ring")
    elif _before_any(bundle.json(L.rank_member(rank, L.HEARTBEAT))):
        position.append("its join state (no collective yet)")
    last = [label for label, name in (("fatal signal", P.RANK_FATAL), ("SIGTERM", P.RANK_SIGTERM),
                                      ("exception", P.RANK_EXCEPTIONS)) if has(name)]  # fmt: skip
    return RankEvidence(rank, stack, position, has(P.RANK_MEMORY_SNAPSHOT), last, why)


def _raised(bundle: Bundle, rank: int) -> bool:
    """Whether the rank's main thread raised an exception its record holds the traceback of: where the rank stood
    when it failed, whether or not it lived to be read."""
    return any(record.get("traceback") for record in exception_records(bundle, rank))


def exception_records(bundle: Bundle, rank: int) -> list[dict[str, Any]]:
    """The rank's uncaught main-thread exceptions (the recorder's exceptions.jsonl), earliest first."""
    out = []
    for line in bundle.text(L.rank_member(rank, P.RANK_EXCEPTIONS)).splitlines():
        try:
            rec = parse_json(line.encode())
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("thread") == "MainThread" and number(rec.get("time")) is not None:
            out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: float(r["time"]))


def _before_any(hb: Any) -> bool:
    """A rank that has not joined its process group (it waits in init_process_group, or has not called it yet), as
    its page says: before any collective, a place in them. A page before layout 5 may leave the join word empty
    where the rank has joined: only 'joining' is trusted there."""
    if not isinstance(hb, dict):
        return False
    version = integer(hb.get("version"))
    return hb.get("join") == "joining" or (hb.get("join") == "" and version is not None and version >= 5)


def ring(bundle: Bundle, rank: int) -> list[dict[str, Any]]:
    hb = bundle.json(L.rank_member(rank, L.HEARTBEAT))
    ring = hb.get("ring") if isinstance(hb, dict) else None
    return [e for e in ring if isinstance(e, dict)] if isinstance(ring, list) else []


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


def of_writer(w: BundleWriter, ranks: list[int], unanswered: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each rank's evidence as the bundle being written holds it, for the manifest's `collection.evidence`:
    rank -> RankEvidence.to_json(), read as a reader of the bundle will read it."""
    files = dict(w.entries)
    table = w.rank_table()
    if table is not None:
        files[L.RANK_TABLE] = table
    skipped: list[str] = []
    expand_rank_table(files, skipped)
    view = Bundle("", {"collection": {"unanswered": unanswered}}, files, skipped)
    return {str(e.rank): e.to_json() for e in per_rank(view, ranks)}
