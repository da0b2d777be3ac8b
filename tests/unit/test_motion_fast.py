"""The report's motion finding reads a waiting rank's last history sample alone: the same finding as from its whole
history, for every shape of a JSON history (moving, still, late samples, nested or odd values). One that is not
JSON yet ends in a sample is read by that sample (a corrupt history: the rank counts among those that waited)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from blackbox.analyze import motion
from blackbox.bundle import layout as L
from blackbox.bundle.reader import Bundle

END = 1_000_000.0


def sample(at: float, moved: float, step: int = 7, written: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"at": at, "moved_t": moved, "step": step, "batches": 3, "forwards": 0, "stack_changes": 0,
            "read_bytes": 0, "written_bytes": written, **extra}  # fmt: skip


HISTORIES: list[Any] = [
    [sample(END - 70, END - 70, written=0), sample(END - 1, END - 1, written=5e8)],  # rank 0: writing, no step
    [sample(END - 70, END - 300), sample(END - 2, END - 300)],  # waiting for 300 s
    [sample(END - 70, END - 90), sample(END - 2, END - 90), sample(END + 50, END + 50, step=9)],  # a late sample
    [sample(END - 5, END - 120, note='{ "at": 1 }')],  # a `{` inside a string
    [sample(END - 5, END - 150, extra={"at": END})],  # a nested table last
    [sample(END - 5, END - 5, step=7)],  # moving, one sample only
    "not a list",
    [],
]


def bundle(raw: dict[int, bytes]) -> Bundle:
    created = datetime.fromtimestamp(END, timezone.utc).isoformat()
    files = {L.rank_member(r, L.HISTORY): data for r, data in raw.items()}
    return Bundle("b", {"created": created}, files, [], {})


def test_the_last_sample_alone_says_what_the_whole_history_says(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {r: json.dumps(h).encode() for r, h in enumerate(HISTORIES)}
    fast = motion.findings(bundle(raw), list(raw))
    monkeypatch.setattr(motion, "_still", lambda *a: None)
    slow = motion.findings(bundle(raw), list(raw))
    assert fast == slow and fast and "rank 0 was working without a step" in fast[0][0], (fast, slow)
    assert "waited (still for 90 s and more)" in fast[0][0]
