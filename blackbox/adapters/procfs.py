"""Linux /proc: process identity (pid + start time, so a reused pid is never mistaken for a rank),
liveness, children, signal masks, and what a thread is blocked on in the kernel (its syscall, the file, pipe or
socket it reads and the filesystem that holds it). May import the stdlib, psutil and blackbox._recorder.protocol."""

from __future__ import annotations

import os
import platform
import signal
import stat
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import psutil

from .._recorder.protocol import parse_proc_stat


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z, T ...
    ppid: int
    start_ticks: int
    cpu_ticks: int  # CPU time used in clock ticks, with that of the children it has reaped (a shell's commands)


def proc_stat(pid: int) -> Optional[ProcStat]:
    text = read_text(f"/proc/{pid}/stat") or ""
    try:
        state, ppid, start = parse_proc_stat(text)
        times = text[text.rindex(")") + 2 :].split()[11:15]  # utime, stime, cutime, cstime
        return ProcStat(state, ppid, start, sum(int(v) for v in times))
    except (ValueError, IndexError):
        return None


def is_alive(pid: int, start_ticks: int = 0, read_stat: Callable[[int], Optional[ProcStat]] = proc_stat) -> bool:
    """True while `pid` runs and is the same process (same start time) as the one recorded. `read_stat`: how its
    /proc/PID/stat is read (a caller that reads it again at the same poll keeps what it read)."""
    st = read_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return not start_ticks or st.start_ticks == start_ticks


def is_stopped(pid: int) -> bool:
    """Stopped (SIGSTOP, job control) or stopped by a tracer: it runs no code, answers nothing, and cannot be
    suspended again (py-spy reads it without suspending)."""
    st = proc_stat(pid)
    return st is not None and st.state in ("T", "t")


def started(start_ticks: int) -> Optional[float]:
    """The wall time a process started, from its start in clock ticks after boot."""
    try:
        return psutil.boot_time() + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, RuntimeError):
        return None


def unsuspendable(pid: int) -> Optional[str]:
    """Why py-spy could not suspend `pid` to read it, or None: stopped (it cannot be suspended again), or a thread
    in uninterruptible sleep (D: a hung mount, a vfork — the attach waits until the kernel lets it go, which may be
    never). Such a process is read without being suspended. One read of each thread's stat (the main thread's is
    the process's)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    states = {tid: st.state for tid in tids[:4096] if tid.isdigit() and (st := proc_stat(int(tid))) is not None}
    if states.get(str(pid)) in ("T", "t"):
        return "stopped"
    return "in uninterruptible sleep" if "D" in states.values() else None


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_if_same(pid: int, start_ticks: int, sig: int) -> bool:
    """Send `sig` to `pid` only if it is still the process we recorded; never to a recycled pid."""
    if pid <= 1 or not is_alive(pid, start_ticks):
        return False
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def has_handler(pid: int, sig: int = signal.SIGUSR1) -> bool:
    """Whether `pid` catches `sig` (SigCgt in /proc/PID/status): without a handler it would die of it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except (OSError, ValueError):
        pass
    return False


@dataclass(frozen=True)
class IoCounters:
    """/proc/PID[/task/TID]/io: bytes through read/write system calls (any file, pipe, socket, terminal) and bytes
    the storage layer read or had dirtied for writing (files only; tmpfs not)."""

    rchar: int
    wchar: int
    read_bytes: int
    write_bytes: int


def io_counters(pid: int, tid: Optional[int] = None) -> Optional[IoCounters]:
    """A process's I/O counters (all its threads, living and gone), or one thread's; None where they cannot be read
    (gone, another user's process without CAP_SYS_PTRACE, a kernel without task I/O accounting)."""
    path = f"/proc/{pid}/task/{tid}/io" if tid is not None else f"/proc/{pid}/io"
    fields = _fields(read_text(path, 4096))
    try:
        return IoCounters(int(fields["rchar"]), int(fields["wchar"]), int(fields["read_bytes"]),
                          int(fields["write_bytes"]))  # fmt: skip
    except (KeyError, ValueError):
        return None


