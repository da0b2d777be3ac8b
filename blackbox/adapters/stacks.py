"""Stacks as the rank recorder leaves them: faulthandler's text dumps and the recorder's JSON dumps, read into
one shape, and the frame that says where a thread is in the user's own code. Imports the stdlib only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
# Frames of the interpreter, torch and blackbox itself: folded so that the user's frames stand out.
LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/_recorder/", "<frozen ")
# py-spy's text output names a library's files relative to site-packages (`torch/cuda/__init__.py`) and the
# standard library's by their own name (`threading.py`): those are library frames too.
LIBRARY_ROOTS = frozenset({
    "torch", "torchvision", "torchaudio", "torchdata", "deepspeed", "transformers", "accelerate", "lightning",
    "pytorch_lightning", "lightning_fabric", "numpy", "datasets", "webdataset", "fsspec", "s3fs", "gcsfs", "botocore",
    "boto3", "s3transfer", "urllib3", "requests", "apex", "transformer_engine", "triton", "safetensors", "pyarrow",
    "h5py", "threading.py", "queue.py", "socket.py", "selectors.py", "ssl.py", "multiprocessing", "concurrent",
    "asyncio", "subprocess.py", "contextlib.py", "functools.py", "runpy.py", "http", "importlib",
})  # fmt: skip
_LIBRARY_FILES: dict[str, bool] = {}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    module: str = ""  # a native frame's shared library (py-spy --native: `libtorch_cpu.so`); "" for Python frames

    @property
    def is_library(self) -> bool:
        known = _LIBRARY_FILES.get(self.file)
        if known is None:  # files repeat across threads and ranks: each is looked at once
            known = _LIBRARY_FILES[self.file] = any(m in self.file for m in LIBRARY_MARKERS) or (
                not self.file.startswith("/") and self.file.split("/", 1)[0] in LIBRARY_ROOTS
            )
            if len(_LIBRARY_FILES) > 100_000:
                _LIBRARY_FILES.clear()
        return known

    def describe(self) -> str:
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class ThreadStack:
    ident: str
    name: Optional[str]
    current: bool  # the thread that handled the signal (faulthandler's "Current thread")
    frames: tuple[Frame, ...]  # outermost first

    def top_user_frame(self) -> Optional[Frame]:
        return self._top_user

    @cached_property
    def _top_user(self) -> Optional[Frame]:  # read once: a report asks it of every rank several times
        """The innermost frame of the user's own Python code (native frames, py-spy --native's, are not the user's);
        else the innermost Python frame; else the innermost frame."""
        for f in reversed(self.frames):
            if not f.is_library and not f.module:
                return f
        return next((f for f in reversed(self.frames) if not f.module), self.frames[-1] if self.frames else None)


def parse_faulthandler(text: str, names: Optional[dict[str, str]] = None) -> list[list[ThreadStack]]:
    """Every dump in a faulthandler file (dumps are appended one after another), each a list of threads."""
    names = names or {}
    dumps: list[list[ThreadStack]] = []
    current: Optional[tuple[str, bool, list[Frame]]] = None
    threads: list[ThreadStack] = []

    def close() -> None:
        if current is not None:
            ident, is_current, frames = current
            threads.append(ThreadStack(ident, names.get(ident), is_current, tuple(reversed(frames))))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            ident = m.group(2)
            if any(t.ident == ident for t in threads):  # the same thread again: a new dump began
                dumps.append(threads)
                threads = []
            current = (ident, m.group(1) == "Current thread", [])
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            current[2].append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    close()
    if threads:
        dumps.append(threads)
    return dumps


def from_pydump(dump: Any) -> list[ThreadStack]:
    """The recorder's own dump (`pydump-<n>.json`), already parsed as JSON; bad entries are skipped."""
    out = []
    for t in dump.get("threads", []) if isinstance(dump, dict) else []:
        try:
            frames = tuple(Frame(str(f["file"]), int(f["line"]), str(f["function"])) for f in t["stack"])
            out.append(ThreadStack(str(t["ident"]), str(t.get("name")), False, frames))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def main_thread(threads: list[ThreadStack]) -> Optional[ThreadStack]:
    for t in threads:
        if t.name == "MainThread":
            return t
    return next((t for t in threads if t.current), None)


def first_user_frame(frames: Any) -> Optional[str]:
    """From PyTorch's recorded frames (flight-recorder entries, memory-snapshot blocks: dicts with filename,
    line and name, innermost first), the innermost one in the user's code: "train.py:88 (forward)"."""
    for f in frames if isinstance(frames, list) else []:
        if not isinstance(f, dict):
            continue
        filename = str(f.get("filename", ""))
        if any(m in filename for m in LIBRARY_MARKERS) or filename.startswith("??"):
            continue
        return f"{filename.rsplit('/', 1)[-1] or '?'}:{f.get('line')} ({f.get('name')})"
    return None
