"""Asking the ranks for their own dump during a collection: the quiet request through the heartbeat page, then the
recorder's dump signal — never waiting for a rank that cannot answer (stopped, or its liveness thread frozen).
Imports the stdlib and blackbox's host side; never prints (it reports progress)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Callable, Protocol

from .._recorder import protocol as P
from ..adapters import nccl_pipe, procfs
from ..heartbeat_reader import HeartbeatState
from .job import RankTarget

QUIET_WAIT_S = 2.0  # the quiet request's own time, before the ranks that did not answer are signalled
FROZEN_MIN_S = 3.0  # a liveness thread this still (and four of its intervals) cannot serve a request
PIPE_WAIT_S = 3.0  # torch's watchdog reads its debug pipe about once a second, then writes the dump


class Table(Protocol):
    def request_dump(self, rank: int) -> int: ...

    def read(self) -> list[HeartbeatState]: ...


def frozen_after(env: dict[str, str]) -> float:
    """Seconds without a beat of its liveness thread after which a rank cannot serve a dump request (it holds the
    GIL in C, or the process is stuck): four of the job's liveness intervals, never under FROZEN_MIN_S."""
    try:
        interval = float(env.get(P.ENV_LIVENESS_INTERVAL, "") or 0.5)
    except ValueError:
        interval = 0.5
    return max(FROZEN_MIN_S, 4 * interval)


