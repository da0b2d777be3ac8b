"""GPU facts through `nvidia-smi` (NVML comes with the GPU watch); "no GPU" where neither exists.
May import the stdlib only."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

_QUERY = "index,name,temperature.gpu,utilization.gpu,memory.used,memory.total"


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    temperature_c: Optional[float]
    utilization_pct: Optional[float]
    memory_used_mib: Optional[float]
    memory_total_mib: Optional[float]

    def describe(self) -> str:
        def num(v: Optional[float], unit: str) -> str:
            return "?" if v is None else f"{v:g}{unit}"

        return (
            f"GPU{self.index} {self.name} {num(self.temperature_c, 'C')} util {num(self.utilization_pct, '%')} "
            f"mem {num(self.memory_used_mib, '')}/{num(self.memory_total_mib, ' MiB')}"
        )


def _num(text: str) -> Optional[float]:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def query_gpus(timeout: float = 3.0) -> tuple[list[GpuReading], str]:
    """(readings, how): `how` names the source, or says why there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "no GPU (nvidia-smi not found)"
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
        if len(parts) != 6:
            continue
        idx = _num(parts[0])
        readings.append(
            GpuReading(int(idx) if idx is not None else len(readings), parts[1], _num(parts[2]), _num(parts[3]),
                       _num(parts[4]), _num(parts[5]))
        )  # fmt: skip
    return readings, "nvidia-smi"
