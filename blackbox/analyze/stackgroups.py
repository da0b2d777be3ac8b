"""Stacks across ranks: each rank's main-thread stack from the best source in the bundle, what it waits for
(collective, data, checkpoint, compute), and identical stacks merged into groups, the odd ones first, library
frames folded so the user's frames stand out. Pure; imports the stdlib, the stack adapters and the reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..adapters import pyspy, stacks
from ..bundle import layout as L
from ..bundle.reader import Bundle
from ..detections import plural_ranks
from ..frames import Where, where
from .sources import main_stack

MAX_FRAMES_SHOWN = 12


@dataclass(frozen=True)
class RankStack:
    rank: int
    thread: stacks.ThreadStack
    source: str  # the bundle member it was read from
    waits_in: str  # collective | data | checkpoint | io | compute | ambiguous (frames.where)
    workers: tuple[tuple[int, stacks.ThreadStack], ...] = ()  # (pid, main thread) of its DataLoader workers
    where: Optional[Where] = None  # frames.where of the main thread, read once


@dataclass
class StackGroup:
    ranks: list[int]
    waits_in: str
    signature: str  # one line: "all_reduce ← main (train.py:88)"
    frames: list[str]  # the stack, outermost first, library runs folded
    sources: list[str] = field(default_factory=list)
    odd: bool = False  # a minority group: the ones to look at first

    def describe(self) -> str:
        return f"{plural_ranks(self.ranks)}: {self.signature}"


def _from_pyspy(bundle: Bundle, name: str, worker: bool = False) -> Optional[stacks.ThreadStack]:
    data = bundle.json(name)
    if not isinstance(data, list):
        return None
    if not worker:  # the main thread alone is read: a 32,768-rank report reads one per rank
        main = [t for t in data if isinstance(t, dict) and t.get("thread_name") == "MainThread"]
        return stacks.main_thread(pyspy.threads(main or data))
    for t in pyspy.threads(data):  # a forked DataLoader worker: the thread running its loop (others are leftovers)
        if any(f.function == "_worker_loop" for f in t.frames):
            return t
    return stacks.main_thread(pyspy.threads(data))


def rank_stack(bundle: Bundle, rank: int) -> Optional[RankStack]:
    """The rank's main thread, from py-spy (taken from outside at collection time) or else the rank's own dump."""
    name = L.process_member(rank, L.PYSPY)
    thread: Optional[stacks.ThreadStack] = _from_pyspy(bundle, name) if name in bundle.files else None
    source: Optional[str] = name if thread is not None else None
    if thread is None:
        thread, source = main_stack(bundle, rank)
    if thread is None or source is None:
        return None
    workers = []
    for member in bundle.rank_files(rank):
        pid = L.worker_pid(rank, L.PYSPY, member)
        if pid is not None:
            w = _from_pyspy(bundle, member, worker=True)
            if w is not None:
                workers.append((pid, w))
    at = where(thread)
    return RankStack(rank, thread, source, at.kind, tuple(workers), at)


def fold(thread: stacks.ThreadStack) -> list[str]:
    """Outermost first; each run of library frames folded to its innermost frame ("… 7 library frames …")."""
    out: list[str] = []
    run: list[stacks.Frame] = []

    def flush(last: bool) -> None:
        if not run:
            return
        if len(run) > 1:
            out.append(f"… {len(run) - 1} library frame(s) …")
        out.append(run[-1].describe())
        run.clear()

    for f in thread.frames:
        if f.is_library:
            run.append(f)
            continue
        flush(False)
        out.append(f.describe())
    flush(True)
    return out[-MAX_FRAMES_SHOWN:]


def signature(thread: stacks.ThreadStack) -> str:
    """A line that tells stacks apart: the innermost frame, then the innermost user frame it was called from."""
    if not thread.frames:
        return "(no frames)"
    inner = thread.frames[-1]
    user = thread.top_user_frame()
    if user is None or user == inner:
        return inner.describe()
    return f"{inner.function} ← {user.describe()}"


def group(rank_stacks: list[RankStack]) -> list[StackGroup]:
    """Identical main-thread stacks merged; the smaller groups (the odd ones out) first."""
    by_key: dict[tuple[tuple[str, int, str], ...], StackGroup] = {}
    for rs in rank_stacks:
        key = tuple((f.file, f.line, f.function) for f in rs.thread.frames)
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = StackGroup([], rs.waits_in, signature(rs.thread), fold(rs.thread))
        g.ranks.append(rs.rank)
        g.sources.append(rs.source)
    groups = sorted(by_key.values(), key=lambda g: (len(g.ranks), g.waits_in == "collective", min(g.ranks)))
    if len(groups) > 1:
        biggest = max(len(g.ranks) for g in groups)
        for g in groups:
            g.odd = len(g.ranks) < biggest or len(groups) == len(rank_stacks)
    return groups
