"""Under torchrun a bundle taken the moment a rank dies waits (bounded) for torchrun's line saying how it ended:
without it a report reads a signal where an exit code is right (ddp-exit-code under load)."""

from __future__ import annotations

import time

import pytest

from blackbox.collect import collector as C
from blackbox.collect.job import Job, RankTarget

LINE = b"E1204 torch/distributed/elastic: failed (exitcode: 3) local_rank: 1 (pid: 4242) of binary: python\n"


class Console:
    def __init__(self, after: int) -> None:
        self.calls, self.after = 0, after

    def tail(self, limit: int) -> bytes:
        self.calls += 1
        return b"rank 1 raised SystemExit(3)\n" + (LINE if self.calls > self.after else b"")


def collector(argv: list[str], console: Console) -> C.Collector:
    ranks = [RankTarget(0, 4241, 0, True), RankTarget(1, 4242, 0, False)]
    job = Job("run", "node0", argv, "/", {}, None, None, ranks, 2)
    return C.Collector(job, None, console, C.CollectOptions(dump_timeout=1.0, budget=30.0))


def test_the_tail_waits_for_torchruns_exit_line() -> None:
    console = Console(after=3)
    c = collector(["torchrun", "--nproc-per-node", "2", "train.py"], console)
    tail = c._console_tail(console, c.job.ranks, time.monotonic() + 30)
    assert LINE in tail and console.calls == 4


def test_the_wait_is_bounded_and_only_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "EXIT_LINE_WAIT_S", 0.3)
    never = Console(after=10**9)
    c = collector(["torchrun", "train.py"], never)
    start = time.monotonic()
    assert LINE not in c._console_tail(never, c.job.ranks, time.monotonic() + 30)
    assert 0.25 <= time.monotonic() - start < 2.0
    plain = Console(after=10**9)
    c = collector(["python", "train.py"], plain)
    c._console_tail(plain, c.job.ranks, time.monotonic() + 30)
    assert plain.calls == 1
