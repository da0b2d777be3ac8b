"""Before ending a job, be sure: a stall whose rank moves again while its evidence is collected (or in the two
seconds after) is closed as not a stall — no verdict, no alarm, the job goes on and exits as it would have, the
bundle kept. Real torchrun, gloo, DDP (tests/programs/quiet_job.py nap: rank 0 sleeps 1.5 s past the stall timeout
while rank 1 waits at a barrier). Every real hang of the galleries is still ended (tests/integration/test_quiet.py,
test_scenarios.py): there nothing moves in the confirmation either."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from blackbox.events import read_events
from tests.conftest import BLACKBOX, PROGRAMS, TORCHRUN, job_env, kill_tree

STALL_S = 4.0


@pytest.mark.timeout(240)
def test_a_rank_that_moves_while_the_evidence_is_collected_is_not_ended(tmp_path: Path) -> None:
    # GIVEN a healthy job whose rank 0 sleeps 1.5 s longer than the stall timeout, and an alarm command
    alarms = tmp_path / "alarms.txt"
    run_dir = tmp_path / "run"
    cmd = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", str(STALL_S), "--poll-interval", "0.5",
           "--on-incident", f"echo $BLACKBOX_TRIGGER >> {alarms}", "--", TORCHRUN, "--standalone",
           "--nproc-per-node", "2", str(PROGRAMS / "quiet_job.py"), "nap"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=job_env(BB_PAUSE_S=str(STALL_S + 1.5)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)
    events = read_events(str(run_dir / "events.jsonl"))
    # THEN the stall was detected and its evidence collected ...
    assert [e for e in events if e["event"] == "stall"], err[-3000:]
    (bundle,) = [e["path"] for e in events if e["event"] == "bundle"]
    assert Path(bundle).exists()
    # ... but rank 0 stepped again before it was confirmed: not a stall, said once, the bundle kept
    (cleared,) = [e for e in events if e["event"] == "not_a_stall"]
    assert cleared["rule"] == "stall" and cleared["bundle"] == bundle and cleared["moved"].startswith("rank 0 moved")
    assert "not a stall after all: rank 0 moved" in err and "the job goes on, no alarm sent" in err, err[-3000:]
    # AND no verdict, no alarm, the job never ended: it finished and exited 0 as it would have without blackbox
    assert not [e for e in events if e["event"] in ("verdict", "ending", "end_job")], events
    assert not alarms.exists(), alarms.read_text()
    assert "verdict:" not in err
    assert proc.returncode == 0, err[-3000:]
    assert "rank 0: paused" in out and out.count(": done") == 2, out[-2000:]
