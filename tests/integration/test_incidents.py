"""Incident memory end to end: a real data hang under `blackbox run` is indexed, a fix and a clean rerun are
linked to it, and when the same failure comes back (another run: other pids, other times) `blackbox run` and
`blackbox report` show the earlier incident with its verified fix first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, BLACKBOX, ROOT, job_env

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"


def run_scenario(
    tmp: Path, run_dir: Path, scenario: str, rank: int, config: Path, env: dict[str, str]
) -> tuple[int, str]:
    cmd = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", "4", "--poll-interval", "0.5",
           "--kill-grace", "5", "--", str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(TRAIN),
           scenario, str(rank), str(config)]  # fmt: skip
    res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
    return res.returncode, res.stderr


def cli(env: dict[str, str], *args: str) -> Any:
    res = subprocess.run([*BLACKBOX, *args], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.long
def test_an_incident_is_linked_to_its_fix_and_recognised_when_it_returns(tmp_path: Path) -> None:
    env = job_env(BLACKBOX_HOME=str(tmp_path / "home"))
    config = tmp_path / "train.yaml"
    config.write_text("batch_size: 4\nnum_workers: 0\napi_token: hunter2-secret-value\n")
    code, err = run_scenario(tmp_path, tmp_path / "first", "data-hang", 1, config, env)
    assert code == 86, err[-3000:]
    assert "seen before" not in err
    (first,) = cli(env, "incidents", "list", "--format", "json")["incidents"]
    assert first["category"] == "hang.data_loading" and first["top_frame"] == "__getitem__ (train.py)"
    shown = cli(env, "incidents", "show", str(first["id"]), "--format", "json")
    assert shown["config_name"].endswith("train.yaml") and "batch_size: 4" in shown["config"]
    assert "hunter2" not in shown["config"]

    # the fix: a new config and a rerun that exits cleanly
    fixed = tmp_path / "train-fixed.yaml"
    fixed.write_text("batch_size: 8\nnum_workers: 0\napi_token: hunter2-secret-value\n")
    code, err = run_scenario(tmp_path, tmp_path / "rerun", "healthy", 1, fixed, env)
    assert code == 0, err[-3000:]
    linked = cli(
        env,
        "incidents",
        "link",
        str(first["id"]),
        "--fix-commit",
        "3f2a9c1",
        "--fix-config",
        str(fixed),
        "--rerun",
        str(tmp_path / "rerun"),
        "--note",
        "shard 3 moved off the dead mount",
        "--format",
        "json",
    )
    link = linked["link"]
    assert link["status"] == "verified" and link["rerun_outcome"].startswith("clean exit"), link
    assert "-batch_size: 4" in link["config_diff"] and "+batch_size: 8" in link["config_diff"], link["config_diff"]
    assert "hunter2" not in json.dumps(linked)
    assert cli(env, "incidents", "show", str(first["id"]), "--format", "json")["links"][0]["fix_commit"] == "3f2a9c1"

    # the same failure again, in another run: blackbox says at once what fixed it last time
    code, err = run_scenario(tmp_path, tmp_path / "again", "data-hang", 1, config, env)
    assert code == 86, err[-3000:]
    assert f"seen before: incident #{first['id']}" in err and "verified in 3f2a9c1" in err, err[-3000:]
    report = cli(env, "report", str(tmp_path / "again"), "--format", "json", "--no-fr-analyzer")
    seen = report["similar_incidents"]
    assert seen and seen[0]["id"] == first["id"] and seen[0]["match"] == "same", seen
    assert seen[0]["fix"]["status"] == "verified" and seen[0]["fix"]["fix_commit"] == "3f2a9c1"
    listed = cli(env, "incidents", "list", "--format", "json")["incidents"]
    assert len(listed) == 2 and listed[0]["fingerprint"] == listed[1]["fingerprint"]
    assert listed[0]["run_id"] != listed[1]["run_id"]
