"""What the recorder sets up in torch once the job imports it: the flight recorder's environment (under the names
this torch reads) and CUDA memory history from CUDA's own initialisation. Stdlib only, Python >= 3.9; imported when
torch is, never at interpreter start."""

from __future__ import annotations

import os

from . import protocol as P

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any


def torch_version(torch: Any) -> tuple[int, int]:
    try:
        major, minor = str(torch.__version__).split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def flight_recorder_env(torch: Any) -> None:
    """Turn the flight recorder on for this process under the names this torch reads (torch >= 2.7 reads
    TORCH_FR_*, older ones TORCH_NCCL_*; setting the old ones on a new torch prints deprecation warnings).
    Done at `import torch`, before any process group exists; a value the user set wins."""
    fr_dir = os.environ.get(P.ENV_FR_DIR)
    if not fr_dir:
        return
    names = {
        "buffer": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        "file": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    }
    values = {"buffer": P.FR_ENTRIES, "file": os.path.join(fr_dir, P.FR_PREFIX)}
    new = torch_version(torch) >= (2, 7)
    for key, (new_name, old_name) in names.items():
        if os.environ.get(new_name) or os.environ.get(old_name):
            continue
        os.environ[new_name if new else old_name] = values[key]


def record_memory_history_at_cuda_init(torch: Any, max_entries: int) -> None:
    """Start CUDA memory history once CUDA is initialised (never initialise it ourselves)."""
    record = getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if record is None or lazy_call is None:
        raise RuntimeError("this torch cannot record CUDA memory history")

    def start() -> None:
        try:
            record(max_entries=max_entries)
        except TypeError:  # older signature
            record(True, max_entries=max_entries)

    lazy_call(start)
