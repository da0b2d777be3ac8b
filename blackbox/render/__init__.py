"""Renderers: each takes the report model and a sink. No analysis here. Bundles are untrusted: every renderer
shows bundle text as text (never as markup, HTML or an escape sequence), through `printable`."""

from __future__ import annotations

import re
from typing import Any

# C0 controls but the tab (ESC starts a terminal sequence; a newline would forge a line of the report), DEL, C1
# controls (0x9b is a one-byte CSI), line separators, and the bidirectional overrides that reorder what is shown
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# the phases of the time ledger in the order a reader scans them: own work, then waiting, then the rest
TIME_PHASES = ("data", "compute", "checkpoint", "eval", "other", "backward", "collective", "startup")


def time_rows(time: dict[str, Any], first: list[int], limit: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The ranks of the report's time section to show (the stragglers and `first`, then the lowest ranks, at most
    `limit`) and the phases any of them spent time in."""
    rows: list[dict[str, Any]] = list(time.get("ranks") or [])
    lead = {e["rank"] for e in time.get("stragglers") or []} | set(first)
    rows = sorted(rows, key=lambda r: (r["rank"] not in lead, r["rank"]))[:limit]
    rows.sort(key=lambda r: r["rank"])
    phases = [p for p in TIME_PHASES if any(r["shares"].get(p) for r in rows)]
    return rows, phases


def printable(text: object) -> str:
    """`text` with its control characters written out (`\\x1b`, `\\u202e`): visible, and inert."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        str(text))  # fmt: skip
