"""`--metrics-port`: Prometheus metrics of the run, served by prometheus_client from a thread of the supervisor. A
custom collector renders, at each scrape, what the supervisor already read at its last poll (every rank's heartbeat
reading, the GPU readings) and the counters its events feed: serving never touches the ranks. Never prints: it
speaks through the context. Imports the stdlib and blackbox's host side; prometheus_client lazily (an extra)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Callable

from ..adapters.gpu import GpuReading
from ..detections import life_stage
from .context import RunContext
from .rules import RankView

RATE_WINDOW_S = 30.0  # steps per second: over the last this many seconds of polls
PREFIX = "blackbox_"


class Metrics:
    """The supervisor's latest views, kept for the scrapes, and the counters its events feed. `gpus` and
    `stragglers` are read at each poll, in the supervisor's thread; a scrape reads only what was kept."""

    def __init__(self, ctx: RunContext, run: Callable[[], str], node: Callable[[], str],
                 gpus: Callable[[], list[GpuReading]], stragglers: Callable[[], set[int]]) -> None:  # fmt: skip
        self.ctx = ctx
        self._run = run
        self._node = node
        self._gpus = gpus
        self._stragglers = stragglers
        self._lock = threading.Lock()
        self._views: list[RankView] = []
        self._steps: dict[int, deque[tuple[float, int]]] = {}  # rank -> (poll time, step), the rate window
        self._rates: dict[int, float] = {}
        self._gpu_readings: list[GpuReading] = []
        self._straggling: set[int] = set()
        self.stalls = 0
        self.incidents: dict[str, int] = {}  # category -> count
        self.bundles = 0
        self.uploads: dict[str, int] = {}  # ok / failed -> count
        self.server: Any = None

    # --- feeding (the supervisor's thread) --------------------------------------------------------------
    def start(self, addr: str, port: int) -> bool:
        """Serve on addr:port; False (said once: the job runs on without metrics) when that cannot be done."""
        try:
            from prometheus_client import CollectorRegistry
            from prometheus_client.exposition import start_http_server
        except ImportError:
            self.ctx.say("--metrics-port needs prometheus_client, which is not installed here (pip install "
                         "'torch-blackbox[metrics]'): no metrics are served; the job runs on")  # fmt: skip
            self.ctx.event("metrics", serving=False, error="prometheus_client is not installed")
            return False
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self.server = start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            self.ctx.say(f"cannot serve metrics on {addr}:{port} ({exc.strerror or exc}): no metrics are served; the "
                         "job runs on")  # fmt: skip
            self.ctx.event("metrics", serving=False, addr=addr, port=port, error=str(exc))
            return False
        self.ctx.event("metrics", serving=True, addr=addr, port=port)
        self.ctx.say(f"serving Prometheus metrics on http://{addr}:{port}/metrics")
        return True

    def close(self) -> None:
        server = self.server[0] if isinstance(self.server, tuple) else None
        if server is not None:
            server.shutdown()
            server.server_close()

    def update(self, views: list[RankView], now: float) -> None:
        """Each poll: the views as read, and each rank's steps per second over the rate window."""
        rates: dict[int, float] = {}
        for v in views:
            window = self._steps.setdefault(v.rank, deque())
            if window and window[-1][1] > v.hb.step:  # a restarted rank: its steps begin again
                window.clear()
            window.append((now, v.hb.step))
            while len(window) > 2 and now - window[0][0] > RATE_WINDOW_S:
                window.popleft()
            (t0, s0), (t1, s1) = window[0], window[-1]
            if t1 > t0:
                rates[v.rank] = (s1 - s0) / (t1 - t0)
        gpus, straggling = self._gpus(), self._stragglers()  # read here, in the thread that writes them
        with self._lock:
            self._views = list(views)
            self._rates = rates
            self._gpu_readings, self._straggling = list(gpus), set(straggling)

    def on_event(self, name: str, fields: dict[str, Any]) -> None:
        """Counters from the run's events (RunContext listeners)."""
        with self._lock:
            if name in ("stall", "busy", "frozen"):
                self.stalls += 1
            elif name == "verdict":
                category = str(fields.get("category") or "unknown")
                self.incidents[category] = self.incidents.get(category, 0) + 1
            elif name == "bundle":
                self.bundles += 1
            elif name == "upload":
                key = "ok" if fields.get("ok") else "failed"
                self.uploads[key] = self.uploads.get(key, 0) + 1

    # --- scraping (the server's thread) -----------------------------------------------------------------
    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            views, rates = list(self._views), dict(self._rates)
            gpus, stragglers = list(self._gpu_readings), set(self._straggling)
            stalls, incidents, bundles, uploads = self.stalls, dict(self.incidents), self.bundles, dict(self.uploads)
        run, node = self._run(), self._node()
        now = time.monotonic()
        base = ["run", "node", "rank"]

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return GaugeMetricFamily(PREFIX + name, doc, labels=[*base, *extra])

        up = gauge("rank_up", "1 while the rank's process lives, 0 once it has ended.")
        step = gauge("rank_step", "The rank's optimizer steps so far (its heartbeat).")
        rate = gauge("rank_steps_per_second", f"Steps per second over the last {RATE_WINDOW_S:g} s of polls.")
        idle = gauge("rank_seconds_since_progress", "Seconds since the rank last progressed (a step or a batch).")
        phase = gauge("rank_phase", "1 for the rank's current phase (data, compute, collective, checkpoint, eval…).",
                      ("phase",))  # fmt: skip
        in_phase = gauge("rank_current_phase_seconds", "Seconds the rank has been in its current phase.")
        stage = gauge("rank_stage", "1 for where in its life the rank is (rendezvous, startup, training, exiting, "
                      "exited).", ("stage",))  # fmt: skip
        leaf = gauge("rank_definite_leaf", "1 while the still rank waits at a definite leaf (stopped, fifo, poll: "
                     "judged on the short floor), by name.", ("leaf",))  # fmt: skip
        share = gauge("rank_time_share", "Share of the rank's time spent in each phase since it started (its "
                      "heartbeat's time ledger).", ("phase",))  # fmt: skip
        spent = CounterMetricFamily(PREFIX + "rank_phase_seconds", "Seconds the rank spent in each phase so far.",
                                    labels=[*base, "phase"])  # fmt: skip
        straggler = gauge("rank_straggler", "1 while the supervisor names the rank a straggler.")
        waiting = gauge("rank_waiting_for", "In a Python-visible collective: the lowest rank of this node that has "
                        "not entered it yet (the one it waits for); -1 otherwise.", ("collective",))  # fmt: skip
        seqs = {v.rank: v.hb.collective_seq for v in views if v.alive}
        for v in views:
            hb, labels = v.hb, [run, node, str(v.rank)]
            up.add_metric(labels, 1.0 if v.alive else 0.0)
            stage.add_metric([*labels, life_stage(hb.step, hb.state, v.alive, hb.join == "joining", False)], 1.0)
            step.add_metric(labels, float(hb.step))
            if v.rank in rates:
                rate.add_metric(labels, rates[v.rank])
            if not v.alive:
                continue
            idle.add_metric(labels, max(0.0, now - hb.last_progress))
            phase.add_metric([*labels, hb.phase], 1.0)
            if v.leaf:
                leaf.add_metric([*labels, v.leaf], 1.0)
            in_phase.add_metric(labels, max(0.0, now - hb.phase_start))
            times = hb.time_spent(now)
            total = sum(times.values())
            for p, seconds in sorted(times.items()):
                spent.add_metric([*labels, p], seconds)
                if total > 0:
                    share.add_metric([*labels, p], seconds / total)
            straggler.add_metric(labels, 1.0 if v.rank in stragglers else 0.0)
            behind = [r for r, s in seqs.items() if r != v.rank and s < hb.collective_seq]
            waits = hb.phase == "collective" and behind
            waiting.add_metric([*labels, hb.collective if waits else ""], float(min(behind)) if waits else -1.0)
        yield from (up, step, rate, idle, phase, in_phase, stage, leaf, share, straggler, waiting)
        yield spent

        node_labels = ["run", "node", "gpu", "name"]
        util = GaugeMetricFamily(PREFIX + "gpu_utilization_ratio", "GPU utilisation (0-1), where NVML is present.",
                                 labels=node_labels)  # fmt: skip
        mem = GaugeMetricFamily(PREFIX + "gpu_memory_used_bytes", "GPU memory in use.", labels=node_labels)
        mem_total = GaugeMetricFamily(PREFIX + "gpu_memory_total_bytes", "GPU memory in all.", labels=node_labels)
        temp = GaugeMetricFamily(PREFIX + "gpu_temperature_celsius", "GPU temperature.", labels=node_labels)
        for g in gpus:
            labels = [run, node, str(g.index), g.name]
            if g.utilization_pct is not None:
                util.add_metric(labels, g.utilization_pct / 100.0)
            if g.memory_used_mib is not None:
                mem.add_metric(labels, g.memory_used_mib * 1024 * 1024)
            if g.memory_total_mib is not None:
                mem_total.add_metric(labels, g.memory_total_mib * 1024 * 1024)
            if g.temperature_c is not None:
                temp.add_metric(labels, g.temperature_c)
        yield from (util, mem, mem_total, temp)

        run_labels = ["run", "node"]
        c = CounterMetricFamily(PREFIX + "stalls", "Stalls (and busy or frozen ranks) detected on this node.",
                                labels=run_labels)  # fmt: skip
        c.add_metric([run, node], float(stalls))
        yield c
        c = CounterMetricFamily(PREFIX + "incidents", "Incidents analysed on this node, by verdict category.",
                                labels=[*run_labels, "category"])  # fmt: skip
        for category, n in sorted(incidents.items()):
            c.add_metric([run, node, category], float(n))
        yield c
        c = CounterMetricFamily(PREFIX + "bundles", "Evidence bundles written on this node.", labels=run_labels)
        c.add_metric([run, node], float(bundles))
        yield c
        c = CounterMetricFamily(PREFIX + "uploads", "Bundle uploads (--upload), by outcome.",
                                labels=[*run_labels, "outcome"])  # fmt: skip
        for outcome, n in sorted(uploads.items()):
            c.add_metric([run, node, outcome], float(n))
        yield c
