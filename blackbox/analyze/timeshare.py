"""Where the time went: each rank's share of its time in each phase over the run (the heartbeat's time ledger, as the
collection read it), the straggler episodes the supervisor named (the bundle's events), and the share of all ranks'
time spent waiting for data — the first question after "is it hung?". Pure; imports the stdlib, the rank protocol,
the bundle layout and reader."""

from __future__ import annotations

import json
from typing import Any, Optional

from .._recorder import protocol as P
from ..bundle import layout as L
from ..bundle.reader import Bundle, number
from ..detections import straggler_episodes as episodes_of


def rank_shares(hb: Any) -> Optional[tuple[float, dict[str, float]]]:
    """(seconds in all, phase -> fraction) from one heartbeat record: its ledger, and the current phase's time since
    it began (`phase_age_s`); None without a ledger (a recorder of layout version 1, or none)."""
    if not isinstance(hb, dict) or not isinstance(hb.get("ledger"), list) or len(hb["ledger"]) != len(P.LEDGER_PHASES):
        return None
    words = [v if type(v) is float and 0 <= v < 1e12 else max(0.0, number(v) or 0.0) for v in hb["ledger"]]
    spent = P.time_spent(words, str(hb.get("phase")), number(hb.get("phase_age_s")) or 0.0)
    total = sum(spent.values())
    if total <= 0:
        return None
    return total, {p: round(v / total, 4) for p, v in spent.items() if v > 0}


def straggler_episodes(bundle: Bundle) -> list[dict[str, Any]]:
    """The supervisor's straggler episodes in the bundle's events (detections.straggler_episodes)."""
    events = []
    for name in sorted(n for n in bundle.files if n == L.EVENTS or n.endswith("/" + L.EVENTS)):
        for line in bundle.text(name).splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return episodes_of(events)


def time_ledger(bundle: Bundle, ranks: list[int], nodes: dict[int, str]) -> dict[str, Any]:
    """The report's `time` section: {"ranks": [{rank, node, seconds, shares}], "data_share": fraction of all ranks'
    time in data (None without ledgers), "stragglers": episodes}."""
    rows = []
    data = total = 0.0
    for rank in ranks:
        got = rank_shares(bundle.json(L.rank_member(rank, L.HEARTBEAT)))
        if got is None:
            continue
        seconds, shares = got
        rows.append({"rank": rank, "node": nodes.get(rank, ""), "seconds": round(seconds, 3), "shares": shares})
        data += seconds * shares.get("data", 0.0)
        total += seconds
    return {"ranks": rows, "data_share": round(data / total, 4) if total else None,
            "stragglers": straggler_episodes(bundle)}  # fmt: skip


def findings(time: dict[str, Any], arrivals: list[Any]) -> list[tuple[str, str]]:
    """(text, source) of what the time section says, for the evidence: the straggler episodes (with the flight
    recorder's arrival order beside them, `adapters.flight_recorder.arrivals`), and the data share when it is large
    or one rank's stands out."""
    out = []
    named = {e["rank"] for e in time["stragglers"]}
    for a in sorted(arrivals, key=lambda a: -a.collectives)[:1] if named else []:
        out.append((a.describe(named) + " that every rank recorded", L.FLIGHT_RECORDER_DIR))
    for e in time["stragglers"]:
        when = "still one when the bundle was taken" if e["ended"] is None else f"until {e['ended']}"
        shares = e.get("shares") if isinstance(e.get("shares"), dict) else {}
        others = e.get("others_shares") if isinstance(e.get("others_shares"), dict) else {}
        mine, theirs = number(shares.get(e["phase"])), number(others.get(e["phase"]))
        spent = f": {mine:.0%} of each step in {e['phase']} (others {theirs:.0%})" if mine is not None and \
            theirs is not None else f" in {e['phase']}"  # fmt: skip
        factor = f", {e['factor']:g}x the others' own work" if e["factor"] is not None else ""
        out.append((f"rank {e['rank']} was a straggler from {e['started']}{spent}{factor}; {when}", L.EVENTS))
    rows = time["ranks"]
    if rows and time["data_share"] is not None:
        top = max(rows, key=lambda r: r["shares"].get("data", 0.0))
        top_share = top["shares"].get("data", 0.0)
        if time["data_share"] >= 0.1 or top_share >= 0.2:
            out.append((f"the ranks spent {time['data_share']:.0%} of their time waiting for data (rank {top['rank']}: "
                        f"{top_share:.0%})", L.rank_member("*", L.HEARTBEAT) + ": ledger"))  # fmt: skip
    return out