# read, write and their kin (pread/pwrite, readv/writev and their 2 forms, sendfile, splice, copy_file_range): the
# system calls in which a thread moves bytes; numbers per architecture (/proc/TID/syscall gives the number)
_RW_SYSCALLS = {
    "x86_64": frozenset((0, 1, 17, 18, 19, 20, 40, 275, 295, 296, 326, 327, 328)),
    "aarch64": frozenset((63, 64, 65, 66, 67, 68, 69, 70, 71, 76, 285, 286, 287)),
}
_RW_NUMBERS = _RW_SYSCALLS.get(os.uname().machine)  # this machine's
# ... of which the reads (read, pread64, readv, preadv, preadv2): a read of a pipe or a socket returns as soon as
# any byte arrives, so a wake-up that leaves it inside the call moved nothing (a timer's or a profiler's signal)
_READ_SYSCALLS = {"x86_64": frozenset((0, 17, 19, 295, 327)), "aarch64": frozenset((63, 65, 67, 69, 286))}
_READ_NUMBERS = _READ_SYSCALLS.get(os.uname().machine, frozenset())
_STREAMS = ("pipe:", "socket:", "anon_inode:")  # what a read returns from at the first byte


def rw_wakeups(pid: int, tid: int) -> Optional[int]:
    """How many times a thread has been woken so far (voluntary context switches) when it is inside a read or write
    system call now, else None (in no such call, running, or unreadable). A long write to slow storage (a network or
    FUSE filesystem, a pipe drained slowly) counts its bytes only when the call returns; meanwhile the thread is
    woken each time the kernel moves some of them, which a write to a hung server never is. A read of a pipe or a
    socket is None too: it would have returned with the first byte, so its wake-ups are signals, not bytes."""
    text = read_text(f"/proc/{pid}/task/{tid}/syscall", 512)
    parts = text.split(maxsplit=2) if text else []
    first = parts[0] if parts else ""
    if _RW_NUMBERS is None or not first.isdigit() or int(first) not in _RW_NUMBERS:
        return None
    if int(first) in _READ_NUMBERS and len(parts) > 1:
        try:
            target = fd_target(pid, int(parts[1], 16))
        except ValueError:
            target = None
        if target is None or target.startswith(_STREAMS):
            return None
    switches = _fields(read_text(f"/proc/{pid}/task/{tid}/status")).get("voluntary_ctxt_switches", "")
    return int(switches) if switches.isdigit() else None


class ProcAccessError(Exception):
    """/proc refused us a file of a process that exists (another user's process, no CAP_SYS_PTRACE)."""


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with. Raises ProcAccessError when it may not be read and
    FileNotFoundError (an OSError) when the process is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except PermissionError as exc:
        raise ProcAccessError(str(exc)) from None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def uid(pid: int) -> Optional[int]:
    """The user a process runs as (the owner of its /proc directory), None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []


def exe(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def cwd(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def fd_target(pid: int, fd: int) -> Optional[str]:
    """What a process's file descriptor points to (a path, `pipe:[...]`, `/dev/pts/3`), or None."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """Direct children, from every thread's `children` file (cheap: no scan of /proc)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out.extend(int(c) for c in (read_text(f"/proc/{pid}/task/{tid}/children") or "").split())
        except ValueError:
            continue
    return sorted(set(out))


def in_other_pid_namespace(ns_pid: int, start_ticks: int, root: str = "/proc") -> Optional[int]:
    """The pid here of a process that calls itself `ns_pid` in a PID namespace nested below ours (the last number of
    its `NSpid` line) and started at `start_ticks`; None where there is none. Scans /proc: call it once per rank
    process, when its own pid names no such process here."""
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        ids = _fields(read_text(f"{root}/{name}/status")).get("NSpid", "").split()
        if len(ids) < 2 or ids[-1] != str(ns_pid):
            continue
        try:
            if parse_proc_stat(read_text(f"{root}/{name}/stat") or "")[2] == start_ticks:
                return int(name)
        except (ValueError, IndexError):
            continue
    return None


