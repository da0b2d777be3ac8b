"""Linux /proc: process identity (pid + start time, so a reused pid is never mistaken for a rank),
liveness, children and signal masks. May import the stdlib, psutil and blackbox._recorder.protocol."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Optional

import psutil

from .._recorder.protocol import parse_proc_stat


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z, T ...
    ppid: int
    start_ticks: int


def proc_stat(pid: int) -> Optional[ProcStat]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid, start = parse_proc_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return ProcStat(state, ppid, start)


def is_alive(pid: int, start_ticks: int = 0) -> bool:
    """True while `pid` runs and is the same process (same start time) as the one recorded."""
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return not start_ticks or st.start_ticks == start_ticks


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
    fields = _fields(_read(path, 4096))
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


def rw_wakeups(pid: int, tid: int) -> Optional[int]:
    """How many times a thread has been woken so far (voluntary context switches) when it is inside a read or write
    system call now, else None (in no such call, running, or unreadable). A long write to slow storage (a network or
    FUSE filesystem, a pipe drained slowly) counts its bytes only when the call returns; meanwhile the thread is
    woken each time the kernel moves some of them, which a write to a hung server never is."""
    numbers = _RW_SYSCALLS.get(os.uname().machine)
    text = _read(f"/proc/{pid}/task/{tid}/syscall", 512)
    first = text.split(maxsplit=1)[0] if text else ""
    if numbers is None or not first.isdigit() or int(first) not in numbers:
        return None
    switches = _fields(_read(f"/proc/{pid}/task/{tid}/status")).get("voluntary_ctxt_switches", "")
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
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return sorted(set(out))


def _read(path: str, limit: int = 65536) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _fields(text: Optional[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


MAX_THREADS = 512  # per process, in a snapshot


def zombie_exit_code(pid: int) -> Optional[int]:
    """How a zombie (exited, not yet reaped by its parent) ended, from /proc/PID/stat's exit_code field (Linux
    >= 3.5): its exit code, or minus the signal that killed it; None where it cannot be read."""
    text = _read(f"/proc/{pid}/stat")
    try:
        rest = text[text.rindex(")") + 2 :].split() if text else []
        return os.waitstatus_to_exitcode(int(rest[49])) if len(rest) > 49 else None
    except (ValueError, IndexError):
        return None


def snapshot(pid: int) -> dict[str, object]:
    """What /proc and psutil say about one process now: status, where it sleeps in the kernel (wchan,
    syscall, kernel stack where readable), each thread's name, state and wchan, open fds, I/O counters,
    CPU times and memory. Fields that cannot be read are None, with the reason under `unreadable`."""
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
    for tid in tids[:MAX_THREADS]:
        stat = _read(f"{base}/task/{tid}/stat")
        state = stat[stat.rindex(")") + 2 :].split()[0] if stat and ")" in stat else None
        threads.append({
            "tid": int(tid), "name": (_read(f"{base}/task/{tid}/comm") or "").strip(), "state": state,
            "wchan": _read(f"{base}/task/{tid}/wchan"),
        })  # fmt: skip
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
        "threads": threads,
        "threads_total": len(tids),
        "fd_count": fd_count,
        "io": {k: int(v) for k, v in _fields(read("io")).items() if v.isdigit()} or None,
        **ps,
        "unreadable": unreadable,
    }
