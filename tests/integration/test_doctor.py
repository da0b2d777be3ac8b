"""`blackbox doctor` tries each check for real on this machine: py-spy attaching to a child, a sample rank's
recorder, SIGUSR1 handlers seen from /proc, the job's torch, the GPU adapter (its fake here), the kernel log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import BLACKBOX, job_env


def doctor(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BLACKBOX, "doctor", "--python", sys.executable, *args], capture_output=True, text=True,
                          env=job_env(**env), cwd=tmp_path, timeout=180)  # fmt: skip


def test_this_machine_passes_and_says_what_it_has(tmp_path: Path) -> None:
    res = doctor(tmp_path, "--format", "json", "--run-dir", str(tmp_path / "runs"))
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    for name in ("recorder", "run-dir", "signals", "py-spy", "torch", "coordination", "incident-index"):
        assert checks[name]["status"] == "ok", checks[name]
    assert (
        "torch 2.13.0" in checks["torch"]["detail"] and "flight recorder (Gloo and NCCL)" in checks["torch"]["detail"]
    )
    assert "--native works" in checks["py-spy"]["detail"]
    assert checks["gpu"]["status"] == "warn" and "no GPU" in checks["gpu"]["detail"]


def test_a_required_check_that_cannot_work_fails_the_run(tmp_path: Path) -> None:
    # no GPU here: required, it fails; with the fake GPU adapter, it passes
    res = doctor(tmp_path, "--require", "gpu")
    assert res.returncode == 1 and "cannot work here: gpu" in res.stdout
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps([{"index": 0, "name": "H100", "temperature_c": 41, "utilization_pct": 97,
                                 "memory_used_mib": 70000, "memory_total_mib": 81559}]))  # fmt: skip
    res = doctor(tmp_path, "--require", "gpu", "--format", "json", BLACKBOX_FAKE_GPUS=str(fake))
    gpu = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "gpu")
    assert res.returncode == 0 and gpu["status"] == "ok" and "GPU0 H100 41C util 97%" in gpu["detail"]


def test_an_unwritable_run_dir_and_a_bad_check_name(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = doctor(tmp_path, "--run-dir", str(blocker / "runs"), "--format", "json")
    run_dir = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "run-dir")
    assert res.returncode == 1 and run_dir["status"] == "fail" and "--run-dir" in run_dir["fix"]
    res = doctor(tmp_path, "--require", "warp-drive")
    assert res.returncode == 2 and "Unknown check(s) `warp-drive`" in res.stderr and "Traceback" not in res.stderr
