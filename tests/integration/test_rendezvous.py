"""A rank that never reaches init_process_group (the gallery's init-hang: rank 1 reads its config from a mount that
stopped answering, a FIFO, before it joins) while rank 0 waits for it in the rendezvous, on a real torchrun job under
`blackbox run`: each rank's recorder marks its heartbeat as it enters init_process_group and as it returns, so
`blackbox status`, read from another process, names who waits and who has not arrived; and the still rank's
definite leaf ends the job at the stall timeout given, though no rank has taken a step."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from blackbox.events import read_events
from tests.conftest import BLACKBOX, ROOT, TORCHRUN, job_env, kill_tree

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"


def status(run_dir: Path) -> dict[str, Any]:
    res = subprocess.run([*BLACKBOX, "status", str(run_dir), "--format", "json"], capture_output=True, text=True,
                         timeout=60, env=job_env())  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.timeout(180)
def test_status_names_the_rank_that_has_not_joined_and_its_leaf_ends_the_job(tmp_path: Path) -> None:
    # GIVEN the job under `blackbox run`: rank 1 blocks before init_process_group, rank 0 waits in the rendezvous
    run_dir = tmp_path / "run"
    argv = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", "15", "--kill-grace", "3", "--",
            TORCHRUN, "--standalone", "--nproc-per-node", "2", str(TRAIN), "init-hang", "1", "ddp"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # WHEN `blackbox status` reads the run while they wait
        seen: Optional[dict[str, Any]] = None
        deadline = time.monotonic() + 60
        while seen is None and time.monotonic() < deadline and proc.poll() is None:
            now = status(run_dir) if (run_dir / "events.jsonl").exists() else {}
            seen = now if now.get("rendezvous") else None
            time.sleep(0.5)
        # THEN it says rank 0 waits inside init_process_group for rank 1, which has not called it: at step 0, in
        # its start-up, and its stage and join mark say so
        assert seen is not None, "status never said who has not joined"
        assert {k: seen["rendezvous"][k] for k in ("world_size", "waiting", "not_arrived", "elsewhere")} == {
            "world_size": 2, "waiting": [0], "not_arrived": [1], "elsewhere": 0}, seen["rendezvous"]  # fmt: skip
        by_rank = {r["rank"]: r for r in seen["ranks"]}
        assert (by_rank[0]["join"], by_rank[0]["stage"]) == ("joining", "rendezvous"), by_rank[0]
        assert (by_rank[1]["join"], by_rank[1]["stage"], by_rank[1]["step"]) == ("", "startup", 0), by_rank[1]
        out = subprocess.run([*BLACKBOX, "status", str(run_dir)], capture_output=True, text=True, timeout=60,
                             env=job_env()).stdout  # fmt: skip
        assert "rendezvous: rank 0 waits in init_process_group (still for " in out, out
        assert "for 1 of 2 ranks: rank 1 (pid " in out and "has not called it — step 0, phase startup" in out, out
        # AND the stall rule ends the job on rank 1's leaf (a FIFO) at the timeout given, no step taken by anyone
        _, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)  # whatever is left of its tree (it reaps blackbox, if still there)
    assert proc.returncode == 86, err[-3000:]
    (stall,) = [e for e in read_events(str(run_dir / "events.jsonl")) if e.get("event") == "stall"]
    rules = {f["rank"]: f["timeout_rule"] for f in stall["findings"]}
    assert rules.get(1) == "leaf fifo", stall
    assert "verdict: hang.io, suspect rank(s) 1" in err.decode(), err[-3000:]
