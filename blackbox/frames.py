"""Where a thread is, read from its frames: waiting in a collective — the user's own `dist.*` call, DDP's reducer
and constructor, FSDP's all-gathers (and FSDP1's rate limiter), functional collectives, pipelining's p2p, process-
group set-up, Megatron's and DeepSpeed's communication, c10d / gloo / NCCL native frames — or in data loading,
checkpoint I/O, other I/O (a socket, a storage client, a memory-mapped file), compute, or a C call that may be
either (`ambiguous`: autograd's backward, a CUDA host sync — where a rank waiting on NCCL parks — settled by
native frames or the flight recorder). Used by the collector (which ranks get native frames) and the analysis.
Pure; imports the stdlib and the common stack shape."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

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
    "_broadcast_coalesced",
    # torch.distributed.pipelining's p2p
    "_wait_batch_p2p", "_batch_p2p", "_sorted_batch_p2p",
})  # fmt: skip
# Process-group creation and rendezvous: every rank must arrive (a peer that never starts, or cannot be reached).
SETUP_FUNCS = frozenset({
    "init_process_group", "_new_process_group_helper", "_store_based_barrier", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
    "_tcp_rendezvous_handler", "init_device_mesh", "_init_process_groups", "_get_or_create_default_group",
    "_init_backend", "split_group",
    # DDP's constructor checks every rank's parameter shapes and broadcasts rank 0's state: the first collective of
    # a job, where NCCL sets its communicator up (a rank that never starts, a network it cannot use, waits here)
    "_verify_param_shape_across_processes", "_sync_module_states",
})  # fmt: skip
# Files whose frames are collective plumbing whatever the function: FSDP2's collectives, functional collectives,
# DeepSpeed's and Megatron's communication layers.
COLLECTIVE_FILES = ("_fsdp_collectives.py", "_functional_collectives.py", "_functional_collectives_impl.py")
# Files of communication layers: any frame there is a collective wait (COMM_ALWAYS), or its wait-like functions and
# the CUDA syncs under them are (COMM_CONTEXT: DeepSpeed ZeRO-3's parameter fetch, Megatron's tensor parallel).
COMM_ALWAYS = ("deepspeed/comm/", "megatron/core/pipeline_parallel/p2p_communication", "megatron/p2p_communication",
               "deepspeed/runtime/pipe/p2p", "apex/transformer/pipeline_parallel/p2p_communication")  # fmt: skip
COMM_CONTEXT = ("torch/distributed/", "torch/nn/parallel/distributed.py", "megatron/core/tensor_parallel/mappings",
                "deepspeed/runtime/zero/partitioned_param_coordinator", "deepspeed/runtime/zero/partition_parameters",
                *COMM_ALWAYS)  # fmt: skip
COMM_WAIT_FUNCS = re.compile(r"^_?wait|synchroni[sz]e|^fetch_sub_module$|^_?all_gather|^__all_gather")
# DeepSpeed's functions that run its collectives, wherever they live (ZeRO-3's stage3.py before the coordinator)
DEEPSPEED_COMM = re.compile(r"fetch_sub_module|_synchronize_communication|all_?gather|all_?reduce|reduce_scatter|"
                            r"partition_grads|gradient_partition|reduce_ipg|average_tensor|_communicat")  # fmt: skip
# Python frames of a host sync with the GPU: where an NCCL waiter's host thread parks (a collective returns at once
# on NCCL; the wait shows at the next sync), and where a long kernel's does.
SYNC_FUNCS = frozenset({"synchronize", "wait", "current_stream_synchronize"})
SYNC_FILES = ("torch/cuda/__init__.py", "torch/cuda/streams.py", "torch/_utils.py", "accelerator/cuda_accelerator.py",
              "torch/accelerator/__init__.py", "torch/cuda/graphs.py")  # fmt: skip
# Native frames (py-spy --native) of a collective wait: c10d's process groups, its store, DDP's reducer, gloo, NCCL.
NATIVE_COLLECTIVE = re.compile(r"c10d::|gloo::|ProcessGroupNCCL|ProcessGroupGloo|\bnccl[A-Z]|ncclKernel|Reducer::")
# Native frames of a host sync with the GPU, and the CUDA driver's own (its symbols are stripped: the module says).
NATIVE_SYNC = re.compile(r"cuda(?:Stream|Device|Event)Synchronize|cu(?:Stream|Ctx|Event)Synchronize|"
                         r"_local_scalar_dense|cudaMemcpy(?!Async)|c10::cuda::.*[Ss]ynchronize|"
                         r"CUDAEvent::synchronize|cudaStreamWaitEvent")  # fmt: skip
DRIVER_MODULES = re.compile(r"libcuda\.so|libcudart|libnvidia|libcuda\b")
# Native frames of autograd's engine waiting for its device threads (on CUDA the backward runs there and the main
# thread waits: DDP's and FSDP's hooks, and so their collectives, run on those threads).
NATIVE_AUTOGRAD_WAIT = re.compile(r"ReadyQueue::pop|GraphTask::|Engine::execute|Engine::thread_main|"
                                  r"autograd::.*[Ww]ait")  # fmt: skip
# Native frames that say nothing about where a thread is: the C library, the C++ runtime, the interpreter itself.
NATIVE_GENERIC = re.compile(r"^(?:0x[0-9a-f]+|\?\?|_?_?GI_|__libc|__pthread|pthread_|__futex|futex|syscall|"
                            r"std::|__gthread|_Py|Py[A-Z]|method_vectorcall|cfunction|call_function|"
                            r"do_futex|__lll|clock_nanosleep|__nanosleep|epoll_wait|poll|__poll|select|"
                            r"__GI|start_thread|clone|_start|main$|__libc_start|sem_|__new_sem)")  # fmt: skip
# The interpreter's own native code and the standard library's extension modules (`lib-dynload/_socket…so`): they
# carry a call out (a read, a sleep), they say nothing of where the job is.
INTERPRETER = re.compile(r"(?:^|/)(?:lib)?python[\d.]*(?:\.so[\d.]*|[dmu]*)$|libpython|/lib-dynload/")
NATIVE_FILE = re.compile(r"\.so(?:\.[\d.]+)?$|^\?\?|^0x|\.(?:cpp|cc|cxx|cu|c|h|hpp|cuh)$")
# Python frames of autograd's backward: a C call where DDP's gradient all_reduce may wait.
AMBIGUOUS_FUNCS = frozenset({"_engine_run_backward", "run_backward"})
CHECKPOINT_PATHS = ("torch/distributed/checkpoint", "/safetensors/", "safetensors/torch.py", "checkpoint_engine",
                    "megatron/core/dist_checkpointing")  # fmt: skip
DATA_PATHS = ("torch/utils/data", "datasets/", "webdataset/", "torchdata/", "nvidia/dali", "ffcv/", "megatron/energon",
              "streaming/base/")  # fmt: skip
# A library's data package (`fairseq/data/iterators.py`, `megatron/core/datasets/`): not a user's absolute path, where
# `/data/` is often only where the code lives.
DATA_DIR = re.compile(r"(?:^|/)(?:data|datasets|dataloaders?)/")
# Python frames of I/O outside the DataLoader: sockets, HTTP and object-store clients, memory-mapped files.
IO_PATHS = ("socket.py", "ssl.py", "http/client.py", "urllib3/", "requests/", "botocore/", "boto3/", "s3transfer/",
            "fsspec/", "s3fs/", "gcsfs/", "adlfs/", "numpy/core/memmap.py", "numpy/_core/memmap.py", "h5py/",
            "pyarrow/", "selectors.py", "multiprocessing/connection.py")  # fmt: skip
# Frames that say "this is the data": the user's own loader (nanoGPT's get_batch), a dataset's item, an iterator.
DATA_WORDS = re.compile(r"batch|^__getitem__$|^__next__$|^__iter__$|data|sample|shard|token|^fetch|^load|^read_",
                        re.IGNORECASE)  # fmt: skip


@dataclass(frozen=True)
class Where:
    kind: str  # collective | data | checkpoint | io | compute | ambiguous
    what: str  # the frame that decided it: "all_reduce (distributed_c10d.py:2950)", "c10d::Reducer::..."
    native: bool = False  # decided by a native frame
    fallback: bool = False  # compute only because no frame said otherwise: the innermost user frame
    setup: bool = False  # a collective wait in process-group creation or rendezvous

    def describe(self) -> str:
        return f"{self.kind} ({self.what})" if self.what else self.kind


def is_native(frame: Frame) -> bool:
    """A C/C++ frame (py-spy --native): by its module where py-spy gave one (with debug info its file is the
    `.cpp` source), else by its file."""
    if frame.module:
        return True
    file = frame.file
    if file.endswith(".py"):  # the common case, cheaply: a Python source file
        return False
    return file == "" or bool(NATIVE_FILE.search(file.rsplit("/", 1)[-1]))


def _path(f: Frame) -> str:
    return f.file.replace("\\", "/")


def _native(f: Frame) -> Optional[Where]:
    """What one native frame decides, or None when it says nothing (the C library, the interpreter)."""
    name = f.function
    if NATIVE_COLLECTIVE.search(name):
        setup = "Store" in name or "rendezvous" in name.lower() or "connectFullMesh" in name
        return Where("collective", name, native=True, setup=setup)
    if NATIVE_SYNC.search(name) or (DRIVER_MODULES.search(f.module or f.file) and not name.startswith("at::")):
        return Where("ambiguous", f"{name}: a host sync with the GPU", native=True)
    if NATIVE_AUTOGRAD_WAIT.search(name):
        return Where("ambiguous", f"{name}: autograd's engine waits for its device threads", native=True)
    if NATIVE_GENERIC.search(name) or INTERPRETER.search(f.module or f.file) or "libc.so" in (f.module or f.file):
        return None
    return Where("compute", name, native=True)


def where(thread: ThreadStack) -> Where:
    """Where a thread is parked, from its frames (innermost first): the first frame that says so decides. A stack
    that ends in a C call which may be a collective wait (autograd's backward, a CUDA sync, no Python frame at
    all) is `ambiguous` unless its native frames settle it; one that no frame explains is `compute`, marked as a
    fallback (a user frame on top says little on a GPU, where the host thread runs ahead of the device)."""
    frames = thread.frames
    if not frames:
        return Where("ambiguous", "no Python frame: in a C call")
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        decided = _native(f) if is_native(f) else _python(thread, frames, i)
        if decided is not None:
            return decided
    user = thread.top_user_frame()
    return Where("compute", user.describe() if user is not None else "", fallback=True)


def _python(thread: ThreadStack, frames: tuple[Frame, ...], i: int) -> Optional[Where]:
    """What the Python frame `frames[i]` decides (the frames inside it, i+1.., said nothing), or None."""
    f = frames[i]
    path, fn = _path(f), f.function
    if any(p in path for p in CHECKPOINT_PATHS) or path.endswith("torch/serialization.py"):
        return Where("checkpoint", _near_user(thread, f))
    if any(p in path for p in DATA_PATHS) or (DATA_DIR.search(path) and (f.is_library or not path.startswith("/"))):
        return Where("data", _near_user(thread, f))
    if "torch/distributed" in path and fn in SETUP_FUNCS:
        return Where("collective", f"{f.describe()}: process-group set-up waits for every rank", setup=True)
    if ("torch/distributed" in path and (fn in COLLECTIVE_FUNCS or path.endswith(COLLECTIVE_FILES))) or (
            path.endswith("torch/nn/parallel/distributed.py") and fn in COLLECTIVE_FUNCS) or (
            any(p in path for p in COMM_ALWAYS)) or (
            any(p in path for p in COMM_CONTEXT[2:]) and COMM_WAIT_FUNCS.search(fn)):  # fmt: skip
        return Where("collective", f.describe())
    if fn in SYNC_FUNCS and path.endswith(SYNC_FILES):
        comm = _outer(frames, i, lambda g: any(p in _path(g) for p in COMM_CONTEXT) or (
            "deepspeed/" in _path(g) and bool(DEEPSPEED_COMM.search(g.function))))  # fmt: skip
        if comm is not None:  # FSDP1's rate limiter, Megatron's _communicate, DeepSpeed's fetch_sub_module
            return Where("collective", f"{comm.describe()} → {f.describe()}: a CUDA sync on a collective")
        return Where("ambiguous", f"{f.describe()}: a host sync with the GPU (where a rank waiting on NCCL parks)")
    if fn in AMBIGUOUS_FUNCS and "torch/" in path:
        return Where("ambiguous", f"{f.describe()}: autograd's backward, where DDP's gradient all_reduce waits")
    if any(p in path for p in IO_PATHS):
        data = _outer(frames, i, lambda g: any(p in _path(g) for p in DATA_PATHS) or (
            not g.is_library and bool(DATA_WORDS.search(g.function))))  # fmt: skip
        if data is not None:
            return Where("data", _near_user(thread, data))
        return Where("io", _near_user(thread, f))
    return None


def _outer(frames: tuple[Frame, ...], i: int, test: object) -> Optional[Frame]:
    """The innermost frame outside frames[i] (its callers) that passes `test`."""
    for j in range(i - 1, -1, -1):
        if test(frames[j]):  # type: ignore[operator]
            return frames[j]
    return None


def looks_like_data(thread: ThreadStack) -> Optional[Frame]:
    """The user frame that says a stack is reading its data (`get_batch`, `__getitem__`, `load_shard`): used when the
    kernel says the thread is blocked in a read under user code."""
    for f in reversed(thread.frames):
        if not is_native(f) and (DATA_WORDS.search(f.function) or any(p in _path(f) for p in DATA_PATHS)):
            return f
    return None


def _near_user(thread: ThreadStack, f: Frame) -> str:
    """The innermost user frame (the user's `__getitem__`, the `torch.save` call), else the deciding frame."""
    user = thread.top_user_frame()
    return user.describe() if user is not None and not user.is_library else f.describe()
