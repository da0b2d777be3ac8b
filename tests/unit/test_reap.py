"""The supervisor loop's reap: our children are listed after a SIGCHLD (and every CHILDREN_SCAN_S in case one was
missed), not at every turn of the loop; a child that exits is reaped either way. Real processes, real signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from blackbox.adapters import procfs
from blackbox.supervisor import process as process_module
from blackbox.supervisor.process import JobProcess
from tests.conftest import wait_for


@pytest.fixture
def job() -> Iterator[JobProcess]:
    ctx: Any = SimpleNamespace(console=None)
    p = JobProcess(ctx, ranks=lambda: [], helpers=lambda: [])
    old = signal.signal(signal.SIGCHLD, p.on_signal)
    try:
        yield p
    finally:
        signal.signal(signal.SIGCHLD, old)


def exited_child() -> int:
    """A child of ours that has exited and waits, a zombie, to be reaped."""
    pid = os.posix_spawn("/bin/true", ["true"], os.environ)
    wait_for(lambda: (st := procfs.proc_stat(pid)) is not None and st.state == "Z", 10, "the child to exit")
    return pid


def test_a_sigchld_has_the_next_turn_list_and_reap_the_child(job: JobProcess) -> None:
    job.reap(lazy=True)  # the first turn lists them: nothing seen yet
    pid = exited_child()
    assert job._children_due, "the SIGCHLD reached the handler"
    job.reap(lazy=True)
    assert job.reaped == {pid: "exited with code 0"} and procfs.proc_stat(pid) is None


def test_without_a_sigchld_nothing_is_listed_until_the_scan_is_due(job: JobProcess) -> None:
    job.reap(lazy=True)
    old = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a SIGCHLD lost
    try:
        pid = exited_child()
    finally:
        signal.signal(signal.SIGCHLD, old)
    job.reap(lazy=True)
    assert pid not in job.reaped, "listed although no SIGCHLD came and the scan was not due"
    job.reap()  # the loop's end and end_survivors: always listed
    assert pid in job.reaped
    pid = exited_child()
    job._children_due = False  # as if its SIGCHLD had been lost
    job._children_at -= process_module.CHILDREN_SCAN_S  # and the last listing that long ago
    job.reap(lazy=True)
    assert pid in job.reaped, "the scan every CHILDREN_SCAN_S missed it"
