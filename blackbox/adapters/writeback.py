"""What a flush drains: while a thread is inside fsync, fdatasync, close, sync_file_range, syncfs, sync or msync, how
many bytes have been written so far to what holds its file — the block device's sectors written
(/sys/dev/block/MAJ:MIN/stat), an NFS mount's bytes written to the server (/proc/PID/mountstats), else the pages
the whole host has written back (/proc/vmstat). A flush whose count grows drains; one on a mount that answers
nothing does not. So does a long write to a file on a block device or NFS (held in balance_dirty_pages past the
dirty limit, woken every 200 ms whether or not its pages go out). Imports the stdlib and blackbox's /proc
adapter."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Optional

from . import procfs

FLUSH_FD_CALLS = frozenset({"fsync", "fdatasync", "close", "sync_file_range", "syncfs"})
FLUSH_CALLS = FLUSH_FD_CALLS | {"msync", "sync"}
WRITE_CALLS = frozenset({"write", "writev", "pwrite64", "pwritev", "pwritev2"})
SECTOR = 512  # the unit of /sys/block/*/stat, whatever the device's own sector size


@dataclass(frozen=True)
class Flush:
    """A thread inside a flush, and what its count is read from."""

    call: str  # "fsync", …
    counter: str  # "block 259:1", "nfs /mnt/ckpt", "host": what `written` counts
    written: int  # bytes written there so far

    @property
    def is_write(self) -> bool:
        """A long write (`writing`) whose progress its store's count says: its wake-ups do not."""
        return self.call in WRITE_CALLS


def flushing(pid: int, tid: int) -> Optional[Flush]:
    """The flush a thread is in now, with its count; None when it is in none (or its count cannot be read)."""
    call, args = procfs.thread_syscall(pid, tid)
    if call in WRITE_CALLS:
        return writing(pid, call, args)
    if call not in FLUSH_CALLS:
        return None
    where: Optional[tuple[str, str, str]] = None  # (device, filesystem type, mount point) of its file
    if call in FLUSH_FD_CALLS and args:
        where = _holding(pid, procfs.as_fd(args[0]))
    elif call == "msync" and args:
        where = _mapped(pid, args[0])
    counted = _written(pid, where)
    return Flush(call, *counted) if counted is not None else None


def writing(pid: int, call: Optional[str], args: list[int]) -> Optional[Flush]:
    """A write (WRITE_CALLS) to a regular file on a block device or an NFS mount, with that store's own count; None
    for a write to anything else (a pipe, a FIFO, a socket, a device, FUSE, tmpfs: nothing counts its bytes but the
    write's return)."""
    if call not in WRITE_CALLS or not args:
        return None
    fd = procfs.as_fd(args[0])
    target = procfs.fd_target(pid, fd)
    where = _holding(pid, fd) if target is not None and target.startswith("/") else None
    nfs = where is not None and where[1].startswith("nfs")
    if where is None or (where[0].startswith("0:") and not nfs) or (not nfs and not _regular(pid, fd)):
        return None
    counted = _written(pid, where)
    return Flush(call, *counted) if counted is not None else None


def _regular(pid: int, fd: int) -> bool:
    """Whether a descriptor is a regular file (not a FIFO or a device that lives on a disk's filesystem); stat()ed
    through /proc, only on a local filesystem (a remote one whose server is gone would hang it)."""
    try:
        return stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode)
    except OSError:
        return False


def _holding(pid: int, fd: int) -> Optional[tuple[str, str, str]]:
    """(device, filesystem type, mount point) of the mount that holds a descriptor's file (its fdinfo's mnt_id)."""
    mnt_id = procfs.fd_info(pid, fd).get("mnt_id", "")
    mount = procfs.mount(pid, int(mnt_id)) if mnt_id.isdigit() else None
    return (mount.device, mount.fstype, mount.point) if mount else None


def _written(pid: int, where: Optional[tuple[str, str, str]]) -> Optional[tuple[str, int]]:
    """(what it counts, bytes written so far) for the device, NFS mount or (not knowing better) the host."""
    if where is not None:
        dev, fstype, point = where
        if not dev.startswith("0:"):  # a block device (a partition has its own stat)
            stat = procfs.read_text(f"/sys/dev/block/{dev}/stat", 1024)
            fields = stat.split() if stat else []
            if len(fields) > 6 and fields[6].isdigit():
                return f"block {dev}", int(fields[6]) * SECTOR
            return None
        if fstype.startswith("nfs"):
            sent = _nfs_written(pid, point)
            return (f"nfs {point}", sent) if sent is not None else None
    vmstat = procfs.read_text("/proc/vmstat", 65536) or ""
    for line in vmstat.splitlines():
        name, _, value = line.partition(" ")
        if name == "nr_written" and value.strip().isdigit():
            return "host", int(value) * os.sysconf("SC_PAGE_SIZE")
    return None


def _mapped(pid: int, address: int) -> Optional[tuple[str, str, str]]:
    """(device, "", "") of the file mapped at `address` (an msync's), from /proc/PID/maps (devices in hex)."""
    for line in (procfs.read_text(f"/proc/{pid}/maps", 16 * 1024 * 1024) or "").splitlines():
        f = line.split()
        if len(f) < 4 or "-" not in f[0]:
            continue
        start, _, end = f[0].partition("-")
        try:
            if int(start, 16) <= address < int(end, 16):
                major, _, minor = f[3].partition(":")
                return f"{int(major, 16)}:{int(minor, 16)}", "", ""
        except ValueError:
            return None
    return None


def _nfs_written(pid: int, point: str) -> Optional[int]:
    """The bytes an NFS mount has written to its server (`bytes:` line, serverwritebytes) from mountstats."""
    inside = False
    for line in (procfs.read_text(f"/proc/{pid}/mountstats", 16 * 1024 * 1024) or "").splitlines():
        if line.startswith("device "):
            inside = f" mounted on {point} with fstype nfs" in line
        elif inside and line.strip().startswith("bytes:"):
            numbers = line.split()[1:]
            return int(numbers[5]) if len(numbers) > 5 and numbers[5].isdigit() else None
    return None
