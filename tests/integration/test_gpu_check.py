"""scripts/gpu_check.sh end to end where no GPU is lent: the wheel is installed into a temporary folder, a fake
`nvidia-smi` is on PATH and torch sees no CUDA; the check must reach its table, say "no CUDA" on every GPU row, run
`blackbox doctor`, and leave the table and doctor's JSON in $OUT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

GPU_ROWS = (
    "nccl-queued",
    "nccl-watchdog",
    "nccl-gil",
    "gpu-spin",
    "loader-hang",
    "stopped",
    "cuda-oom",
    "nvml-status",
    "nccl-gil-collect",
)


def test_gpu_check_reaches_its_table_without_cuda(tmp_path: Path) -> None:
    wheels, fake, out = tmp_path / "whl", tmp_path / "bin", tmp_path / "out"
    fake.mkdir()
    out.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-fake)"\n')
    (fake / "nvidia-smi").chmod(0o755)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300)  # fmt: skip
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "GPU_PYTHON": sys.executable,
           "GPU_CHECK_WHEELS": str(wheels), "GPU_CHECK_ROW_S": "60", "OUT": str(out),
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    env.pop("PYTHONPATH", None)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=240)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr  # rows that did not run fail the check
    assert "CUDA no CUDA" in res.stdout and "nvidia-smi yes" in res.stdout
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.split() and line.endswith(
        ("ok", "DIFFERS", "NOT RUN"))}  # fmt: skip
    for row in GPU_ROWS:
        assert "NOT RUN: no CUDA" in lines[row], lines.get(row)
    assert lines["doctor"].endswith("ok") and "py-spy" in lines["doctor"]
    assert "FAILED: 9 of 10" in res.stderr
    assert (out / "gpu_check_table.txt").read_text().splitlines()[0].split() == ["row", "expected", "got", "result"]
    assert (out / "doctor.json").stat().st_size > 0
