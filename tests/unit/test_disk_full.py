"""A full disk while a bundle is written is the machine's state, not blackbox's bug: one sentence that says the
disk is full, where, and what was kept — from `blackbox collect` (non-zero exit) and under `blackbox run`."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from blackbox.collect import collector as C
from blackbox.collect.job import Job, RankTarget


def _full(*_: Any, **__: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_collect_says_the_disk_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blackbox.cli.main import main

    job = Job("run-1", "node0", ["torchrun", "train.py"], str(tmp_path), {}, None, None,
              [RankTarget(0, os.getpid(), 0, True)], 1)  # fmt: skip
    monkeypatch.setattr("blackbox.collect.manual.discover", lambda pid: job)
    monkeypatch.setattr(C.Collector, "collect", _full)
    monkeypatch.setenv("BLACKBOX_HOME", str(tmp_path / "home"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["collect", str(os.getpid()), "--out", str(tmp_path / "out")])
    said = [line for line in err.getvalue().splitlines() if line.startswith("blackbox: error:")]
    assert code != 0 and len(said) == 1, err.getvalue()
    assert f"The disk holding `{tmp_path / 'out'}` is full" in said[0] and "no bundle was written" in said[0]
    assert "what was written there before is kept" in said[0] and "internal error" not in err.getvalue()


def test_a_run_says_the_disk_is_full_not_an_internal_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blackbox.detections import Trigger
    from blackbox.supervisor.evidence import Evidence

    told: list[str] = []
    ctx = SimpleNamespace(
        watching=False, run_id="run-1", node="node0", argv=["torchrun"], run_dir=str(tmp_path), cwd=str(tmp_path),
        console=None,
        cfg=SimpleNamespace(dump_timeout=1.0, collect_budget=5.0, pyspy_native=False, pyspy_locals=False),
        events=None, job_env=lambda: {}, say=told.append, say_once=lambda key, m: told.append(m),
        event=lambda *a, **k: None, internal_error=lambda where, exc: told.append(f"internal error: {exc!r}"),
    )  # fmt: skip
    watch = SimpleNamespace(history={}, gpus=SimpleNamespace(samples=lambda: {}), rank_gpus=lambda views: ({}, ""),
                            table=None, io=SimpleNamespace(rebase=lambda: None))  # fmt: skip
    evidence = Evidence.__new__(Evidence)
    evidence.ctx, evidence.process, evidence.watch, evidence.console = ctx, SimpleNamespace(launched=None), watch, None
    monkeypatch.setattr(C.Collector, "collect", _full)
    assert evidence.write(Trigger("stall"), None, True, {}, None) is None
    full = [m for m in told if "is full" in m]
    assert len(full) == 1 and f"`{tmp_path / 'bundles'}`" in full[0] and "the job goes on" in full[0], told
    assert not any("internal error" in m for m in told), told