def read_text(path: str, limit: int = 65536) -> Optional[str]:
    """Up to `limit` bytes of a /proc file, or None. Plain system calls: the supervisor reads several such files a
    rank at every poll, and a Python file object costs twice as much as the read itself."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _fields(text: Optional[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


MAX_THREADS = 512  # per process, in a snapshot
MAX_HELD_THREADS = 16  # ... of which this many, in a call on a descriptor, say what they are blocked on


def zombie_exit_code(pid: int) -> Optional[int]:
    """How a zombie (exited, not yet reaped by its parent) ended, from /proc/PID/stat's exit_code field (Linux
    >= 3.5): its exit code, or minus the signal that killed it; None where it cannot be read."""
    text = read_text(f"/proc/{pid}/stat")
    try:
        rest = text[text.rindex(")") + 2 :].split() if text else []
        return os.waitstatus_to_exitcode(int(rest[49])) if len(rest) > 49 else None
    except (ValueError, IndexError):
        return None


def snapshot(pid: int) -> dict[str, object]:
    """What /proc and psutil say about one process now: status, where it sleeps in the kernel (wchan,
    syscall, kernel stack where readable), what its main thread is blocked on (`blocked`), each thread's name,
    state, wchan and syscall, open fds, I/O counters, CPU times and memory. Fields that cannot be read are None,
    with the reason under `unreadable`."""
    base = f"/proc/{pid}"
    unreadable: dict[str, str] = {}

    def read(name: str) -> Optional[str]:
        try:
            with open(f"{base}/{name}", "rb") as f:
                return f.read(65536).decode("utf-8", "replace")
        except OSError as exc:
            unreadable[name] = exc.strerror or str(exc)
            return None

    status = _fields(read("status"))
    threads: list[dict[str, object]] = []
    try:
        tids = sorted(os.listdir(f"{base}/task"), key=int)
    except OSError as exc:
        tids = []
        unreadable["task"] = exc.strerror or str(exc)
    held = 0
    for tid in tids[:MAX_THREADS]:
        stat = read_text(f"{base}/task/{tid}/stat")
        state = stat[stat.rindex(")") + 2 :].split()[0] if stat and ")" in stat else None
        thread: dict[str, object] = {
            "tid": int(tid), "name": (read_text(f"{base}/task/{tid}/comm") or "").strip(), "state": state,
            "wchan": read_text(f"{base}/task/{tid}/wchan"), "syscall": thread_syscall(pid, int(tid))[0],
        }  # fmt: skip
        if (thread["syscall"] in FD_CALLS or thread["syscall"] in PATH_CALLS) and int(tid) != pid and \
                held < MAX_HELD_THREADS:  # fmt: skip
            thread["blocked"] = blocked(pid, int(tid))  # what a thread the main thread may wait for waits on
            held += 1
        threads.append(thread)
    try:
        fd_count: Optional[int] = len(os.listdir(f"{base}/fd"))
    except OSError as exc:
        fd_count = None
        unreadable["fd"] = exc.strerror or str(exc)
    ps: dict[str, object] = {}
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            ps["cpu_times"] = p.cpu_times()._asdict()
            ps["memory"] = p.memory_info()._asdict()
            ps["create_time"] = p.create_time()
            ps["num_ctx_switches"] = p.num_ctx_switches()._asdict()
    except psutil.Error as exc:
        unreadable["psutil"] = str(exc)
    return {
        "pid": pid,
        "name": status.get("Name"),
        "state": status.get("State"),
        "exit_code": zombie_exit_code(pid) if str(status.get("State", "")).startswith("Z") else None,
        "ppid": int(status["PPid"]) if status.get("PPid", "").isdigit() else None,
        "status": status,
        "wchan": read("wchan"),
        "syscall": (read("syscall") or "").strip() or None,
        "kernel_stack": read("stack"),
        "main_thread": blocked(pid),
        "threads": threads,
        "threads_total": len(tids),
        "fd_count": fd_count,
        "io": {k: int(v) for k, v in _fields(read("io")).items() if v.isdigit()} or None,
        **ps,
        "unreadable": unreadable,
    }


# --- what a thread is blocked on in the kernel ---------------------------------------------------------------
# The syscalls a thread is seen blocked in, by machine (/proc/PID/task/TID/syscall gives the number).
SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {0: "read", 1: "write", 2: "open", 3: "close", 7: "poll", 16: "ioctl", 17: "pread64", 18: "pwrite64",
               19: "readv", 20: "writev", 23: "select", 24: "sched_yield", 26: "msync", 34: "pause", 35: "nanosleep",
               42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 58: "vfork",
               61: "wait4", 74: "fsync", 75: "fdatasync", 162: "sync", 202: "futex", 247: "waitid",
               230: "clock_nanosleep", 232: "epoll_wait", 257: "openat", 270: "pselect6", 271: "ppoll",
               277: "sync_file_range", 281: "epoll_pwait", 288: "accept4", 295: "preadv", 299: "recvmmsg",
               306: "syncfs", 327: "preadv2", 437: "openat2"},
    "aarch64": {22: "epoll_pwait", 29: "ioctl", 56: "openat", 57: "close", 63: "read", 64: "write", 65: "readv",
                66: "writev", 67: "pread64", 68: "pwrite64", 69: "preadv", 72: "pselect6", 73: "ppoll", 81: "sync",
                82: "fsync", 83: "fdatasync", 84: "sync_file_range", 95: "waitid", 98: "futex", 101: "nanosleep",
                115: "clock_nanosleep", 124: "sched_yield", 202: "accept", 203: "connect", 206: "sendto",
                207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 227: "msync", 242: "accept4", 243: "recvmmsg",
                260: "wait4", 267: "syncfs", 437: "openat2"},
}  # fmt: skip
FD_CALLS = frozenset({"read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg", "recvmmsg", "write",
                      "writev", "pwrite64", "sendto", "sendmsg", "connect", "accept", "accept4", "ioctl", "fsync",
                      "fdatasync", "close", "sync_file_range", "syncfs"})  # fmt: skip
PATH_CALLS = {"open": 0, "openat": 1, "openat2": 1}  # the argument that points at the path
# Filesystems a stat() may hang on when their server is gone: never stat a file on one of these.
REMOTE_FS = ("nfs", "nfs4", "lustre", "cifs", "smb3", "ceph", "gpfs", "beegfs", "9p", "glusterfs", "afs", "fuse")
AT_FDCWD = -100


def thread_syscall(pid: int, tid: int) -> tuple[Optional[str], list[int]]:
    """The syscall a thread is in ("read", …; "running"; None when unreadable) and its arguments."""
    text = read_text(f"/proc/{pid}/task/{tid}/syscall")
    if text is None:
        return None, []
    parts = text.split()
    if not parts or parts[0] == "running":
        return "running", []
    try:
        nr = int(parts[0])
        args = [int(a, 16) for a in parts[1:7]]
    except ValueError:
        return None, []
    if nr < 0:
        return "none", []  # blocked, but not in a syscall (a page fault)
    return SYSCALLS.get(platform.machine(), {}).get(nr, f"syscall {nr}"), args


def as_fd(value: int) -> int:
    """A file descriptor argument as the C int it is (the kernel prints it sign-extended to 64 bits, or not)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def fd_info(pid: int, fd: int) -> dict[str, str]:
    """A descriptor's /proc/PID/fdinfo fields (`pos`, `flags`, `mnt_id`, …); empty when unreadable."""
    return _fields(read_text(f"/proc/{pid}/fdinfo/{fd}"))


