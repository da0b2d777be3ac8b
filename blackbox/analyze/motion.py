"""What moved in each rank in the minute before the bundle, from the supervisor's heartbeat history (`blackbox run`
keeps it: steps, batches, forward calls, stack changes, bytes read and written, when the rank last moved): the
report's "rank 0 was writing (412 MB in the last minute) while rank 1 waited". Pure; imports the stdlib and the
bundle layout and reader (the history is untrusted: every number through `number`)."""

from __future__ import annotations

from typing import Any, Optional

from ..bundle import layout as L
from ..bundle.reader import Bundle, number, parse_json
from ..detections import human_bytes, plural_ranks

WINDOW_S = 60.0  # "in the last minute"
MOVING_S = 10.0  # a rank that moved this close to the bundle was moving then
MAX_NAMED = 4  # moving ranks described one by one; the rest counted


def _created(bundle: Bundle) -> Optional[float]:
    """When the bundle was made (its manifest's `created`), as Unix time."""
    created = bundle.manifest.get("created")
    if not isinstance(created, str):
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(created).timestamp()
    except ValueError:
        return None


FIELDS = ("at", "moved_t", "step", "batches", "forwards", "stack_changes", "read_bytes", "written_bytes")


def _fields(sample: dict[str, Any]) -> dict[str, float]:
    return {k: v for k in FIELDS if (v := number(sample.get(k))) is not None}


def _delta(first: dict[str, float], last: dict[str, float], key: str) -> float:
    return max(0.0, last.get(key, 0.0) - first.get(key, 0.0)) if key in first and key in last else 0.0


def rank_motion(history: Any, end: float) -> Optional[dict[str, Any]]:
    """One rank's last minute before `end` (Unix time): whether it was moving at the end, how long it had been still,
    and what moved over the minute (None without a history)."""
    # only the first and last samples of the window count: every other one is read for its time alone (a
    # 32,768-rank report reads ~360,000 samples)
    timed = [(at, h) for h in (history if isinstance(history, list) else [])
             if isinstance(h, dict) and (at := number(h.get("at"))) is not None and at <= end + 1.0]  # fmt: skip
    if not timed:
        return None
    last = _fields(timed[-1][1])
    first = _fields(next((h for at, h in reversed(timed) if at <= end - WINDOW_S), timed[0][1]))
    moved = last.get("moved_t")
    how = []
    for key, verb in (("written_bytes", "writing"), ("read_bytes", "reading")):
        n = _delta(first, last, key)
        if n >= 1e6:
            how.append(f"{verb} {human_bytes(n)}")
    for key, what in (("forwards", "forward calls"), ("batches", "batches"), ("stack_changes", "stack changes")):
        n = _delta(first, last, key)
        if n:
            how.append(f"{n:.0f} {what}")
    return {"moving": moved is not None and end - moved <= MOVING_S, "still_s": None if moved is None else end - moved,
            "stepped": _delta(first, last, "step") > 0, "how": how}  # fmt: skip


def _last_sample(data: Optional[bytes]) -> Optional[dict[str, Any]]:
    """The last table of a history (a list of flat tables), parsed alone; None when the bytes do not end that way
    (a `{` inside a string never starts a table JSON accepts: its quotes are escaped)."""
    body = data.rstrip() if data else b""
    if not body.endswith(b"}]"):
        return None
    try:
        value = parse_json(body[body.rfind(b"{") : -1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _still(bundle: Bundle, rank: int, end: float) -> Optional[dict[str, Any]]:
    """A rank whose last sample says it was not moving at the end, from that sample alone: all `findings` asks of
    it (moving, still_s). A stall's thousands of waiting ranks cost one small parse each, not their histories;
    None when the last sample does not settle it (the whole history is read). A history that is not JSON yet ends
    in a sample is read by that sample."""
    last = _last_sample(bundle.files.get(L.rank_member(rank, L.HISTORY)))
    at = number(last.get("at")) if last is not None else None
    if last is None or at is None or at > end + 1.0:
        return None
    moved = number(last.get("moved_t"))
    if moved is not None and end - moved <= MOVING_S:
        return None
    return {"moving": False, "still_s": None if moved is None else end - moved, "stepped": False, "how": []}


def findings(bundle: Bundle, ranks: list[int]) -> list[tuple[str, str]]:
    """(text, source): the ranks that were moving without a step when the bundle was taken, how, and who waited —
    nothing when no rank was (a stall: the per-rank lines say how long each was idle) or without a history."""
    end = _created(bundle)
    if end is None:
        return []

    def of(r: int) -> Optional[dict[str, Any]]:
        return _still(bundle, r, end) or rank_motion(bundle.json(L.rank_member(r, L.HISTORY)), end)

    motion = {r: m for r in ranks if (m := of(r)) is not None}
    working = [r for r, m in sorted(motion.items()) if m["moving"] and not m["stepped"]]
    if not working:
        return []
    parts = []
    for r in working[:MAX_NAMED]:
        how = motion[r]["how"]
        parts.append(f"rank {r} was working without a step" + (f" ({', '.join(how)} in the last minute)" if how
                                                                  else ""))  # fmt: skip
    if len(working) > MAX_NAMED:
        parts.append(f"{len(working) - MAX_NAMED} more ranks too")
    waiting = [r for r, m in sorted(motion.items()) if not m["moving"]]
    text = "; ".join(parts)
    if waiting:
        stills = [motion[r]["still_s"] for r in waiting if motion[r]["still_s"] is not None]
        text += f", while {plural_ranks(waiting)} waited" + (f" (still for {min(stills):.0f} s and more)" if stills
                                                            else "")  # fmt: skip
    return [(text, f"ranks/{working[0]}/{L.HISTORY} (the supervisor's heartbeat history)")]
