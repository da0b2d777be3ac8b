"""A bug in blackbox's own watching code never costs the job: it is logged once and the job goes on.
The supervisor runs in this process here, over a real child job, with its rule engine made to fail."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox.config import load_run_config
from blackbox.events import read_events
from blackbox.supervisor import supervisor as sup
from blackbox.supervisor.rules import Rules
from tests.conftest import PROGRAMS, TORCHRUN, job_env, run_blackbox


def run_in_process(run_dir: Path, code: str, said: list[str]) -> int:
    cfg = load_run_config({"run_dir": str(run_dir), "poll_interval": "0.1"}, {})
    return sup.Supervisor([sys.executable, "-c", code], cfg, job_env(), said.append).run()


def test_a_failing_watcher_is_logged_once_and_the_job_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a rule engine that raises on every poll
    def broken(self: Rules, *args: object) -> list[object]:
        raise RuntimeError("boom in the rules")

    monkeypatch.setattr(Rules, "evaluate", broken)
    said: list[str] = []
    # WHEN a job that runs for a few polls is supervised
    code = "import time; time.sleep(1); raise SystemExit(5)"
    rc = run_in_process(tmp_path / "run", code, said)
    # THEN the job's exit code passes through, blackbox said so once, and the event log has the traceback
    assert rc == 5
    assert len([m for m in said if "internal error while watching" in m]) == 1
    errors = [e for e in read_events(str(tmp_path / "run" / "events.jsonl")) if e["event"] == "error"]
    assert len(errors) == 1 and "boom in the rules" in str(errors[0]["traceback"])


def test_not_linux_runs_the_job_unwatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sup.sys, "platform", "darwin")
    said: list[str] = []
    rc = run_in_process(tmp_path / "run", "raise SystemExit(4)", said)
    assert rc == 4
    assert said == ["cannot watch on darwin (blackbox reads /proc, which only Linux has); running the job unwatched"]
    assert not os.path.exists(tmp_path / "run")


def test_a_full_filesystem_never_stops_a_rank(tmp_path: Path) -> None:
    # GIVEN a run directory on a filesystem with no space left (a 64 KiB tmpfs, filled)
    import shutil

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        (mnt / "runs").mkdir()
        with open(mnt / "fill", "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * 128 * 1024)
        # WHEN a 2-rank job runs under blackbox there
        job = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(PROGRAMS / "gloo_job.py"), "--steps", "5"]
        res = run_blackbox(["run", "--run-dir", str(mnt / "runs" / "r"), "--", *job], tmp_path)
        err = res.stderr.decode()
        # THEN every rank runs to its end (no SIGBUS from an unbacked heartbeat page) and the exit code is the job's
        assert res.returncode == 0, err[-3000:]
        assert "SIGBUS" not in err and "internal error" not in err, err[-3000:]
        assert res.stdout.count(b"done") == 2
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(mnt, ignore_errors=True)


def test_an_existing_run_dir_keeps_its_modes(tmp_path: Path) -> None:
    # GIVEN a shared group directory given as --run-dir
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2775)
    res = run_blackbox(["run", "--run-dir", str(shared), "--", sys.executable, "-c", "print('hi')"], tmp_path)
    assert res.returncode == 0, res.stderr
    # THEN its modes are as they were; what blackbox made inside it is private
    assert shared.stat().st_mode & 0o7777 == 0o2775
    assert (shared / "bundles").stat().st_mode & 0o777 == 0o700
    assert (shared / "console.log").stat().st_mode & 0o777 == 0o600
