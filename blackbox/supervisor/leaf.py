"""The leaf a still rank waits at, and how long it may stay still there: one table (LEAVES) that the stall rule, the
words and docs/run.md's table are made from. A definite leaf — a read or open of a FIFO nobody moves at, a stopped
process, a poll loop — is a wait nothing will end, judged on a short floor at any step, from the first instruction to
the last; every other leaf (a pipe from a child that may be downloading, a socket, a long native call, a sleep, a
collective) is ambiguous and keeps the step-based timeouts (supervisor.rules). Imports the
stdlib and blackbox's /proc adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..adapters import procfs

DEFINITE_FLOOR_S = 30.0  # a definite leaf's stall timeout under `--stall-timeout auto` (a number given is kept)
READ_CALLS = frozenset({"read", "readv", "pread64", "preadv", "preadv2", "open", "openat", "openat2"})


@dataclass(frozen=True)
class Leaf:
    name: str
    definite: bool
    what: str  # the leaf in words, for the timeout's name and docs/run.md
    needs_whole_world: bool = False  # definite only once every rank of the job is here (a rendezvous polls too)


LEAVES = (
    Leaf("stopped", True, "the process is stopped (SIGSTOP, job control; `/proc` state T)"),
    Leaf("fifo", True, "its main thread reads or opens a FIFO (a named pipe; also how a dead mount looks in the "
         "gallery) whose writer, if any, shows no motion"),
    Leaf("poll", True, "its main thread sleeps and checks in a loop (its recorder saw it) while nothing it could wait "
         "for moves: a marker, a lock file, a store key", needs_whole_world=True),
    Leaf("other", False, "anything else: a pipe (a child at its other end may be downloading: bytes received with "
         "recv() are not in /proc), a socket (its peer may be computing an answer), a collective, a long native or "
         "GPU call, a sleep, a thread of its own, the kernel (D), a debugger (t)"),
)  # fmt: skip
BY_NAME = {leaf.name: leaf for leaf in LEAVES}


def of_rank(pid: int, waiting: str) -> Optional[Leaf]:
    """The definite leaf a still rank's main thread is at now, from /proc and its recorder's `waiting`; None for
    any other (ambiguous) leaf. A traced process (`t`: a debugger is the user) is never definite."""
    st = procfs.proc_stat(pid)
    if st is None:
        return None
    if st.state == "T":
        return BY_NAME["stopped"]
    if waiting == "poll":
        return BY_NAME["poll"]
    call, _ = procfs.thread_syscall(pid, pid)
    if call not in READ_CALLS:  # (a collective's recv, a sleep: nothing more to read, every poll of a long wait)
        return None
    if procfs.blocked(pid).get("fd_kind") == "fifo":
        return BY_NAME["fifo"]
    return None