class Mount(NamedTuple):
    """One line of a process's mountinfo."""

    id: int
    point: str  # where it is mounted, in the process's view
    fstype: str  # "ext4", "nfs4", "fuse.s3fs", …
    source: str  # what is mounted: a device path, "server:/export", …
    device: str  # MAJ:MIN (0:N for a filesystem without a block device: NFS, FUSE, tmpfs)


MOUNTINFO_MAX = 4 * 1024 * 1024  # a Kubernetes node's mount table runs to thousands of lines


def mounts(pid: int) -> list[Mount]:
    """The mounts of the process's mount namespace; empty when unreadable."""
    lines = (read_text(f"/proc/{pid}/mountinfo", MOUNTINFO_MAX) or "").splitlines()
    return [m for m in map(_mount_line, lines) if m is not None]


def mount(pid: int, mnt_id: int) -> Optional[Mount]:
    """The mount with this id (a descriptor's fdinfo `mnt_id`) in the process's namespace: its line alone is parsed,
    not the whole table."""
    text = "\n" + (read_text(f"/proc/{pid}/mountinfo", MOUNTINFO_MAX) or "")
    at = text.find(f"\n{mnt_id} ")
    if at < 0:
        return None
    end = text.find("\n", at + 1)
    return _mount_line(text[at + 1 : end if end >= 0 else None])


def _mount_line(line: str) -> Optional[Mount]:
    left, sep, right = line.partition(" - ")
    a, b = left.split(), right.split()
    if sep and len(a) >= 5 and len(b) >= 2 and a[0].isdigit():
        return Mount(int(a[0]), a[4].replace("\\040", " "), b[0], b[1], a[2])
    return None


def _mount_of(pid: int, path: str, mnt_id: Optional[int]) -> Optional[tuple[str, str]]:
    """(filesystem type, mount point) of a path: by the fd's own mount id where known, else the longest prefix."""
    found = mount(pid, mnt_id) if mnt_id is not None else None
    if found is not None:
        return found.fstype, found.point
    best = max((m for m in mounts(pid) if path == m.point or path.startswith(m.point.rstrip("/") + "/")),
               key=lambda m: len(m.point), default=None)  # fmt: skip
    return (best.fstype, best.point) if best else None


