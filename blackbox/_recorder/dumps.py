"""What the rank writes when asked, on the recorder's liveness thread: its own dump at the supervisor's request (the
heartbeat's dump-request word: every thread's stack, the context, the DataLoader's state, the last metrics and
annotations, the flight recorder's trace, the CUDA memory snapshot), and the state files the collector reads before
anything happens (thread names, the DataLoader, versions). Stdlib only, Python >= 3.9; imports the protocol and last
words, never the recorder (it is handed in)."""

from __future__ import annotations

import os
import sys
import time

from . import protocol as P
from .lastwords import python_stacks, thread_names, write_json

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any, Optional

    from .seam import DumpingRecorder


def serve_dump_request(rec: DumpingRecorder) -> None:
    """The supervisor asks by bumping the heartbeat's dump-request word (no signal needed while the GIL
    is free): write the Python-side dump, the flight-recorder trace and the memory snapshot."""
    request = rec.hb.dump_request()
    if request <= rec.hb.dump_ack():
        return
    write_dump(rec, request)
    rec.hb.ack_dump(request)
    rec.lastwords.rotate_stack_file()


def write_dump(rec: DumpingRecorder, request: int) -> str:
    path = os.path.join(rec.rank_dir, P.RANK_PYDUMP % request)
    record: dict[str, Any] = {
        "request": request, "time": time.time(), "rank": rec.rank, "pid": rec.pid,
        "threads": python_stacks(), "context": rec.context(), "dataloader": loader_state(rec),
        "metrics": list(rec._metrics)[-32:], "annotations": dict(rec._annotations),
    }  # fmt: skip
    torch = rec.torch
    if torch is not None:
        record["initial_seed"] = _call(torch, "initial_seed")
        record["flight_recorder"] = rec.guard("flight_recorder", _dump_flight_recorder, rec, torch, request)
        record["memory_snapshot"] = rec.guard("memory_snapshot", _dump_memory_snapshot, rec, torch, request)
    write_json(path, record)
    return path


