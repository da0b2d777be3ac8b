"""GPU facts, the one module that talks to NVML (`nvidia-ml-py`, optional) or `nvidia-smi`; "no GPU" where
neither exists, and a fake with scripted readings (BLACKBOX_FAKE_GPUS, for tests on machines without a GPU).
May import the stdlib, and pynvml when it is installed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Optional

ENV_FAKE = "BLACKBOX_FAKE_GPUS"  # a JSON file: a list of readings (GpuReading fields), used instead of the GPU
_QUERY = (
    "index,name,temperature.gpu,utilization.gpu,memory.used,memory.total,power.draw,"
    "ecc.errors.uncorrected.volatile.total"
)


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    temperature_c: Optional[float]
    utilization_pct: Optional[float]
    memory_used_mib: Optional[float]
    memory_total_mib: Optional[float]
    power_w: Optional[float] = None
    ecc_uncorrected: Optional[float] = None
    throttle: Optional[str] = None  # active clock throttle reasons, comma-separated ("hw_thermal,sw_power")
    slowdown_temp_c: Optional[float] = None  # where the GPU starts slowing itself down

    def describe(self) -> str:
        def num(v: Optional[float], unit: str) -> str:
            return "?" if v is None else f"{v:g}{unit}"

        return (
            f"GPU{self.index} {self.name} {num(self.temperature_c, 'C')} util {num(self.utilization_pct, '%')} "
            f"mem {num(self.memory_used_mib, '')}/{num(self.memory_total_mib, ' MiB')}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(text: str) -> Optional[float]:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


_fake_calls: dict[str, int] = {}


def _fake(path: str) -> tuple[list[GpuReading], str]:
    """A list of readings (the same every time), or {"samples": [[...], [...]]}: one list per call, in order,
    the last one repeated — scripted GPU behaviour for tests."""
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict):
            samples = data["samples"]
            n = _fake_calls.get(path, 0)
            _fake_calls[path] = n + 1
            rows = samples[min(n, len(samples) - 1)]
        else:
            rows = data
        return [GpuReading(**row) for row in rows], f"fake GPUs from {ENV_FAKE}={path}"
    except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
        return [], f"{ENV_FAKE}={path} could not be read: {exc}"


_THROTTLE_BITS = {0x2: "sw_power", 0x4: "sw_thermal", 0x8: "hw_slowdown", 0x20: "sw_power_cap", 0x40: "hw_thermal",
                  0x80: "hw_power_brake"}  # fmt: skip


def is_fake() -> bool:
    return bool(os.environ.get(ENV_FAKE))


NO_GPU_TOOLS = "no GPU (neither NVML nor nvidia-smi found)"  # query_gpus' word where the host has no GPU tools


def cheap() -> bool:
    """Whether a reading costs no process start (NVML or the fake): then it may be taken every poll."""
    import importlib.util

    return is_fake() or importlib.util.find_spec("pynvml") is not None


@contextlib.contextmanager
def _nvml_session() -> Iterator[Any]:
    """NVML initialised for the block, or None where it is not installed or there is no driver."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:
        yield None  # no driver: the caller falls back (nvidia-smi says why)
        return
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvml() -> Optional[tuple[list[GpuReading], str]]:
    with _nvml_session() as pynvml:
        if pynvml is None:
            return None
        readings = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)

            def get(fn: Any, *args: Any, h: Any = h) -> Any:
                try:
                    return fn(h, *args)
                except Exception:
                    return None

            name = get(pynvml.nvmlDeviceGetName)
            mem = get(pynvml.nvmlDeviceGetMemoryInfo)
            util = get(pynvml.nvmlDeviceGetUtilizationRates)
            power = get(pynvml.nvmlDeviceGetPowerUsage)
            ecc = get(pynvml.nvmlDeviceGetTotalEccErrors, 1, 0)  # uncorrected, volatile
            mask = get(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
            slowdown = get(pynvml.nvmlDeviceGetTemperatureThreshold, 1)  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            throttle = ",".join(n for bit, n in _THROTTLE_BITS.items() if mask and mask & bit) or None
            readings.append(GpuReading(
                i, name.decode() if isinstance(name, bytes) else str(name),
                get(pynvml.nvmlDeviceGetTemperature, 0), None if util is None else float(util.gpu),
                None if mem is None else mem.used / 2**20, None if mem is None else mem.total / 2**20,
                None if power is None else power / 1000.0, None if ecc is None else float(ecc), throttle,
                None if slowdown is None else float(slowdown),
            ))  # fmt: skip
        return readings, "NVML"


def query_gpus(timeout: float = 3.0) -> tuple[list[GpuReading], str]:
    """(readings, how): `how` names the source, or says why there is none."""
    fake = os.environ.get(ENV_FAKE)
    if fake:
        return _fake(fake)
    nvml = _nvml()
    if nvml is not None:
        return nvml
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], NO_GPU_TOOLS
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return [], f"nvidia-smi failed: {out.stderr.strip() or out.stdout.strip()}"
    readings: list[GpuReading] = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 8:
            continue
        idx = _num(parts[0])
        temp, util, used, total, power, ecc = (_num(p) for p in parts[2:8])
        readings.append(GpuReading(int(idx) if idx is not None else len(readings), parts[1], temp, util, used, total,
                                   power, ecc))  # fmt: skip
    return readings, "nvidia-smi"


def process_gpus() -> Optional[dict[int, list[int]]]:
    """pid -> the GPU indices it holds a context on, from NVML's per-process lists; None without NVML."""
    with _nvml_session() as pynvml:
        if pynvml is None:
            return None
        out: dict[int, list[int]] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
            except Exception:
                continue
            for p in procs:
                out.setdefault(int(p.pid), []).append(i)
        return out


def rank_gpus(ranks: dict[int, tuple[int, dict[str, str]]]) -> tuple[dict[int, list[int]], str]:
    """rank -> GPU indices, and which method said so: NVML's per-process list (the truth, where NVML is there),
    else the rank's CUDA_VISIBLE_DEVICES and LOCAL_RANK (the usual one-GPU-per-local-rank layout).
    `ranks`: rank -> (pid, environment)."""
    by_pid = process_gpus()
    if by_pid:
        found = {rank: by_pid[pid] for rank, (pid, _) in ranks.items() if pid in by_pid}
        if found:
            return found, "NVML per-process list"
    out: dict[int, list[int]] = {}
    for rank, (_, env) in ranks.items():
        try:
            local = int(env.get("LOCAL_RANK", ""))
        except ValueError:
            continue
        visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if visible:
            if local < len(visible) and visible[local].isdigit():
                out[rank] = [int(visible[local])]
            elif len(visible) == 1 and visible[0].isdigit():
                out[rank] = [int(visible[0])]
        else:
            out[rank] = [local]
    return out, "CUDA_VISIBLE_DEVICES and LOCAL_RANK"
