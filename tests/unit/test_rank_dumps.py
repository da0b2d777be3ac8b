"""Asking ranks for their dump (collect.rank_dumps) on real processes: a rank that cannot answer — stopped, or its
liveness thread frozen — is never waited for; a stopped one is not even signalled. The heartbeat table is a
stand-in (what the supervisor's table answers); the processes, their handlers and the signals are real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from blackbox._recorder import protocol as P
from blackbox.collect.job import RankTarget
from blackbox.collect.rank_dumps import Asking, frozen_after
from tests.conftest import wait_for

# a process posing as a rank: the recorder's dump signal writes a line to argv[1] (as faulthandler would)
POSER = """
import signal, sys, time
def dumped(*_):
    with open(sys.argv[1], "a") as f:
        f.write("dumped\\n")
signal.signal(signal.SIGRTMAX - 3, dumped)
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(0.05)
"""


@dataclass
class Beat:
    rank: int
    dump_ack: int
    liveness_time: float


class Table:
    """What the supervisor's heartbeat table answers: a rank whose liveness thread runs answers a request at once
    (`answering`); the others' beats stay as they were (`frozen_for` s old)."""

    def __init__(self, answering: set[int], frozen_for: float) -> None:
        self.answering = answering
        self.frozen_for = frozen_for
        self.requests: dict[int, int] = {}

    def request_dump(self, rank: int) -> int:
        self.requests[rank] = self.requests.get(rank, 0) + 1
        return self.requests[rank]

    def read(self) -> list[Beat]:
        now = time.monotonic()
        return [Beat(rank, req if rank in self.answering else 0, now - (0.1 if rank in self.answering else
                                                                        self.frozen_for))
                for rank, req in self.requests.items()]  # fmt: skip


@pytest.fixture
def posers(tmp_path: Path) -> Iterator[list[tuple[RankTarget, Path]]]:
    procs = []
    out = []
    for rank in range(3):
        marks = tmp_path / f"dumps-{rank}"
        procs.append(subprocess.Popen([sys.executable, "-c", POSER, str(marks)]))
        out.append((marks, rank, procs[-1].pid))
    targets = []
    for marks, rank, pid in out:
        wait_for(lambda m=marks: Path(str(m) + ".ready").exists(), 30, "the process to set its handler")
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        targets.append((RankTarget(rank, pid, start, True), marks))
    yield targets
    for p in procs:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def test_a_frozen_rank_is_signalled_at_once_and_not_waited_for(posers: list[tuple[RankTarget, Path]]) -> None:
    # GIVEN ranks 0 and 1 that answer, and rank 2 whose liveness thread has not run for 20 s (the GIL held in C)
    table = Table(answering={0, 1}, frozen_for=20.0)
    asking = Asking(table, [t for t, _ in posers], {}, False, lambda _: None)  # type: ignore[arg-type]
    # WHEN they are asked, with 30 s to wait
    started = time.monotonic()
    status, detail = asking.run(30.0)
    # THEN rank 2 got the dump signal at once (faulthandler answers from C), the others answered the quiet way,
    # and nobody waited the 30 s out
    assert time.monotonic() - started < 10
    assert posers[2][1].read_text() == "dumped\n"
    assert not posers[0][1].exists() and not posers[1][1].exists()
    assert status == "partial"
    assert detail == ("2/3 rank(s) wrote their dump; the dump signal to rank(s) [2]; not waited for: the liveness "
                      "thread of rank(s) [2] does not run (rank 2: 20 s: the GIL is held or the process is stuck), "
                      "its stacks come from the dump signal")  # fmt: skip


def test_a_stopped_rank_is_neither_asked_nor_signalled(posers: list[tuple[RankTarget, Path]]) -> None:
    # GIVEN rank 1 stopped (SIGSTOP), the others answering
    os.kill(posers[1][0].pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(posers[1][0].pid).status() == psutil.STATUS_STOPPED, 10, "rank 1 to stop")
    table = Table(answering={0, 2}, frozen_for=20.0)
    asking = Asking(table, [t for t, _ in posers], {}, False, lambda _: None)  # type: ignore[arg-type]
    started = time.monotonic()
    status, detail = asking.run(30.0)
    # THEN it was not asked, no signal waits for it in its queue, and nothing waited for it
    assert time.monotonic() - started < 10
    assert 1 not in table.requests and status == "ok"
    status_text = Path(f"/proc/{posers[1][0].pid}/status").read_text()
    assert "SigPnd:\t0000000000000000" in status_text and "ShdPnd:\t0000000000000000" in status_text
    assert detail == ("2/3 rank(s) wrote their dump; the dump signal to rank(s) none; rank(s) [1] stopped: not asked "
                      "(a stopped process runs nothing; read from outside)")  # fmt: skip


def test_a_rank_that_answers_late_is_waited_for(posers: list[tuple[RankTarget, Path]]) -> None:
    # GIVEN a rank whose liveness thread runs but has not answered yet (a large flight-recorder dump)
    table = Table(answering={0, 2}, frozen_for=0.2)  # rank 1 beats (0.2 s ago) but does not answer
    asking = Asking(table, [t for t, _ in posers], {}, False, lambda _: None)  # type: ignore[arg-type]
    status, detail = asking.run(3.0)
    # THEN it is signalled after the quiet wait and waited for to the end: it may still answer
    assert status == "partial" and posers[1][1].read_text() == "dumped\n"
    assert detail.endswith("no answer within 3 s from rank(s) [1]"), detail


def test_the_frozen_limit_follows_the_jobs_liveness_interval() -> None:
    assert frozen_after({}) == 3.0
    assert frozen_after({P.ENV_LIVENESS_INTERVAL: "2"}) == 8.0
    assert frozen_after({P.ENV_LIVENESS_INTERVAL: "nonsense"}) == 3.0
