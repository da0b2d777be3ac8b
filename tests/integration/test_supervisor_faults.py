"""A bug in blackbox's own watching code never costs the job: it is logged once and the job goes on.
The supervisor runs in this process here, over a real child job, with its rule engine made to fail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from blackbox.config import load_run_config
from blackbox.events import read_events
from blackbox.supervisor import supervisor as sup
from blackbox.supervisor.rules import Rules
from tests.conftest import job_env


def run_in_process(run_dir: Path, code: str, said: list[str]) -> int:
    cfg = load_run_config({"run_dir": str(run_dir), "poll_interval": "0.1"}, {})
    return sup.Supervisor([sys.executable, "-c", code], cfg, job_env(), said.append).run()


def test_a_failing_watcher_is_logged_once_and_the_job_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a rule engine that raises on every poll
    def broken(self: Rules, views: object, now: float) -> list[object]:
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
