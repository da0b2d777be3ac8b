"""The GPU adapter's pure parts: mapping ranks to GPUs without NVML, and the scripted fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blackbox.adapters import gpu


def test_rank_to_gpu_from_cuda_visible_devices_and_local_rank() -> None:
    ranks = {0: (10, {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "2,3"}),
             1: (11, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"}),
             2: (12, {"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "5"}),  # one GPU per process, set by the launcher
             3: (13, {"LOCAL_RANK": "3"})}  # fmt: skip
    mapping, how = gpu.rank_gpus(ranks)
    assert mapping == {0: [2], 1: [3], 2: [5], 3: [3]} and how == "CUDA_VISIBLE_DEVICES and LOCAL_RANK"


def test_scripted_fake_readings_advance_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "g.json"
    row = {"index": 0, "name": "A100", "temperature_c": 50, "utilization_pct": 10, "memory_used_mib": 1,
           "memory_total_mib": 2}  # fmt: skip
    fake.write_text(json.dumps({"samples": [[row], [{**row, "utilization_pct": 0}]]}))
    monkeypatch.setenv(gpu.ENV_FAKE, str(fake))
    assert [gpu.query_gpus()[0][0].utilization_pct for _ in range(3)] == [10, 0, 0]
    assert gpu.cheap()


def test_the_watch_asks_once_on_a_host_without_gpu_tools() -> None:
    from blackbox.supervisor.gpuwatch import GpuWatch

    calls: list[float] = []

    def read() -> tuple[list[gpu.GpuReading], str]:
        calls.append(1.0)
        return [], gpu.NO_GPU_TOOLS

    watch = GpuWatch(read)
    for now in range(0, 3600, 5):  # an hour of polls
        assert watch.sample(float(now)) == []
    assert len(calls) == 1 and watch.source == gpu.NO_GPU_TOOLS
    failing = GpuWatch(lambda: ([], "nvidia-smi failed: driver/library version mismatch"))  # asked again later
    failing.sample(0.0)
    assert failing._next < float("inf")
