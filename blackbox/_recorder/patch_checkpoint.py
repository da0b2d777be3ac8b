"""The save/load room: torch.save, torch.load and torch.distributed.checkpoint's entry points run in the
`checkpoint` phase. Stdlib only; imports protocol and patch_phase."""

from __future__ import annotations

from . import protocol as P
from .patch_phase import entering, phase_wrapper

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any

    from .seam import PatchingRecorder


def wrap_checkpoint(rec: PatchingRecorder, torch: Any) -> None:
    for name in ("save", "load"):
        fn = getattr(torch, name, None)
        if fn is not None and not getattr(fn, "__blackbox_wrapped__", False):
            setattr(torch, name, phase_wrapper(rec, "checkpoint", fn, entering(rec, P.PHASE_CHECKPOINT)))


def wrap_dcp(rec: PatchingRecorder, dcp: Any) -> None:
    """torch.distributed.checkpoint: its save and load entry points run in the `checkpoint` phase."""
    for name in ("save", "load", "async_save", "save_state_dict", "load_state_dict"):
        fn = getattr(dcp, name, None)
        if fn is not None and not getattr(fn, "__blackbox_wrapped__", False):
            setattr(dcp, name, phase_wrapper(rec, "checkpoint", fn, entering(rec, P.PHASE_CHECKPOINT)))
