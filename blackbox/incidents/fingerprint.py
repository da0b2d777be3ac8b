"""What makes two incidents the same failure: the stable fields of a report (category, phase, exception type,
its message with numbers, addresses, paths and sizes replaced by placeholders, the top user frame without its
line number), hashed. Never times, pids, hosts, ranks or run ids. The top frame's file named from the job's work
tree only tells two projects apart (`store.differ`). Imports the stdlib and the report model."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..analyze.model import Report

FINGERPRINT_VERSION = 1  # bump when the recipe changes: old fingerprints then no longer match new ones

_RULES = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:~|\.{1,2})?(?:/[\w.\-+@%=]+){2,}/?|(?<![\w/])/[\w.\-]+\.\w+"), "<path>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s*(?:[KMGTP]i?B|bytes?|[kMG]B)\b", re.IGNORECASE), "<size>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
)


def normalise(message: str) -> str:
    """`CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 …` -> `… Tried to allocate <size>. GPU <n> …`."""
    text = " ".join(message.split())[:1000]
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text


def frame_key(frame: Optional[str]) -> Optional[str]:
    """`__getitem__ (train.py:46)` -> `__getitem__ (train.py)`: the code moves between commits, the function
    does not."""
    if not frame:
        return None
    return re.sub(r":\d+\)", ")", frame)


@dataclass(frozen=True)
class Signature:
    category: str
    phase: Optional[str]
    exception_type: Optional[str]
    message: Optional[str]  # normalised
    top_frame: Optional[str]  # without line number
    # its file from the job's git work tree (`scripts/train.py`), where known: never hashed (fingerprints stay those
    # of earlier versions, and of bundles from outside a work tree), only compared (`store.differ`)
    top_path: Optional[str] = field(default=None, compare=False)

    def fingerprint(self) -> str:
        fields = asdict(self)
        del fields["top_path"]
        data = json.dumps({"v": FINGERPRINT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:20]


def names_a_cause(top_frame: Optional[str], exception_type: Optional[str], message: Optional[str]) -> bool:
    """Whether a signature says what failed: an exception, or the culprit's frame. Two reports that say neither (a
    launcher's bad option and a stack that could not be taken) are not the same failure: nothing is known of either,
    so neither is "seen before"."""
    return bool(top_frame or exception_type or message)


def top_frame(report: Report) -> tuple[Optional[str], Optional[str]]:
    """The frame that says where, and its file from the job's work tree: the exception's innermost user frame, else
    the first suspect's main-thread frame (a hang), else the frame most ranks share."""
    if report.exception and report.exception.get("frame"):
        path = report.exception.get("path")
        return str(report.exception["frame"]), str(path) if path else None
    rows = {r.rank: r for r in report.ranks}
    for rank in report.verdict.suspect_ranks:
        row = rows.get(rank)
        if row is not None and row.top_frame:
            return row.top_frame, row.top_path
    frames = [r.top_frame for r in report.ranks if r.top_frame]
    if not frames:
        return None, None
    common = max(set(frames), key=frames.count)
    return common, next((r.top_path for r in report.ranks if r.top_frame == common and r.top_path), None)


def signature(report: Report) -> Signature:
    exc = report.exception or {}
    kind = str(exc["type"]).rsplit(".", 1)[-1] if exc.get("type") else None
    frame, path = top_frame(report)
    message = str(exc.get("message") or "")
    if kind and message.startswith(kind + ": "):
        message = message[len(kind) + 2 :]
    return Signature(
        category=report.verdict.category,
        phase=report.verdict.phase,
        exception_type=kind,
        message=normalise(message) if message else None,
        top_frame=frame_key(frame),
        top_path=path,
    )
