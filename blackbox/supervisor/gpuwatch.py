"""Watching the GPUs from `blackbox run`: readings at the poll interval (NVML or the fake: every poll; nvidia-smi:
at most every 10 s, a process each; on a host with neither, one try), a bounded history per GPU for the bundles,
how long every GPU has sat at 0 %, and events for a hot, throttling or newly erroring GPU. Pure but for the adapter
call; no printing. Imports the stdlib and blackbox's GPU adapter."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional

from ..adapters import gpu

HISTORY_SAMPLES = 1000  # per GPU
SLOW_SOURCE_INTERVAL_S = 10.0  # nvidia-smi: one process per reading
HOT_C = 85.0  # when the GPU does not say where it slows down


class GpuWatch:
    def __init__(self, read: Callable[[], tuple[list[gpu.GpuReading], str]] = gpu.query_gpus) -> None:
        self._read = read
        self._interval = 0.0 if gpu.cheap() else SLOW_SOURCE_INTERVAL_S
        self._next = 0.0
        self.source = ""
        self.history: dict[int, deque[dict[str, Any]]] = {}
        self.idle_since: Optional[float] = None  # monotonic time since which every GPU reads 0 %
        self.seen_gpus = False
        self._last: dict[int, gpu.GpuReading] = {}
        self._hot: set[int] = set()

    def sample(self, now: float) -> list[dict[str, Any]]:
        """Take a reading when one is due; returns the events it gives (hot, throttle, ecc), each once."""
        if now < self._next:
            return []
        self._next = now + self._interval
        readings, self.source = self._read()
        if not readings:
            if self.source == gpu.NO_GPU_TOOLS and not self.seen_gpus:
                self._next = float("inf")  # a host without NVML or nvidia-smi: none comes mid-job, stop asking
            return []
        self.seen_gpus = True
        wall = time.time()
        events: list[dict[str, Any]] = []
        for g in readings:
            self.history.setdefault(g.index, deque(maxlen=HISTORY_SAMPLES)).append({"t": round(wall, 3), **g.to_json()})
            before = self._last.get(g.index)
            limit = g.slowdown_temp_c or HOT_C
            if g.temperature_c is not None and g.temperature_c >= limit and g.index not in self._hot:
                self._hot.add(g.index)
                hot = f"GPU {g.index} is at {g.temperature_c:g}C (slows down at {limit:g}C)"
                events.append({"event": "gpu_hot", "gpu": g.index, "temperature_c": g.temperature_c, "limit_c": limit,
                               "message": hot})  # fmt: skip
            elif g.temperature_c is not None and g.temperature_c < limit - 5:
                self._hot.discard(g.index)
            if g.throttle and (before is None or before.throttle != g.throttle):
                events.append({"event": "gpu_throttle", "gpu": g.index, "reasons": g.throttle,
                               "temperature_c": g.temperature_c,
                               "message": f"GPU {g.index} is throttling its clocks ({g.throttle})"})  # fmt: skip
            if (g.ecc_uncorrected or 0) > ((before.ecc_uncorrected or 0) if before else 0):
                events.append(
                    {
                        "event": "gpu_ecc",
                        "gpu": g.index,
                        "uncorrected": g.ecc_uncorrected,
                        "message": f"GPU {g.index} reports new uncorrected ECC errors ({g.ecc_uncorrected:g})",
                    }
                )
            self._last[g.index] = g
        idle = all(g.utilization_pct == 0 for g in readings)
        if not idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        return events

    def idle_for(self, now: float) -> float:
        return 0.0 if self.idle_since is None else now - self.idle_since

    def latest(self) -> list[gpu.GpuReading]:
        return [self._last[i] for i in sorted(self._last)]

    def samples(self) -> dict[str, list[dict[str, Any]]]:
        return {str(index): list(h) for index, h in sorted(self.history.items())}
