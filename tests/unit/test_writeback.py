"""What a flush drains (blackbox/adapters/writeback.py), from /proc and /sys as the kernel writes them: the block
device's sectors written, an NFS mount's bytes sent to its server, else the host's pages written back; nothing
while the thread is in no flush. The real thing on a throttled loop device: tests/integration/test_flush.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

from blackbox.adapters import procfs, writeback

MOUNTINFO = """\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 259:1 / /data rw,relatime shared:7 - ext4 /dev/nvme0n1p1 rw
41 22 0:52 / /mnt/ckpt rw,relatime shared:8 - nfs4 10.0.0.5:/export rw,vers=4.2
42 22 0:60 / /mnt/fuse rw,nosuid shared:9 - fuse.s3fs s3fs rw
"""
MOUNTSTATS = """\
device /dev/vda mounted on / with fstype ext4
device 10.0.0.5:/export mounted on /mnt/ckpt with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576
\tbytes:\t1000 2000 0 0 1000 8388608 1 2048
"""
FILES = {
    "/proc/7/mountinfo": MOUNTINFO,
    "/proc/7/mountstats": MOUNTSTATS,
    "/sys/dev/block/259:1/stat": "  100 0 800 10  5000 0 40960 900  2 1000 910 0 0 0 0",
    "/proc/vmstat": "nr_dirty 12\nnr_written 4096\nnr_dirtied 5000\n",
    "/proc/7/maps": "7f00000000-7f00100000 rw-s 00000000 103:01 1234 /data/index.bin\n",
}


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A thread of pid 7 in the system call `state["call"]` on fd 3, whose file lives on mount `state["mnt"]`."""
    state: dict[str, object] = {"call": "fsync", "mnt": "40", "target": "/data/ckpt.pt", "regular": True}

    def read_text(path: str, limit: int = 65536) -> Optional[str]:
        return FILES.get(path)

    monkeypatch.setattr(procfs, "read_text", read_text)
    monkeypatch.setattr(procfs, "thread_syscall", lambda pid, tid: (state["call"], [3 if state["call"] != "msync"
                                                                                    else 0x7F00000800]))  # fmt: skip
    monkeypatch.setattr(procfs, "fd_info", lambda pid, fd: {"mnt_id": str(state["mnt"])} if fd == 3 else {})
    monkeypatch.setattr(procfs, "fd_target", lambda pid, fd: state["target"] if fd == 3 else None)
    monkeypatch.setattr(writeback, "_regular", lambda pid, fd: state["regular"])
    return state


def test_a_flush_counts_what_holds_its_file(kernel: dict[str, object]) -> None:
    # a file on a block device: its sectors written (the 7th field), 512 bytes each
    assert writeback.flushing(7, 7) == writeback.Flush("fsync", "block 259:1", 40960 * 512)
    # a file on NFS: the bytes the mount has written to its server (the 6th number of `bytes:`)
    kernel.update(call="close", mnt="41")
    assert writeback.flushing(7, 7) == writeback.Flush("close", "nfs /mnt/ckpt", 8388608)
    # a file on FUSE: not knowing better, the host's pages written back
    kernel.update(call="fdatasync", mnt="42")
    assert writeback.flushing(7, 7) == writeback.Flush("fdatasync", "host", 4096 * 4096)
    # msync: the device of the file mapped at its address (hex in /proc/PID/maps)
    kernel.update(call="msync")
    assert writeback.flushing(7, 7) == writeback.Flush("msync", "block 259:1", 40960 * 512)


def test_no_flush_no_count(kernel: dict[str, object]) -> None:
    for call in ("read", "futex", "running", None):
        kernel["call"] = call
        assert writeback.flushing(7, 7) is None
    # and a descriptor whose mount is not in the table (a lazily unmounted one) falls back to the host's writeback
    kernel.update(call="fsync", mnt="99")
    assert writeback.flushing(7, 7) == writeback.Flush("fsync", "host", 4096 * 4096)


def test_a_long_write_to_a_disk_or_nfs_counts_its_store(kernel: dict[str, object]) -> None:
    # a write held past the dirty limit is woken every 200 ms whatever goes out: what its store writes decides
    kernel.update(call="write", mnt="40")
    assert writeback.flushing(7, 7) == writeback.Flush("write", "block 259:1", 40960 * 512)
    assert writeback.flushing(7, 7).is_write  # type: ignore[union-attr]
    kernel.update(call="pwrite64", mnt="41")
    assert writeback.flushing(7, 7) == writeback.Flush("pwrite64", "nfs /mnt/ckpt", 8388608)
    # but a write to FUSE (its daemon takes the bytes, no writeback count says so), a pipe or a socket has no count:
    # its wake-ups are what moves
    for mnt, target in (("42", "/mnt/fuse/ckpt.pt"), ("40", "pipe:[88]"), ("40", "socket:[99]"), ("99", "/x")):
        kernel.update(call="write", mnt=mnt, target=target)
        assert writeback.flushing(7, 7) is None, (mnt, target)
    # nor a FIFO that lives on the disk's filesystem (torch.save to a named pipe a slow reader drains): the reader
    # takes its bytes, and each wake-up inside the write is them moving
    kernel.update(call="write", mnt="40", target="/data/fifo", regular=False)
    assert writeback.flushing(7, 7) is None


def test_a_fifo_on_a_disk_is_no_file(tmp_path: Path) -> None:
    # the real check, on this process's own descriptors: a FIFO made on the disk, and a file beside it
    fifo, plain = tmp_path / "fifo", tmp_path / "plain"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    with open(plain, "wb") as f:
        try:
            assert not writeback._regular(os.getpid(), writer) and writeback._regular(os.getpid(), f.fileno())
        finally:
            os.close(writer)
            os.close(reader)
