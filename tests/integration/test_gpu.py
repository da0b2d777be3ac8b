"""GPU-only paths: a real CUDA out-of-memory error leaves its record and a memory snapshot recorded with
CUDA memory history; a rank holding the GIL on NCCL has its flight recorder written by torch's watchdog through the
debug pipe. Marked `gpu`: skipped where CUDA is absent, run where a GPU is lent (BB_GPU_FIXTURES=DIR keeps the
bundles there)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from blackbox.bundle.reader import read_bundle
from tests.conftest import PROGRAMS, ROOT, TORCHRUN, bundles, run_blackbox

pytestmark = pytest.mark.gpu


def test_cuda_oom_leaves_record_and_memory_snapshot(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--cuda-memory-history", "10000", "--",
                        sys.executable, str(PROGRAMS / "cuda_oom.py")], tmp_path)  # fmt: skip
    assert res.returncode == 1 and b"OutOfMemoryError" in res.stderr
    rank_dir = run_dir / "ranks" / "0"
    (record,) = [json.loads(line) for line in (rank_dir / "oom.jsonl").read_text().splitlines()]
    assert "Tried to allocate" in record["message"]
    assert record["last_batch"] == [{"path": "batch", "shape": [4, 3, 32, 32], "dtype": "float32"}]
    snapshot = rank_dir / record["memory_snapshot"]
    assert snapshot.stat().st_size > 0
    versions = json.loads((rank_dir / "rank.json").read_text())["versions"]
    assert versions["cuda"] and versions.get("nccl")


def test_gpu_facts_come_from_nvml_or_nvidia_smi() -> None:
    from blackbox.adapters import gpu

    readings, how = gpu.query_gpus(10.0)
    assert how in ("NVML", "nvidia-smi") and readings
    g = readings[0]
    assert g.name and g.memory_total_mib and g.temperature_c is not None and g.utilization_pct is not None


def test_a_rank_holding_the_gil_on_nccl_has_its_flight_recorder_from_the_watchdog(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = [TORCHRUN, "--standalone", "--nproc-per-node", "1", str(ROOT / "scripts" / "gpu_scenarios.py"), "--case",
           "nccl-gil"]  # fmt: skip  # the GPU check's row of the same name
    res = run_blackbox(["run", "--run-dir", str(run_dir), "--stall-timeout", "4", "--kill-grace", "3", "--", *job],
                       tmp_path, timeout=240)  # fmt: skip
    assert res.returncode == 86, res.stderr[-3000:]
    (bundle,) = bundles(run_dir)
    if os.environ.get("BB_GPU_FIXTURES"):
        shutil.copy(bundle, os.environ["BB_GPU_FIXTURES"])
    files = read_bundle(str(bundle)).files
    (step,) = [s for s in json.loads(files["manifest.json"])["steps"] if s["name"] == "rank dumps"]
    assert "the flight recorder of rank(s) [0] written by torch's NCCL watchdog" in step["detail"], step
    assert "flight_recorder/fr_trace_0" in files