class Asking:
    """One round of dump requests to `live` (ranks alive with a heartbeat). The recorder's dump signal
    (faulthandler, from C: it works while a rank holds the GIL or is blocked in C; a real-time signal only the
    recorder registers, so a job's own SIGUSR1 handler never runs) goes at once when the job is about to end
    anyway, and to a rank whose liveness thread is frozen (it cannot serve the request: not waited for); otherwise
    only to the ranks that did not answer the quiet way, and only to a process that shows a handler for it. A
    stopped rank is neither asked nor signalled: it runs nothing (py-spy read it from outside)."""

    def __init__(self, table: Table, live: list[RankTarget], env: dict[str, str], job_ends: bool,
                 progress: Callable[[str], None]) -> None:  # fmt: skip
        self.table = table
        self.live = live
        self.job_ends = job_ends
        self.progress = progress
        self.frozen_after = frozen_after(env)
        self.stopped = sorted(r.rank for r in live if procfs.is_stopped(r.pid))
        self.able = {r.rank: r for r in live if r.rank not in self.stopped}
        self.asked: dict[int, int] = {}  # rank -> the request it was given
        self.pending: dict[int, int] = {}  # asked, not answered yet
        self.gone: list[int] = []  # ended before answering
        self.frozen: dict[int, float] = {}  # rank -> seconds its liveness thread had not run
        self.signalled: list[int] = []
        self.notes: list[str] = []
        self.env = env
        self.piped: dict[int, tuple[str, float, float]] = {}  # rank -> (its dump's path, wall, monotonic time asked)
        self.by_watchdog: list[int] = []  # ranks whose flight recorder torch's watchdog dumped through the pipe

    def run(self, wait: float) -> tuple[str, str]:
        """Ask, signal and wait at most `wait` s; (status, detail) of the step."""
        self.progress(f"asking {len(self.able)} rank(s) for their own dump")
        for r in self.able.values():
            try:
                self.asked[r.rank] = self.table.request_dump(r.rank)
            except OSError as exc:
                self.notes.append(f"rank {r.rank}: dump request failed: {exc.strerror}")
        self.pending = dict(self.asked)
        if self.job_ends:
            self.signal(self.able.values())
        self.wait(wait)
        self.pipe_pending()  # a watchdog's dump that came as the wait ended
        if self.signalled:
            time.sleep(0.2)  # faulthandler writes from the signal handler: a fraction of a millisecond
        return ("ok" if not self.pending else "partial"), self.detail(wait)

    def signal(self, targets: Iterable[RankTarget]) -> None:
        dump_signal = P.dump_signal()
        for r in targets:
            if r.rank in self.signalled:
                continue
            if not procfs.has_handler(r.pid, dump_signal):
                self.notes.append(f"rank {r.rank}: the recorder's dump signal is not registered, not signalled")
            elif procfs.signal_if_same(r.pid, r.start_ticks, dump_signal):
                self.signalled.append(r.rank)

    def wait(self, wait: float) -> None:
        end = time.monotonic() + wait
        quiet_end = time.monotonic() + min(QUIET_WAIT_S, wait / 2)
        late = False  # the ranks still pending at the end of the quiet wait were signalled
        while time.monotonic() < end:
            self.read_answers()
            if not set(self.pending) - set(self.frozen) and not self.pipe_pending():
                return  # every rank left cannot answer: do not wait out the rest
            if not self.job_ends and not late and time.monotonic() > quiet_end:
                late = True
                self.signal(self.able[rank] for rank in self.pending)
                if not self.signalled:
                    return  # nobody left to reach: do not wait out the rest
            time.sleep(0.05)

    def read_answers(self) -> None:
        """Who answered, who froze (signalled at once), who died meanwhile (the job is being ended)."""
        now = time.monotonic()
        for hb in self.table.read():
            if hb.rank not in self.pending:
                continue
            if hb.dump_ack >= self.pending[hb.rank]:
                del self.pending[hb.rank]
                self.frozen.pop(hb.rank, None)
            elif now - hb.liveness_time > self.frozen_after and hb.rank not in self.frozen:
                self.frozen[hb.rank] = now - hb.liveness_time
                self.signal([self.able[hb.rank]])
                self.ask_watchdog(self.able[hb.rank])
        for r in self.able.values():
            if r.rank in self.pending and not procfs.is_alive(r.pid, r.start_ticks):
                del self.pending[r.rank]
                self.gone.append(r.rank)

    def ask_watchdog(self, r: RankTarget) -> None:
        """A rank that cannot run Python may still have torch's NCCL watchdog, a C++ thread: its debug pipe asks that
        thread for the rank's flight recorder (nccl_pipe)."""
        pipe = nccl_pipe.pipe_path(self.env, r.rank)
        fr_dir = self.env.get(P.ENV_FR_DIR)
        if pipe is None or not fr_dir:
            return
        dump = nccl_pipe.dump_path(self.env, os.path.join(fr_dir, P.FR_PREFIX), r.rank)
        asked_at = time.time()
        why = nccl_pipe.poke(r.pid, pipe)
        if why is None:
            self.piped[r.rank] = (dump, asked_at, time.monotonic())
        elif why:
            self.notes.append(f"rank {r.rank}: {why}")

    def pipe_pending(self) -> bool:
        """Whether a watchdog asked through the debug pipe may still write its dump (found ones move to by_watchdog)."""
        for rank in _written({rank: (dump, asked_at) for rank, (dump, asked_at, _) in self.piped.items()}):
            self.by_watchdog.append(rank)
            del self.piped[rank]
        return any(time.monotonic() - asked < PIPE_WAIT_S for _, _, asked in self.piped.values())

    def unanswered(self) -> dict[int, str]:
        """Why each rank that wrote no dump of its own did not (the manifest's collection.unanswered): stopped,
        frozen (its liveness thread does not run), no answer (within the wait), ended, or not asked."""
        out = {rank: "stopped" for rank in self.stopped}
        out.update({r.rank: "not asked" for r in self.able.values() if r.rank not in self.asked})
        out.update({rank: "frozen" if rank in self.frozen else "no answer" for rank in self.pending})
        out.update({rank: "ended" for rank in self.gone})
        return out

    def detail(self, wait: float) -> str:
        """The step's words: who wrote its dump, who was signalled, and why any rank was not waited for."""
        answered = sorted(set(self.asked) - set(self.pending) - set(self.gone))
        out = (f"{len(answered)}/{len(self.live)} rank(s) wrote their dump; the dump signal to rank(s) "
               f"{sorted(self.signalled) or 'none'}" + "".join("; " + n for n in self.notes))  # fmt: skip
        if self.stopped:
            out += f"; rank(s) {self.stopped} stopped: not asked (a stopped process runs nothing; read from outside)"
        if self.frozen:
            ages = ", ".join(f"rank {rank}: {age:.0f} s" for rank, age in sorted(self.frozen.items()))
            source = "the dump signal" if set(self.frozen) <= set(self.signalled) else "outside (py-spy)"
            out += (f"; not waited for: the liveness thread of rank(s) {sorted(self.frozen)} does not run ({ages}: "
                    f"the GIL is held or the process is stuck), its stacks come from {source}")  # fmt: skip
        waited = sorted(set(self.pending) - set(self.frozen))
        if waited:
            out += f"; no answer within {wait:g} s from rank(s) {waited}"
        if self.gone:
            out += f"; rank(s) {sorted(self.gone)} ended before answering"
        if self.by_watchdog:
            out += (f"; the flight recorder of rank(s) {sorted(self.by_watchdog)} written by torch's NCCL watchdog, "
                    "asked through its debug pipe")  # fmt: skip
        if self.piped:
            out += (f"; rank(s) {sorted(self.piped)}: asked through the debug pipe, torch's watchdog wrote no flight "
                    f"recorder within {PIPE_WAIT_S:g} s")  # fmt: skip
        return out


