"""The backward room: autograd's backward runs in the `backward` phase (strided with the DataLoader's hook).
Stdlib only; imports protocol and patch_phase."""

from __future__ import annotations

from . import protocol as P
from .patch_phase import entering, is_compiling, phase_wrapper

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any

    from .seam import PatchingRecorder


def wrap_backward(rec: PatchingRecorder, torch: Any) -> None:
    """Phase `backward` while autograd's backward runs (`loss.backward()` calls `torch.autograd.backward`): under
    DDP and FSDP the gradient collectives are issued, and waited for, in there."""
    autograd: Any = getattr(torch, "autograd", None)
    fn = getattr(autograd, "backward", None)
    if fn is None or getattr(fn, "__blackbox_wrapped__", False):
        return
    autograd.backward = phase_wrapper(rec, "backward", fn, entering(rec, P.PHASE_BACKWARD), skip=is_compiling(torch))
    rec._strided.append([autograd, "backward", fn, autograd.backward, P.PHASE_BACKWARD])
