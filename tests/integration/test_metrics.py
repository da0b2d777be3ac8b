"""`--metrics-port`, scraped by a real Prometheus server started here (the Debian package): a healthy run and a
stalled one side by side; the test asks Prometheus's HTTP API for the per-rank series and sees the stalled rank's
seconds-since-progress grow while the healthy run steps. The shipped rules pass `promtool check rules`."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, BLACKBOX, ROOT, job_env, kill_tree, send, wait_for
from tests.integration.services import Prometheus, prometheus
from tests.ports import free_port

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
RULES = ROOT / "configs" / "prometheus" / "blackbox-rules.yml"


def start(tmp: Path, name: str, port: int, *job: str, **env: str) -> subprocess.Popen[str]:
    cmd = [*BLACKBOX, "run", "--run-dir", str(tmp / name), "--metrics-port", str(port), "--poll-interval", "0.5",
           "--stall-timeout", "12", "--on-stall", "keep", "--", str(BIN / "torchrun"), "--standalone",
           "--nproc-per-node", "2", str(TRAIN), *job]  # fmt: skip
    return subprocess.Popen(cmd, cwd=tmp, env=job_env(**env), text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip


def values(prom: Prometheus, expr: str) -> dict[str, float]:
    """rank (or the series' labels) -> value, from an instant query."""
    out = {}
    for series in prom.query(expr):
        labels = series["metric"]
        out[labels.get("rank") or labels.get("category") or labels.get("phase") or "-"] = float(series["value"][1])
    return out


@pytest.mark.timeout(240)
@pytest.mark.long
def test_prometheus_scrapes_a_healthy_and_a_stalled_run(tmp_path: Path) -> None:
    healthy_port, stalled_port = free_port(), free_port()
    healthy_at, stalled_at = f'instance="127.0.0.1:{healthy_port}"', f'instance="127.0.0.1:{stalled_port}"'
    with prometheus(tmp_path, [f"127.0.0.1:{healthy_port}", f"127.0.0.1:{stalled_port}"], 0.5) as prom:
        # GIVEN a healthy run, and a run whose rank 1 hangs in its data loader at step 3, serving metrics
        jobs = [start(tmp_path, "healthy", healthy_port, "steady", "0", BB_STEPS="100000"),
                start(tmp_path, "stalled", stalled_port, "data-hang", "1")]  # fmt: skip
        try:
            # WHEN Prometheus scrapes them
            wait_for(lambda: len(values(prom, f"blackbox_rank_step{{{healthy_at}}} > 3")) == 2, 120, "healthy steps")
            # (from the moment rank 1 is in its read for good: before it, a slow first step on a busy machine reads
            # as seconds since progress too, and the next step sets them back)
            console = tmp_path / "stalled" / "console.log"
            wait_for(lambda: console.exists() and b"rank 1: failing now" in console.read_bytes(), 120, "the hang")
            # ... and from the moment the supervisor has read that last step (3): on a loaded machine its poll can lag
            # the console, and its gauge counts from the last step it has seen until then
            last_step = f'blackbox_rank_step{{{stalled_at}, rank="1"}} >= 3'
            wait_for(lambda: values(prom, last_step), 120, "the supervisor seeing rank 1's last step")
            idle = f'blackbox_rank_seconds_since_progress{{{stalled_at}, rank="1"}}'
            first = wait_for(lambda: values(prom, f"{idle} > 2"), 120, "the stalled rank's series")
            # THEN the stalled rank's seconds since progress grow from one scrape to the next
            time.sleep(2.5)
            later = values(prom, idle)
            assert later["1"] > first["1"] + 1.5, (first, later)  # type: ignore[index]
            # AND its peer, waiting in the all_reduce for it, says whom it waits for
            waiting = values(prom, f'blackbox_rank_waiting_for{{{stalled_at}, rank="0"}}')
            assert waiting == {"0": 1.0}, waiting
            # AND the stalled rank's definite leaf is named: it reads a FIFO nobody writes (the gallery's dead mount)
            leaf = f'blackbox_rank_definite_leaf{{{stalled_at}, leaf="fifo"}}'
            wait_for(lambda: values(prom, leaf) == {"1": 1.0}, 60, "the stalled rank's leaf")
            assert values(prom, f'blackbox_rank_stage{{{healthy_at}, stage="training"}}') == {"0": 1.0, "1": 1.0}
            # AND the healthy run steps, with a rate, a phase and a time share per phase for each rank
            assert all(v > 0 for v in values(prom, f"blackbox_rank_steps_per_second{{{healthy_at}}}").values())
            assert len(values(prom, f"blackbox_rank_phase{{{healthy_at}}} == 1")) == 2
            shares = values(prom, f"sum by (phase) (blackbox_rank_time_share{{{healthy_at}}})")
            assert {"compute", "collective"} <= set(shares), shares
            fresh = values(prom, f"blackbox_rank_seconds_since_progress{{{healthy_at}}}")
            assert len(fresh) == 2 and max(fresh.values()) < 5, fresh
            # AND once blackbox calls the stall (12 s), its counters say so
            wait_for(lambda: values(prom, f"blackbox_stalls_total{{{stalled_at}}}") == {"-": 1.0}, 60, "the stall")
            wait_for(lambda: values(prom, f"blackbox_bundles_total{{{stalled_at}}}") == {"-": 1.0}, 60, "the bundle")
            wait_for(lambda: values(prom, f"blackbox_incidents_total{{{stalled_at}}}") == {"hang.data_loading": 1.0},
                     60, "the incident")  # fmt: skip
            assert values(prom, f"blackbox_stalls_total{{{healthy_at}}}") == {"-": 0.0}
        finally:
            for job in jobs:
                send(job, signal.SIGTERM)  # type: ignore[arg-type]
            for job in jobs:
                try:
                    job.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    kill_tree(job)


def test_the_shipped_prometheus_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (Debian package `prometheus`; `make test` installs it as root)")
    res = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout
