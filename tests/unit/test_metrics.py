"""The metrics collector over the supervisor's views: what a scrape says per rank, per GPU and in the counters,
rendered by prometheus_client as Prometheus reads it; every metric the shipped rules and dashboard use exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from blackbox.adapters.gpu import GpuReading
from blackbox.config import load_run_config
from blackbox.supervisor.context import RunContext
from blackbox.supervisor.metrics import Metrics
from blackbox.supervisor.rules import RankView
from tests.unit.test_rules import hb

ROOT = Path(__file__).resolve().parent.parent.parent
LEDGER = (0.0, 6.0, 1.0, 0.0, 3.0, 0.0, 0.0, 0.0)  # startup, compute, data, checkpoint, collective, …


def scrape(metrics: Metrics) -> str:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return str(prometheus_client.generate_latest(registry).decode())


def sample(text: str, metric: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(metric + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {metric} {labels} in:\n{text}")


def make(gpus: list[GpuReading]) -> Metrics:
    ctx = RunContext(["job"], load_run_config({}, {}), {}, lambda m: None, "run-1", "host", "/tmp/x", "/tmp")
    return Metrics(ctx, lambda: "run-1", lambda: "host", lambda: gpus, lambda: {1})


def test_a_scrape_renders_the_last_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN rank 0 waiting in all_reduce #8 for rank 1, which is still in data before #8, and a dead rank 2
    gpus = [GpuReading(0, "H100", 71.0, 93.0, 40_000.0, 81_559.0)]
    metrics = make(gpus)
    views = [RankView(hb(0, step=20, phase="collective", collective="all_reduce", collective_seq=8, ledger=LEDGER,
                         last_progress=95.0, phase_start=99.0), True),
             RankView(hb(1, step=20, phase="data", collective_seq=7, ledger=LEDGER, last_progress=90.0,
                         phase_start=90.0), True),
             RankView(hb(2, step=5, state="exited"), False, "exit code 1")]  # fmt: skip
    metrics.update([RankView(hb(0, step=10), True), RankView(hb(1, step=10), True)], 0.0)
    metrics.update(views, 10.0)
    for name, fields in (("stall", {}), ("verdict", {"category": "hang.data_loading"}), ("bundle", {}),
                         ("upload", {"ok": False}), ("same_episode", {})):  # fmt: skip
        metrics.on_event(name, fields)
    monkeypatch.setattr("blackbox.supervisor.metrics.time.monotonic", lambda: 100.0)
    # WHEN Prometheus scrapes
    text = scrape(metrics)
    # THEN each rank's progress, phase and waiting are there, as the supervisor read them
    assert sample(text, "blackbox_rank_step", run="run-1", node="host", rank="0") == 20
    assert sample(text, "blackbox_rank_steps_per_second", rank="1") == 1.0  # 10 steps in 10 s
    assert sample(text, "blackbox_rank_seconds_since_progress", rank="1") == 10.0
    assert sample(text, "blackbox_rank_current_phase_seconds", rank="0") == 1.0
    assert sample(text, "blackbox_rank_phase", rank="0", phase="collective") == 1
    assert sample(text, "blackbox_rank_waiting_for", rank="0", collective="all_reduce") == 1
    assert sample(text, "blackbox_rank_waiting_for", rank="1") == -1
    assert sample(text, "blackbox_rank_straggler", rank="1") == 1 and sample(text, "blackbox_rank_straggler",
                                                                             rank="0") == 0  # fmt: skip
    assert sample(text, "blackbox_rank_time_share", rank="1", phase="compute") == pytest.approx(0.3)
    assert sample(text, "blackbox_rank_phase_seconds_total", rank="1", phase="data") == pytest.approx(11.0)  # 1 + 10
    assert sample(text, "blackbox_rank_up", rank="2") == 0
    assert 'blackbox_rank_seconds_since_progress{node="host",rank="2"' not in text  # an ended rank is not idle
    # AND the GPU and the counters
    assert sample(text, "blackbox_gpu_utilization_ratio", gpu="0", name="H100") == pytest.approx(0.93)
    assert sample(text, "blackbox_gpu_memory_used_bytes", gpu="0") == 40_000 * 1024 * 1024
    assert sample(text, "blackbox_gpu_temperature_celsius", gpu="0") == 71
    assert sample(text, "blackbox_stalls_total") == 1 and sample(text, "blackbox_bundles_total") == 1
    assert sample(text, "blackbox_incidents_total", category="hang.data_loading") == 1
    assert sample(text, "blackbox_uploads_total", outcome="failed") == 1


def test_without_prometheus_client_the_job_runs_on_with_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    ctx = RunContext(["job"], load_run_config({}, {}), {}, said.append, "run-1", "host", "/tmp/x", "/tmp")
    metrics = Metrics(ctx, lambda: "r", lambda: "n", lambda: [], lambda: set())
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)
    assert metrics.start("127.0.0.1", 9) is False
    ctx.close_speech()  # the words go out from a thread of their own
    assert said == ["--metrics-port needs prometheus_client, which is not installed here (pip install "
                    "'torch-blackbox[metrics]'): no metrics are served; the job runs on"]  # fmt: skip


def test_the_shipped_rules_and_dashboard_use_only_metrics_that_exist() -> None:
    text = scrape(make([GpuReading(0, "g", 1.0, 1.0, 1.0, 1.0)]))
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", text, re.MULTILINE))
    names = {n for n, _ in exported} | {n + "_total" for n, kind in exported if kind == "counter"}
    rules = (ROOT / "configs" / "prometheus" / "blackbox-rules.yml").read_text()
    dashboard = json.loads((ROOT / "configs" / "grafana" / "torch-blackbox.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(re.findall(r"\bblackbox_\w+", rules + "\n".join(exprs)))
    assert used and used <= names, sorted(used - names)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