def _socket_peer(pid: int, inode: str) -> Optional[str]:
    """The other end of a TCP socket (`10.0.0.9:443`) or a Unix socket's path, from the process's net tables."""
    for table in ("tcp", "tcp6"):
        for line in (read_text(f"/proc/{pid}/net/{table}", 4 * 1024 * 1024) or "").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[9] == inode:
                return _address(f[2])
    for line in (read_text(f"/proc/{pid}/net/unix", 4 * 1024 * 1024) or "").splitlines()[1:]:
        f = line.split()
        if len(f) > 6 and f[6] == inode:
            return f[7] if len(f) > 7 else "a unix socket"
    return None


def _address(hexed: str) -> Optional[str]:
    """/proc/net/tcp's `0100007F:1F90` -> `127.0.0.1:8080` (and the IPv6 form)."""
    import ipaddress

    try:
        host, port = hexed.split(":")
        raw = bytes.fromhex(host)
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host-endian
        ip = ipaddress.ip_address(words)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        return f"[{ip}]:{int(port, 16)}" if ip.version == 6 else f"{ip}:{int(port, 16)}"
    except (ValueError, IndexError):
        return None


def _user_bytes(pid: int, address: int, size: int) -> Optional[bytes]:
    """Up to `size` bytes of the process's memory (a path, a poll's descriptors): read from /proc/PID/mem, which
    needs the same rights as py-spy (nothing is signalled, nothing stops)."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.pread(fd, size, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)


def _user_string(pid: int, address: int, limit: int = 4096) -> Optional[str]:
    """A NUL-terminated string in the process's memory (the path of a blocked open)."""
    data = _user_bytes(pid, address, limit)
    if data is None:
        return None
    return data.split(b"\0", 1)[0].decode("utf-8", "replace") or None


def _file_kind(path: str, fstype: Optional[str]) -> str:
    """file, fifo, device or dir: stat()ed only on a local filesystem (one whose server is gone would hang it)."""
    if fstype is not None and fstype.split(".")[0] in REMOTE_FS:
        return "file"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "file"
    return "fifo" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else (
        "dir" if stat.S_ISDIR(mode) else "file")  # fmt: skip


def blocked(pid: int, tid: Optional[int] = None) -> dict[str, object]:
    """What a thread (the main thread by default) is blocked on: its state, wchan and syscall, and for a read, a
    write, a connect or an open, the file descriptor or path it waits on — what it is (file, fifo, socket, pipe,
    device), which filesystem holds it, and for a socket the address at the other end."""
    tid = tid or pid
    base = f"/proc/{pid}/task/{tid}"
    stat_text = read_text(f"{base}/stat")
    out: dict[str, object] = {"tid": tid, "state": stat_text[stat_text.rindex(")") + 2 :].split()[0]
                              if stat_text and ")" in stat_text else None,
                              "wchan": (read_text(f"{base}/wchan") or "").strip() or None}  # fmt: skip
    call, args = thread_syscall(pid, tid)
    out["syscall"] = call
    if call is None or not args:
        return out
    target: Optional[str] = None
    mnt_id: Optional[int] = None
    if call in FD_CALLS:
        fd = as_fd(args[0])
        out["fd"] = fd
        target = fd_target(pid, fd)
        info = _fields(read_text(f"/proc/{pid}/fdinfo/{fd}"))
        mnt_id = int(info["mnt_id"]) if info.get("mnt_id", "").isdigit() else None
    elif call in PATH_CALLS:
        path = _user_string(pid, args[PATH_CALLS[call]])
        dirfd = as_fd(args[0])
        if path and not path.startswith("/"):
            base_dir = cwd(pid) if call == "open" or dirfd == AT_FDCWD else fd_target(pid, dirfd)
            path = os.path.join(base_dir, path) if base_dir else path
        out["path"] = path
        target = path
    if target is None:
        return out
    out["fd_target"] = target
    if target.startswith("socket:["):
        out["fd_kind"] = "socket"
        peer = _socket_peer(pid, target[len("socket:[") : -1])
        if peer:
            out["peer"] = peer
    elif target.startswith("pipe:["):
        out["fd_kind"] = "pipe"
    elif target.startswith("anon_inode:"):
        out["fd_kind"] = "anon"
    elif target.startswith("/"):
        mount = _mount_of(pid, target, mnt_id)
        if mount:
            out["fs_type"], out["mount"] = mount
        out["fd_kind"] = _file_kind(target, mount[0] if mount else None)
    return out
