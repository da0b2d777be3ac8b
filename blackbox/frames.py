"""Where a thread is, read from its frames: waiting in a collective — the user's own `dist.*` call, DDP's reducer
inside `backward()` or its buffer broadcast in `forward()`, FSDP's all-gather and reduce-scatter, functional
collectives, `Work.wait`, c10d / gloo / NCCL native frames — or in data loading, checkpoint I/O, compute, or a C
call that may be either (`ambiguous`: native frames settle it). Used by the collector (which ranks get native
frames) and the analysis. Pure; imports the stdlib and the common stack shape."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .adapters.stacks import Frame, ThreadStack

# Python functions of torch.distributed that block until the peers take part.
COLLECTIVE_FUNCS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "all_to_all",
    "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv", "wait", "batch_isend_irecv",
    "all_gather_single", "_all_gather_base", "_reduce_scatter_base", "all_gather_coalesced", "all_reduce_coalesced",
    "gather_object", "scatter_object_list", "wait_tensor", "_wait_tensor", "wait_for_unshard", "foreach_all_gather",
    "foreach_all_gather_copy_out", "foreach_reduce", "_sync_buffers", "_sync_module_buffers",
    "_distributed_broadcast_coalesced", "_sync_params_and_buffers", "_default_broadcast_coalesced",
})  # fmt: skip
# Files whose frames are collective plumbing whatever the function: FSDP2's collectives, functional collectives.
COLLECTIVE_FILES = ("_fsdp_collectives.py", "_functional_collectives.py", "_functional_collectives_impl.py")
# Native frames of a collective wait (py-spy --native): c10d's process groups and DDP's reducer, gloo, NCCL.
NATIVE_COLLECTIVE = re.compile(r"c10d::|gloo::|ProcessGroupNCCL|ProcessGroupGloo|\bnccl[A-Z]|ncclKernel|Reducer::")
# Python frames that sit on a C call which may be compute or a collective wait (DDP's reducer runs inside
# autograd's engine, so a gradient all_reduce that never completes parks the main thread here).
AMBIGUOUS_FUNCS = frozenset({"_engine_run_backward", "run_backward"})
NATIVE_FILE = re.compile(r"\.so(?:\.[\d.]+)?$|^\?\?|^0x")

KINDS = ("collective", "data", "checkpoint", "compute", "ambiguous")


@dataclass(frozen=True)
class Where:
    kind: str  # collective | data | checkpoint | compute | ambiguous
    what: str  # the frame that decided it: "all_reduce (distributed_c10d.py:2950)", "c10d::Reducer::..."
    native: bool = False  # decided by a native frame

    def describe(self) -> str:
        return f"{self.kind} ({self.what})" if self.what else self.kind


def is_native(frame: Frame) -> bool:
    file = frame.file
    if file.endswith(".py"):  # the common case, cheaply: a Python source file
        return False
    return file == "" or bool(NATIVE_FILE.search(file.rsplit("/", 1)[-1]))


def where(thread: ThreadStack) -> Where:
    """Where a thread is parked, from its frames (innermost first). A stack that ends in a C call which may be
    a collective wait (autograd's backward, no Python frame at all) is `ambiguous` unless it has native frames."""
    frames = thread.frames
    if not frames:
        return Where("ambiguous", "no Python frame: in a C call")
    has_native = any(is_native(f) for f in frames)
    for f in reversed(frames):
        if is_native(f):
            if NATIVE_COLLECTIVE.search(f.function):
                return Where("collective", f.function, native=True)
            continue
        path = f.file.replace("\\", "/")
        if "torch/distributed/checkpoint" in path or path.endswith("torch/serialization.py"):
            return Where("checkpoint", _near_user(thread, f))
        if "torch/utils/data" in path:
            return Where("data", _near_user(thread, f))
        if "torch/distributed" in path and (f.function in COLLECTIVE_FUNCS or path.endswith(COLLECTIVE_FILES)):
            return Where("collective", f.describe())
        if path.endswith("torch/nn/parallel/distributed.py") and f.function in COLLECTIVE_FUNCS:
            return Where("collective", f.describe())
        if f.function in AMBIGUOUS_FUNCS and "torch/" in path:
            if has_native:  # the native frames inside it showed no collective: autograd really computes
                return Where("compute", f.describe())
            return Where("ambiguous", f"{f.describe()}: autograd's backward, where DDP's gradient all_reduce waits")
    user = thread.top_user_frame()
    return Where("compute", user.describe() if user is not None else "")


def _near_user(thread: ThreadStack, f: Frame) -> str:
    """The innermost user frame (the user's `__getitem__`, the `torch.save` call), else the deciding frame."""
    user = thread.top_user_frame()
    return user.describe() if user is not None and not user.is_library else f.describe()