def _dump_flight_recorder(rec: DumpingRecorder, torch: Any, request: int) -> Optional[dict[str, Any]]:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    c10d = getattr(torch._C, "_distributed_c10d", None)
    recorders = [(name, getattr(c10d, name), getattr(c10d, name + "_json", None))
                 for name in _RECORDERS if getattr(c10d, name, None) is not None]  # fmt: skip
    if not recorders:
        return {"error": "this torch has no flight-recorder dump API"}
    fr_dir = os.environ.get(P.ENV_FR_DIR) or os.path.join(os.path.dirname(os.path.dirname(rec.rank_dir)),
                                                           P.FR_DIR)  # fmt: skip
    os.makedirs(fr_dir, mode=0o700, exist_ok=True)
    path = os.path.join(fr_dir, "%s%d" % (P.FR_PREFIX, rec.rank))  # the analyzer's <prefix><rank> names
    (name, _, dump_json), data = _fullest(recorders)
    out: dict[str, Any] = {"pickle": path, "recorder": name.lstrip("_"), "bytes": len(data)}
    if path not in _WRITTEN and _mtime(path) >= _STARTED:
        # torch's own dump, written since this process started when a collective timed out or failed
        # (TORCH_FR_DUMP_TEMP_FILE): the record of that moment, kept as it is
        out["by"] = "torch"
    else:
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        _WRITTEN.add(path)
    if dump_json is not None:
        json_path = os.path.join(rec.rank_dir, P.RANK_FR_JSON)
        fd = os.open(json_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(dump_json())
        out["json"] = json_path
    return out


# NCCL's own recorder first (CUDA builds since torch split the recorder: NCCL groups' collectives are only there),
# then the one the other backends use (gloo; NCCL too on releases before the split, which have only the first name)
_RECORDERS = ("_dump_nccl_trace", "_dump_fr_trace")
_WRITTEN: set[str] = set()  # the dump paths this process wrote (any other file there is torch's own dump)


def _process_started() -> float:
    """When this process started (wall time, from /proc): a dump at the rank's path younger than that is torch's own
    of this process. Where /proc cannot say, the moment this module was imported (on the liveness thread's start,
    before any process group exists)."""
    imported = time.time()
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return min(imported, boot + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return imported


_STARTED = _process_started()


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return -1.0


def _fullest(recorders: list[tuple[str, Any, Any]]) -> tuple[tuple[str, Any, Any], bytes]:
    """The first recorder whose dump holds entries (a gloo job on a CUDA build leaves NCCL's empty), else the first,
    with its dump. The dump is this process's own, pickled by torch: plain data."""
    import pickle

    first: Optional[tuple[tuple[str, Any, Any], bytes]] = None
    for recorder in recorders:
        data = recorder[1]()
        first = first or (recorder, data)
        try:
            entries = pickle.loads(data).get("entries")
        except Exception:  # a dump this code cannot read is still evidence
            entries = None
        if entries:
            return recorder, data
    assert first is not None
    return first


def _dump_memory_snapshot(rec: DumpingRecorder, torch: Any, request: int) -> Optional[str]:
    cuda: Any = getattr(torch, "cuda", None)
    dump = getattr(getattr(cuda, "memory", None), "_dump_snapshot", None)
    if dump is None or not cuda.is_initialized():
        return None
    path = os.path.join(rec.rank_dir, P.RANK_MEMORY_SNAPSHOT % request)
    dump(path)
    return os.path.basename(path)


def loader_state(rec: DumpingRecorder) -> Optional[dict[str, Any]]:
    it = rec._loader() if rec._loader is not None else None
    if it is None:
        return None
    workers = getattr(it, "_workers", None) or []
    state: dict[str, Any] = {
        "iterator": type(it).__name__,
        "dataset": type(getattr(it, "_dataset", None)).__name__,
        "num_workers": getattr(it, "_num_workers", 0),
        "worker_pids": [w.pid for w in workers if getattr(w, "pid", None)],
        "prefetch_factor": getattr(it, "_prefetch_factor", None),
        "tasks_outstanding": getattr(it, "_tasks_outstanding", None),
        "timeout": getattr(it, "_timeout", None),
        "persistent_workers": getattr(it, "_persistent_workers", None),
        "batches_delivered": rec._batches,
        "data_wait_total_s": round(rec._data_wait, 6),
        "last_data_wait_s": round(rec._last_wait, 6),
    }
    queue = getattr(it, "_data_queue", None)
    try:
        state["queue_depth"] = queue.qsize() if queue is not None else None
    except (NotImplementedError, OSError):
        state["queue_depth"] = None
    return state


def write_state_files(rec: DumpingRecorder) -> None:
    names = thread_names()
    if names != rec._threads_written:
        write_json(os.path.join(rec.rank_dir, P.RANK_THREADS), names)
        rec._threads_written = names
    loader = loader_state(rec)
    key = loader and (loader["iterator"], tuple(loader["worker_pids"]))
    if loader is not None and key != rec._loader_written:
        write_json(os.path.join(rec.rank_dir, P.RANK_LOADER), loader)
        rec._loader_written = key
    if rec.torch is not None and not rec._versions_written:
        rec._versions_written = True
        write_json(os.path.join(rec.rank_dir, P.RANK_INFO), {
            "pid": rec.pid, "rank": rec.rank, "mode": rec.mode, "versions": versions(rec.torch),
            # torchelastic's own error file (written by its @record decorator): left as it is, collected
            "torchelastic_error_file": os.environ.get("TORCHELASTIC_ERROR_FILE"),
        })  # fmt: skip


def _call(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)()
    except Exception as exc:
        return "unavailable: %r" % (exc,)


def versions(torch: Any) -> dict[str, Any]:
    """The job's own environment, read inside the rank (it may differ from blackbox's)."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": getattr(torch, "__version__", None)}
    version = getattr(torch, "version", None)
    out["cuda"] = getattr(version, "cuda", None)
    out["hip"] = getattr(version, "hip", None)
    try:
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as exc:
        out["nccl"] = "unavailable: %r" % (exc,)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out["numpy"] = getattr(numpy, "__version__", None)
    return out
