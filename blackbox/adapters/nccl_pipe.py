"""torch's debug pipe (`TORCH_NCCL_DEBUG_INFO_PIPE_FILE`, `TORCH_FR_DEBUG_INFO_PIPE_FILE` on newer releases): the FIFO
`<prefix><global rank>.pipe` that the watchdog of a rank's default NCCL group creates and polls (about once a second
with `TORCH_NCCL_DUMP_ON_TIMEOUT`); a byte written to it makes that C++ thread, which needs no GIL, write the rank's
flight recorder to `<dump prefix><rank>`. Imports the stdlib and proctree."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Optional

from . import proctree

PIPE_NAMES = ("TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")  # the names torch reads, newest first
DUMP_NAMES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
TORCH_DUMP_PREFIX = "/tmp/nccl_trace_rank_"  # torch's own, where the job names none


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> Optional[str]:
    return next((env[name] for name in names if env.get(name)), None)


def pipe_path(env: Mapping[str, str], rank: int) -> Optional[str]:
    """The rank's debug pipe, where its environment names a prefix (blackbox run sets one)."""
    prefix = _first(env, PIPE_NAMES)
    return f"{prefix}{rank}.pipe" if prefix else None


def recording(env: Mapping[str, str]) -> bool:
    """Whether the job's environment turns torch's flight recorder on (its buffer holds entries)."""
    size = _first(env, BUFFER_NAMES) or "0"
    return size.strip().isdigit() and int(size) > 0


def dump_path(env: Mapping[str, str], default_prefix: str, rank: int) -> str:
    """Where torch writes the rank's flight recorder: the user's prefix, or the one the recorder gives torch."""
    return f"{_first(env, DUMP_NAMES) or default_prefix}{rank}"


def poke(pid: int, path: str) -> Optional[str]:
    """Write one byte into the debug pipe of the rank `pid`: only into a FIFO that the rank itself holds open (a path
    named by a job's environment can make blackbox write nowhere else), never blocking. None once written, else why
    not, in words; a missing pipe is `""` (no NCCL group, or a torch without the pipe: nothing to say)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"its debug pipe cannot be read ({exc.strerror})"
    if not stat.S_ISFIFO(st.st_mode) or not proctree.holds(pid, st.st_dev, st.st_ino, os.path.basename(path)):
        return "its debug pipe is not a FIFO the rank holds open: not written"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return "nobody reads its debug pipe (torch's watchdog thread has ended)"
        return f"its debug pipe cannot be opened ({exc.strerror})"
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return "its debug pipe changed while it was opened: not written"
        os.write(fd, b"1\n")
    except BlockingIOError:
        pass  # full: a request already waits there
    except OSError as exc:
        return f"its debug pipe cannot be written ({exc.strerror})"
    finally:
        os.close(fd)
    return None


def written_since(path: str, since: float) -> bool:
    """Whether a dump at `path` was written at or after `since` (wall clock)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0 and st.st_mtime >= since - 0.01
