"""Fail-slow on real DDP jobs (scripts/scenarios/train.py's pace scenarios, under `blackbox run` with its default
straggler settings): a rank slower in its loader and one slower in its own compute are named, with the phase,
within 60 s of the onset — in events.jsonl, on stderr and the status line, by `blackbox status`, `blackbox top` and
the report of a bundle taken meanwhile; a steady two-minute run and one whose every rank jitters are never named.
The four jobs run side by side (their steps mostly sleep): about two minutes in all."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from blackbox.events import read_events
from blackbox.render.html import render_html
from tests.conftest import BLACKBOX, ROOT, TORCHRUN, bundles, job_env, wait_for

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
JOBS = {  # scenario: steps (about 70 s for a straggler's job, 120 s for the others)
    "data-straggler": 500, "compute-straggler": 500, "steady": 2100, "jitter": 1450,
}  # fmt: skip


def start(scenario: str, run_dir: Path, cwd: Path) -> subprocess.Popen[str]:
    cmd = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--status-interval", "10", "--", TORCHRUN, "--standalone",
           "--nproc-per-node", "2", str(TRAIN), scenario, "1", "ddp"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=cwd, env=job_env(BB_STEPS=str(JOBS[scenario])), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(str(run_dir / "events.jsonl")) if e.get("event") == name]


def top_frames(run_dir: Path) -> list[str]:
    """`blackbox top` in a real pseudo-terminal: the whole frames it drew over two seconds; then `q`, which must end
    it."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: blackbox top on the pty
        os.environ.update(job_env(COLUMNS="160", LINES="40", TERM="xterm"))
        os.execv(sys.executable, [sys.executable, "-m", "blackbox", "top", str(run_dir), "--interval", "0.5"])
    screen = b""
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                screen += os.read(fd, 65536)
            except OSError:
                break
    os.write(fd, b"q")
    for _ in range(100):  # it quits on `q` at once
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("blackbox top did not quit on q")
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    # whole frames: the rank table's bottom border drawn (the 2.5 s may end in the middle of a frame: on a loaded
    # machine a fresh-clone run cut the last one after rank 0's row)
    return [f for f in screen.decode("utf-8", "replace").split("blackbox top (q quits)") if "rank" in f and "└" in f]


@pytest.mark.timeout(360)
@pytest.mark.long
def test_stragglers_are_named_and_steady_jobs_are_not(tmp_path: Path) -> None:
    runs = {name: tmp_path / name for name in JOBS}
    procs = {name: start(name, runs[name], tmp_path) for name in JOBS}
    try:
        # WHEN each straggler has been slow for a minute, at most
        for name, phase in (("data-straggler", "data"), ("compute-straggler", "compute")):
            (named,) = wait_for(lambda name=name: events(runs[name], "straggler"), 100, f"{name}'s straggler event")
            # THEN the event names rank 1 and the phase its extra time goes to, within 60 s of the onset (step 3)
            (first,) = [e for e in events(runs[name], "first_step") if e["rank"] == 1]
            assert named["ranks"] == [1] and named["phase"] == phase and named["factor"] > 1.5, named
            assert named["t"] - first["t"] <= 60, (named["t"] - first["t"], named)
            # AND the flight recorder, asked once (the quiet dump request), says rank 1 came to the collectives last
            (fr,) = wait_for(lambda name=name: events(runs[name], "straggler_confirmed"), 30, f"{name}'s confirmation")
            assert fr["agrees"] and fr["collectives"] >= 10 and fr["last_arrivals"]["1"] > fr["last_arrivals"]["0"], fr
        # AND blackbox status says so too, read-only from another process
        run = runs["data-straggler"]
        out = subprocess.run([*BLACKBOX, "status", str(run), "--format", "json"], capture_output=True, text=True,
                             env=job_env(), timeout=60, check=True)  # fmt: skip
        st = json.loads(out.stdout)
        assert st["live"] and st["schema_version"] == 1
        by_rank = {r["rank"]: r for r in st["ranks"]}
        assert by_rank[1]["straggler"] and not by_rank[0]["straggler"]
        assert by_rank[1]["time_share"]["data"] > 0.3 > by_rank[0]["time_share"].get("data", 0.0)
        assert by_rank[0]["time_share"]["backward"] > by_rank[1]["time_share"]["backward"]  # it waits there
        assert st["stragglers"][0]["rank"] == 1 and st["stragglers"][0]["ended"] is None
        # AND blackbox top draws it live: two frames, the steps advancing, rank 1 marked
        frames = top_frames(run)
        assert len(frames) >= 2 and "(straggler)" in frames[-1], frames[-1:]
        # the step column of rank 0's row (rank, pid, stage, step, …)
        steps = [int(line.split("│")[4]) for f in (frames[0], frames[-1]) for line in f.splitlines()
                 if line.startswith("│") and line.split("│")[1].strip() == "0"]  # fmt: skip
        assert len(steps) == 2 and steps[1] > steps[0], steps
        # AND a bundle taken now (SIGUSR1 to blackbox) reports where the time went, and the episode
        os.kill(procs["data-straggler"].pid, signal.SIGUSR1)
        (bundle,) = wait_for(lambda: bundles(run), 60, "the manual bundle")
        report = analyze(read_bundle(str(bundle)))
        shares = {r["rank"]: r["shares"] for r in report.time["ranks"]}
        assert shares[1]["data"] > 0.3 and report.time["data_share"] > 0.15
        assert [(e["rank"], e["phase"], e["ended"]) for e in report.time["stragglers"]] == [(1, "data", None)]
        assert any(f.text.startswith("rank 1 was a straggler") for f in report.findings)
        assert any(f.text.startswith("the flight recorder agrees: rank 1 came last") for f in report.findings)
        page = io.StringIO()
        render_html(report, page)
        assert "Where the time went" in page.getvalue() and "rank 1 (straggler)" in page.getvalue()
        # THEN every job runs to its own end: exit 0, and the steady and jittery ones were never named
        results = {name: p.communicate(timeout=200) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    for name, p in procs.items():
        assert p.returncode == 0, (name, results[name][1][-3000:])
    for name in ("steady", "jitter"):
        assert not events(runs[name], "straggler") and "straggler" not in results[name][1], results[name][1][-2000:]
    err = results["data-straggler"][1]
    assert "blackbox: straggler: rank 1 spends " in err and " of each step in data (others " in err
    assert "blackbox: straggler: the flight recorder agrees: rank 1 came last to " in err
    assert any("STRAGGLER" in line for line in err.splitlines() if line.startswith("blackbox: status:"))
