"""Who waits for whom across processes, read from /proc: the children a wait4 or waitid waits for, the processes at
the other end of a pipe a thread reads or polls, a rank's workers and the tree below them, and who holds a file open.
Imports the stdlib and blackbox's /proc adapter."""

from __future__ import annotations

import os
import stat
import struct
import time
from typing import Callable, Optional

from .procfs import (
    ProcStat,
    _fields,
    _user_bytes,
    as_fd,
    children,
    cmdline,
    exe,
    fd_target,
    proc_stat,
    read_text,
    thread_syscall,
)

WAIT_CHILD_CALLS = frozenset({"wait4", "waitid"})
WAIT_FD_CALLS = frozenset({"read", "readv", "poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait"})
MAX_WAIT_FDS = 1024  # descriptors of one poll or select read, at most
MAX_TREE = 4096  # processes below one rank followed, at most
P_ALL, P_PID, P_PGID, P_PIDFD = 0, 1, 2, 3  # waitid's idtype


def waited_fds(pid: int, call: str, args: list[int]) -> list[int]:
    """The file descriptors a thread in `call` (one of WAIT_FD_CALLS) waits on: a read's one, a poll's or select's
    set (read from the process's memory), an epoll's registered ones (its fdinfo)."""
    if not args:
        return []
    if call in ("read", "readv"):
        return [as_fd(args[0])]
    if call in ("poll", "ppoll"):
        count = min(args[1], MAX_WAIT_FDS)
        data = _user_bytes(pid, args[0], 8 * count) or b""
        return [fd for fd, _, _ in struct.iter_unpack("<ihh", data[: len(data) // 8 * 8]) if fd >= 0]
    if call in ("select", "pselect6"):
        count = min(args[0], MAX_WAIT_FDS)
        bits = _user_bytes(pid, args[1], (count + 7) // 8) if args[1] else None
        return [fd for fd in range(min(count, 8 * len(bits or b""))) if bits and bits[fd // 8] >> (fd % 8) & 1]
    if call in ("epoll_wait", "epoll_pwait"):
        info = read_text(f"/proc/{pid}/fdinfo/{as_fd(args[0])}") or ""
        return [int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:")
                and len(line.split()) > 1 and line.split()[1].isdigit()]  # fmt: skip
    return []


def waited_children(pid: int, call: str, args: list[int]) -> list[int]:
    """The children a thread in wait4 or waitid waits for: the one it names, or all of them (any child, a process
    group)."""
    if not args:
        return []
    if call == "wait4":
        child = as_fd(args[0])
        return [child] if child > 0 else children(pid)
    if args[0] == P_PID:
        return [as_fd(args[1])]
    if args[0] == P_PIDFD:
        field = _fields(read_text(f"/proc/{pid}/fdinfo/{as_fd(args[1])}")).get("Pid", "")
        return [int(field)] if field.isdigit() else []
    return children(pid)


def waited_processes(pid: int, workers_since: Optional[float] = None) -> list[int]:
    """The processes the main thread of `pid` waits for: the children of its wait4 or waitid, or those that hold the
    other end of a pipe it reads or polls (below it: a tool's captured output, a worker pool's result queue) or of a
    FIFO it reads (anywhere: its writer); else, given `workers_since` (it waits for a thread of its own or polls:
    its heartbeat says), its `workers`."""
    waited, ends = wait_target(pid)
    waited = waited if not ends else other_ends(pid, ends)
    return waited if waited or workers_since is None else workers(pid, workers_since)


def wait_target(pid: int) -> tuple[list[int], frozenset[str]]:
    """What the main thread of `pid` waits on that another process may answer: the children of its wait4 or waitid,
    or the pipes it reads or polls (`pipe:[inode]`) and the FIFOs it reads (`fifo:DEV:INO:path`: a blocked read of
    a FIFO has a writer); nothing of the kind: ([], empty)."""
    call, args = thread_syscall(pid, pid)
    if call in WAIT_CHILD_CALLS:
        return waited_children(pid, call, args), frozenset()
    if call in WAIT_FD_CALLS:
        fds = waited_fds(pid, call, args)
        return [], frozenset(pipe_inodes(pid, fds) | fifo_ends(pid, fds))
    return [], frozenset()


def fifo_ends(pid: int, fds: list[int]) -> set[str]:
    """The FIFOs (named pipes) among a process's file descriptors, as `fifo:DEV:INO:path`."""
    out = set()
    for fd in fds:
        target = fd_target(pid, fd)
        if target is None or not target.startswith("/"):
            continue
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode):
            out.add(f"fifo:{st.st_dev}:{st.st_ino}:{target}")
    return out


def other_ends(pid: int, ends: frozenset[str]) -> list[int]:
    """The processes at the other end of these pipes and FIFOs (wait_target): for a pipe, the topmost processes below
    `pid` that hold it (a shell's pipeline inherits its pipes: the shell stands for it); for a FIFO, every other
    process that holds it open, wherever it runs (`holders`: a scan of /proc)."""
    pipes = {e for e in ends if e.startswith("pipe:[")}
    found = holding(process_tree(children(pid)), pipes) if pipes else []
    out = [p for p in found if not set(_ancestors(p, pid)) & set(found)]
    for end in sorted(ends - pipes):
        _, dev, ino, path = end.split(":", 3)
        out += [p for p in holders(int(dev), int(ino), os.path.basename(path)) if p != pid and p not in out]
    return out


def is_fifo(ends: frozenset[str]) -> bool:
    """Whether these ends (wait_target) are FIFOs only: what waits at their other end is their writer, not a child."""
    return bool(ends) and all(e.startswith("fifo:") for e in ends)


def _ancestors(pid: int, root: int) -> list[int]:
    """The processes between `pid` and `root` (both left out), nearest first."""
    out: list[int] = []
    st = proc_stat(pid)
    while st is not None and st.ppid not in (root, 0, 1) and len(out) < MAX_TREE:
        out.append(st.ppid)
        st = proc_stat(st.ppid)
    return out


SHOWN_CHARS = 60  # of a waited child's command line


def waited_name(pids: list[int], redact: Callable[[list[str]], list[str]], fifo: bool = False) -> str:
    """How a user knows what a rank waits for: one child (`fifo`: one writer of the FIFO it reads) by its command
    line (through `redact`, shortened: a secret on it never shown), several by their pids."""
    one, many = ("its FIFO's writer", "its FIFO's {} writers") if fifo else ("its child", "its {} child processes")
    if len(pids) > 1:
        shown = ", ".join(map(str, pids[:8])) + (", …" if len(pids) > 8 else "")
        return f"{many.format(len(pids))} (pids {shown})"
    argv = cmdline(pids[0])
    if not argv:
        return f"{one if fifo else 'its child process'} (pid {pids[0]})"
    line = " ".join([os.path.basename(argv[0]), *redact(argv)[1:]])
    line = line if len(line) <= SHOWN_CHARS else line[: SHOWN_CHARS - 1] + "…"
    return f"{one} `{line}` (pid {pids[0]})"


def _boot_ticks(mono: float) -> int:
    """A CLOCK_MONOTONIC time in clock ticks since boot: the unit of a process's start time in /proc/PID/stat."""
    return int((mono + time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()) * os.sysconf("SC_CLK_TCK"))


def runs_python(pid: int, rank_exe: Optional[str]) -> bool:
    """Whether `pid` runs the rank's interpreter or another Python: a worker of the job's, not a tool or a service."""
    path = exe(pid)
    return path is not None and (path == rank_exe or os.path.basename(path).startswith("python"))


def workers(pid: int, since: float, stat: Callable[[int], Optional[ProcStat]] = proc_stat) -> list[int]:
    """The children of `pid` that a wait for a thread of its own or a poll loop may be waiting on: its Python workers
    (a process pool's, a DataLoader's) and whatever it started at or after `since` (CLOCK_MONOTONIC s: the tool a
    loop polls) — not a program it started before (a metrics service that always moves). `stat`: how a process's
    /proc/PID/stat is read (a caller that reads it again at the same poll keeps what it read)."""
    since_ticks = _boot_ticks(since)
    rank_exe = exe(pid)
    out = []
    for child in children(pid):
        st = stat(child)
        if st is not None and st.state not in ("Z", "X") and (st.start_ticks >= since_ticks
                                                              or runs_python(child, rank_exe)):  # fmt: skip
            out.append(child)
    return out


def process_tree(pids: list[int]) -> list[int]:
    """These processes and every process below them (from the children files: no scan of /proc), at most MAX_TREE."""
    out: list[int] = []
    todo = list(pids)
    while todo and len(out) < MAX_TREE:
        pid = todo.pop(0)
        if pid not in out:
            out.append(pid)
            todo.extend(children(pid))
    return out


def pipe_inodes(pid: int, fds: list[int]) -> set[str]:
    """The pipes (`pipe:[inode]`) among a process's file descriptors."""
    return {t for t in (fd_target(pid, fd) for fd in fds) if t is not None and t.startswith("pipe:[")}


def fd_targets(pid: int) -> set[str]:
    """What every file descriptor of a process points to (`pipe:[…]`, `/dev/ptmx`, paths), at most MAX_WAIT_FDS."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")[:MAX_WAIT_FDS]
    except OSError:
        return set()
    return {t for t in (fd_target(pid, int(fd)) for fd in fds if fd.isdigit()) if t is not None}


def write_target(pid: int) -> Optional[str]:
    """What the main thread of `pid` is writing to when it is inside write() or writev() now, else None."""
    call, args = thread_syscall(pid, pid)
    return fd_target(pid, as_fd(args[0])) if call in ("write", "writev") and args else None


def holding(pids: list[int], pipes: set[str]) -> list[int]:
    """Those of `pids` that hold one of these pipes open: the processes at the other end."""
    return [pid for pid in pids if fd_targets(pid) & pipes]


def holders(dev: int, ino: int, name: str, limit: int = 8) -> list[int]:
    """The processes that hold a file open (`fuser`): a descriptor whose target ends in `name` and that is the same
    file (device and inode, so across mount namespaces). A scan of /proc, at most MAX_TREE processes, `limit` found."""
    out: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()][:MAX_TREE]
    except OSError:
        return out
    for pid in pids:
        if holds(pid, dev, ino, name):
            out.append(pid)
        if len(out) >= limit:
            break
    return out


def holds(pid: int, dev: int, ino: int, name: str) -> bool:
    """Whether process `pid` holds a file open: a descriptor whose target ends in `name` and that is the same file
    (device and inode), among its first MAX_WAIT_FDS."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")[:MAX_WAIT_FDS]
    except OSError:
        return False
    for fd in fds:
        target = fd_target(pid, int(fd)) if fd.isdigit() else None
        if target is None or not target.endswith(name):
            continue
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            return True
    return False
