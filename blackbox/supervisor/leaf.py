"""The leaf a still rank waits at, and how long it may stay still there: one table (LEAVES) that the stall rule, the
words and docs/run.md's table are made from. A definite leaf — a read or open of a FIFO nobody moves at, a stopped
process, a poll loop — is a wait nothing will end, judged on a short floor at any step, from the first instruction to
the last; every other leaf (a pipe from a child that may be downloading, a socket, a long native call, a sleep, a
collective) is ambiguous and keeps the step-based timeouts (supervisor.rules). A rank that waits for processes of its
own (a DataLoader's workers) is at the leaf they are at. Imports the stdlib and blackbox's /proc adapters."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..adapters import procfs, proctree

DEFINITE_FLOOR_S = 30.0  # a definite leaf's stall timeout under `--stall-timeout auto` (a number given is kept)
OPEN_CALLS = frozenset({"open", "openat", "openat2"})
READ_CALLS = frozenset({"read", "readv", "pread64", "preadv", "preadv2"}) | OPEN_CALLS


@dataclass(frozen=True)
class Leaf:
    name: str
    definite: bool
    what: str  # the leaf in words, for the timeout's name and docs/run.md
    needs_whole_world: bool = False  # definite only once every rank of the job is here (a rendezvous polls too)


LEAVES = (
    Leaf("stopped", True, "the process is stopped (SIGSTOP, job control; `/proc` state T)"),
    Leaf("fifo", True, "its main thread opens a FIFO (a named pipe; also how a dead mount looks in the gallery) no "
         "writer has opened, or reads one whose writers (followed as what it waits for) show no motion; or it waits "
         "for a thread of its own (a join, a future, the interpreter's exit) and a thread of its own does so"),
    Leaf("poll", True, "its main thread sleeps and checks in a loop (its recorder saw it) while nothing it could wait "
         "for moves: a marker, a lock file, a store key", needs_whole_world=True),
    Leaf("workers", True, "its main thread waits for processes of its own (a DataLoader's workers, a child it reads "
         "from), none of which moves: one or more stopped or at a FIFO (opening one no writer has opened, or reading "
         "one whose writers show no motion), the others waiting for the rank itself (an idle worker polls the queue "
         "the rank feeds)"),
    Leaf("other", False, "anything else: a pipe (a child at its other end may be downloading: bytes received with "
         "recv() are not in /proc), a socket (its peer may be computing an answer), a collective, a long native or "
         "GPU call, a sleep, a thread of its own, the kernel (D), a debugger (t)"),
)  # fmt: skip
BY_NAME = {leaf.name: leaf for leaf in LEAVES}


def of_rank(pid: int, waiting: str, waited: tuple[int, ...] = ()) -> Optional[Leaf]:
    """The definite leaf a still rank's main thread is at now, from /proc and its recorder's `waiting`; None for
    any other (ambiguous) leaf. `waited`: the processes its main thread waits for (supervisor.waits), whose stillness
    the caller has seen. A traced process (`t`: a debugger is the user) is never definite."""
    st = procfs.proc_stat(pid)
    if st is None:
        return None
    if st.state == "T":
        return BY_NAME["stopped"]
    if waiting == "poll":
        return BY_NAME["poll"]
    if _at_fifo(pid) or (waiting == "thread" and any(_at_fifo(pid, tid) for tid in _other_threads(pid))):
        return BY_NAME["fifo"]
    if waited and _workers_stuck(pid, waited):
        return BY_NAME["workers"]
    return None


def _at_fifo(pid: int, tid: int = 0, calls: frozenset[str] = READ_CALLS) -> bool:
    """Whether the main thread of `pid` (or its thread `tid`) is in one of `calls` on a FIFO. (A blocked read of a
    FIFO has a writer: the watch follows it as what the rank waits for, so a rank still this long has a writer that
    shows no motion; a thread's read that got bytes would have moved the rank that waits for it.)"""
    call, _ = procfs.thread_syscall(pid, tid or pid)
    if call not in calls:  # (a collective's recv, a sleep: nothing more to read, every poll of a long wait)
        return False
    return procfs.blocked(pid, tid or None).get("fd_kind") == "fifo"


def _other_threads(pid: int, limit: int = 64) -> list[int]:
    """The thread ids of `pid` but its main thread's (at most `limit`: a rank's own threads, torch's, blackbox's)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)][:limit]
    except OSError:
        return []


def _workers_stuck(rank: int, waited: tuple[int, ...]) -> bool:
    """Whether the processes a rank waits for wait on nothing that can end: each stopped, at a FIFO (opening one no
    writer has opened, or reading one whose writers — followed with them — show no motion), or waiting on a pipe the
    rank itself holds (an idle DataLoader worker polls its index queue, which the waiting rank feeds) — and at least
    one stopped or at a FIFO (workers that all wait for the rank are no leaf of their own)."""
    stuck = False
    for pid in waited:
        st = procfs.proc_stat(pid)
        if st is None:
            return False
        if st.state == "T" or _at_fifo(pid):
            stuck = True
            continue
        _, pipes = proctree.wait_target(pid)
        if not pipes or not proctree.holding([rank], set(pipes)):
            return False
    return stuck
