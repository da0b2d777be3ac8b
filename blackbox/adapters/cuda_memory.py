"""CUDA out-of-memory evidence: PyTorch's OOM message (requested, capacity, free, allocated, reserved) and its
memory snapshots (`torch.cuda.memory._snapshot()` pickles: read with a restricted unpickler that admits only
plain data — nothing is executed). The one module that knows those formats. Imports the stdlib,
adapters.plainpickle and adapters.stacks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .plainpickle import PlainPickleError, load_plain_dict
from .stacks import first_user_frame

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+) ?(B|KiB|MiB|GiB|TiB)"
_OOM_FIELDS = {
    "requested": rf"Tried to allocate {_SIZE}",
    "capacity": rf"total capacity of {_SIZE}",
    "free": rf"of which {_SIZE} is free",
    "in_use": rf"this process has {_SIZE} memory in use",
    "allocated": rf"{_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
}
_GPU = re.compile(r"GPU (\d+)")


class SnapshotError(Exception):
    pass


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} GiB"


@dataclass(frozen=True)
class OomMessage:
    gpu: Optional[int]
    sizes: dict[str, int]  # requested, capacity, free, in_use, allocated, reserved_unallocated (those present)

    def describe(self) -> str:
        parts = [f"{k.replace('_', ' ')} {human(v)}" for k, v in self.sizes.items()]
        return (f"GPU {self.gpu}: " if self.gpu is not None else "") + ", ".join(parts)


def parse_oom(message: str) -> Optional[OomMessage]:
    """The figures of PyTorch's CUDA OOM message, or None when the message has none of them."""
    sizes = {}
    for key, rx in _OOM_FIELDS.items():
        m = re.search(rx, message)
        if m:
            sizes[key] = _bytes(m.group(1), m.group(2))
    if not sizes:
        return None
    gpu = _GPU.search(message)
    return OomMessage(int(gpu.group(1)) if gpu else None, sizes)


def load_snapshot(data: bytes) -> dict[str, Any]:
    try:
        return load_plain_dict(data, MAX_SNAPSHOT_BYTES, "snapshot", "segments", "CUDA memory snapshot")
    except PlainPickleError as exc:
        raise SnapshotError(str(exc)) from None


@dataclass(frozen=True)
class Allocation:
    size: int
    device: Optional[int]
    frame: Optional[str]  # the innermost user frame that allocated it: "train.py:88 (forward)"


def largest_allocations(snapshot: dict[str, Any], n: int = 5) -> tuple[list[Allocation], int, int]:
    """The n largest live allocations, and the totals (bytes allocated, bytes reserved) over all segments."""
    live: list[Allocation] = []
    allocated = reserved = 0
    for seg in snapshot.get("segments") or []:
        if not isinstance(seg, dict):
            continue
        reserved += int(seg.get("total_size") or 0)
        for block in seg.get("blocks") or []:
            if isinstance(block, dict) and block.get("state") == "active_allocated":
                size = int(block.get("size") or 0)
                allocated += size
                live.append(Allocation(size, seg.get("device"), first_user_frame(block.get("frames"))))
    live.sort(key=lambda a: a.size, reverse=True)
    return live[:n], allocated, reserved


def render_command(path: str) -> str:
    return f"python -m torch.cuda._memory_viz trace_plot {path} -o memory.html"