def from_watchdogs(
    ranks: list[RankTarget], env: dict[str, str], progress: Callable[[str], None]
) -> tuple[str, str, dict[int, str]]:
    """The flight recorders of ranks that run no recorder (a job not started under `blackbox run`), from torch
    itself: each live rank's NCCL watchdog is asked through its debug pipe where the job's environment names one,
    and a dump torch wrote since the rank started (on a timeout, with TORCH_NCCL_DUMP_ON_TIMEOUT) is taken too.
    (status, detail, rank -> its dump: a file the job chose, to read as the job's user)."""
    none = "no rank runs the recorder: stacks come from py-spy and /proc"
    if not nccl_pipe.recording(env):
        return "skipped", (f"{none}; torch's flight recorder is off in the job's environment (set "
                           "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/nccl_pipe_ "
                           "before a job starts to read an NCCL job's record from outside)"), {}  # fmt: skip
    dumps = {r.rank: nccl_pipe.dump_path(env, nccl_pipe.TORCH_DUMP_PREFIX, r.rank) for r in ranks}
    asked_at, notes = time.time(), []
    asked = []
    for r in ranks:
        why = nccl_pipe.poke(r.pid, pipe) if r.alive and (pipe := nccl_pipe.pipe_path(env, r.rank)) else ""
        if why is None:
            asked.append(r.rank)
        elif why:
            notes.append(f"rank {r.rank}: {why}")
    if asked:
        progress(f"asking the NCCL watchdog of {len(asked)} rank(s) for its flight recorder")
    waiting, end = {rank: (dumps[rank], asked_at) for rank in asked}, time.monotonic() + PIPE_WAIT_S
    while time.monotonic() < end and len(_written(waiting, settle=False)) < len(waiting):
        time.sleep(0.1)
    piped = _written(waiting)
    earlier = [r.rank for r in ranks if r.rank not in piped and (since := procfs.started(r.start_ticks)) is not None
               and nccl_pipe.written_since(dumps[r.rank], since)]  # fmt: skip
    out = [none]
    if piped:
        out.append(f"the flight recorder of rank(s) {piped} written by torch's NCCL watchdog, asked through its "
                   "debug pipe")  # fmt: skip
    if earlier:
        out.append(f"the flight recorder of rank(s) {earlier} as torch wrote it before the collection (a timeout's "
                   "dump)")  # fmt: skip
    if missing := sorted(set(asked) - set(piped)):
        out.append(f"rank(s) {missing}: asked through the debug pipe, torch's watchdog wrote no flight recorder "
                   f"within {PIPE_WAIT_S:g} s")  # fmt: skip
    if not asked and not earlier and not notes:
        out.append("no debug pipe is named in the job's environment (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) and torch "
                   "wrote no flight recorder of its own")  # fmt: skip
    taken = {rank: dumps[rank] for rank in sorted(piped + earlier)}
    return ("ok" if taken else "skipped"), "; ".join(out + notes), taken


def _written(asked: dict[int, tuple[str, float]], settle: bool = True) -> list[int]:
    """The ranks whose watchdog has written its dump since it was asked (rank -> (dump, wall time asked)); with
    `settle`, given a moment to finish when any has (torch writes the dump in one go: a few MB at most)."""
    done = [rank for rank, (dump, asked_at) in asked.items() if nccl_pipe.written_since(dump, asked_at)]
    if done and settle:
        time.sleep(0.2)
    return done
