"""Opening the files a job wrote, as a process that may be more privileged than the job (`blackbox collect` as
root): as the job's user where the kernel allows it (this thread's filesystem uid, so that root's privileges do
not apply), never through a symlink (every component opened relative to its directory's descriptor,
O_NOFOLLOW), only regular files, and only files (and directories) owned by the job's user. Imports the stdlib
only."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from typing import Any, Optional

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY  # a FIFO never blocks the open
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


_libc: Any = None


@contextlib.contextmanager
def as_user(uid: Optional[int]) -> Iterator[None]:
    """Within the block, this thread opens files as user `uid` (Linux's filesystem uid, set per thread: the
    other threads keep root), so that a file the job's user may not read cannot be read through blackbox either.
    A no-op unless we are root and the job is not; where the call is unavailable, the ownership checks remain."""
    global _libc
    if uid is None or uid == 0 or os.geteuid() != 0:
        yield
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        previous = _libc.setfsuid(uid)
    except (OSError, AttributeError):
        yield
        return
    try:
        yield
    finally:
        _libc.setfsuid(previous)


class UnsafeFile(OSError):
    """A file blackbox refuses to open: a symlink, not a regular file, or not the job's user's."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, why, path)


def _check(fd: int, path: str, owner: Optional[int], directory: bool) -> None:
    st = os.fstat(fd)
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    why = None
    if not kind_ok:
        why = "not a directory" if directory else "not a regular file"
    elif owner is not None and st.st_uid != owner:
        why = f"owned by uid {st.st_uid}, not by the job's user (uid {owner})"
    if why is not None:
        raise UnsafeFile(path, why)


def open_fd(path: str, owner: Optional[int], write: bool = False, dir_fd: Optional[int] = None,
            proc_link: bool = False) -> int:  # fmt: skip
    """A descriptor of the regular file `path` (its last component never a symlink), owned by `owner` when
    given. OSError (UnsafeFile for a refused one) otherwise. `proc_link`: `path` is /proc/PID/fd/N, a link the
    kernel resolves to the process's open file (no path the job could swap), so it is followed."""
    flags = (_READ | os.O_RDWR) if write else _READ  # O_RDONLY is 0
    if proc_link:
        flags &= ~os.O_NOFOLLOW
    with as_user(owner):
        fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        _check(fd, path, owner, directory=False)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: str, owner: Optional[int], limit: int, tail: bool = False, dir_fd: Optional[int] = None,
              proc_link: bool = False) -> bytes:  # fmt: skip
    """At most `limit` bytes of the file: its beginning, or with `tail` its end."""
    fd = open_fd(path, owner, dir_fd=dir_fd, proc_link=proc_link)
    try:
        if tail:
            size = os.fstat(fd).st_size
            os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class RunDir:
    """A run directory read from outside (a job's, found in its environment): every path below it is opened one
    component at a time relative to its parent's descriptor, none a symlink, each owned by `owner` (the job's
    user; None: any owner, for blackbox's own run directory)."""

    def __init__(self, root: str, owner: Optional[int]) -> None:
        self.root = root
        self.owner = owner

    def _parent(self, rel: str) -> tuple[int, str]:
        """A descriptor of the directory holding `rel` (the caller closes it), and `rel`'s last component."""
        parts = [p for p in rel.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise UnsafeFile(os.path.join(self.root, rel), "not a path below the run directory")
        with as_user(self.owner):
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check(fd, self.root, self.owner, directory=True)
            for i, part in enumerate(parts[:-1]):
                with as_user(self.owner):
                    child = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = child
                _check(fd, os.path.join(self.root, *parts[: i + 1]), self.owner, directory=True)
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def open_fd(self, rel: str, write: bool = False) -> int:
        parent, name = self._parent(rel)
        try:
            return open_fd(name, self.owner, write=write, dir_fd=parent)
        except UnsafeFile as exc:
            raise UnsafeFile(os.path.join(self.root, rel), exc.strerror or "refused") from None
        finally:
            os.close(parent)

    def read(self, rel: str, limit: int, tail: bool = False) -> bytes:
        parent, name = self._parent(rel)
        try:
            return read_file(name, self.owner, limit, tail, dir_fd=parent)
        except UnsafeFile as exc:
            raise UnsafeFile(os.path.join(self.root, rel), exc.strerror or "refused") from None
        finally:
            os.close(parent)

    def list(self, rel: str = "") -> list[str]:
        """The names in a directory below the run directory ([] when it is absent or refused)."""
        try:
            if rel:
                parent, name = self._parent(rel)
                try:
                    with as_user(self.owner):
                        fd = os.open(name, _DIR, dir_fd=parent)
                finally:
                    os.close(parent)
            else:
                with as_user(self.owner):
                    fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _check(fd, os.path.join(self.root, rel), self.owner, directory=True)
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)
        except OSError:
            return []

    def size(self, rel: str) -> Optional[int]:
        """The size of a regular file below the run directory, None when it is absent or refused."""
        try:
            fd = self.open_fd(rel)
        except OSError:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
