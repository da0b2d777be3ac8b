"""The report's renderers on real bundles: Markdown for an issue tracker, and the self-contained HTML page,
opened in real headless Chromium (its console must stay free of errors)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BLACKBOX, job_env

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def report(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BLACKBOX, "report", *args], capture_output=True, text=True, env=job_env(), cwd=cwd,
                          timeout=120)  # fmt: skip


def test_markdown_has_the_verdict_table_and_stacks(tmp_path: Path) -> None:
    res = report([str(GOLDEN / "data-hang-workers.tar.gz"), "--format", "markdown"], tmp_path)
    assert res.returncode == 0, res.stderr
    md = res.stdout
    assert md.startswith("## blackbox: `hang.data_loading` — suspect rank(s) 1")
    assert "| **1** |" in md and "### Stacks" in md and "__getitem__ (train.py:" in md
    assert re.search(r"\*observed\*: rank 1's DataLoader worker \d+ is in __getitem__", md)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("name", ["data-hang", "comm-timeout", "oom"])
def test_html_opens_in_headless_chromium_without_console_errors(tmp_path: Path, name: str) -> None:
    # GIVEN the HTML report of a real bundle, written to a file
    out = tmp_path / "report.html"
    res = report([str(GOLDEN / f"{name}.tar.gz"), "--format", "html", "--out", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://cdn" not in page
    # WHEN Chromium loads it, runs its script and dumps the DOM
    assert CHROMIUM is not None
    run = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # THEN the console holds no error, the script ran, and the verdict and the timeline are on the page
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    assert re.search(r'id="suspect-count">1<', run.stdout), run.stdout[-2000:]
    assert "suspect rank(s) 1" in run.stdout or "suspect rank(s) 0" in run.stdout
    assert "<svg" in run.stdout and "stopped first" in run.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_html_draws_the_gpu_history(tmp_path: Path) -> None:
    from blackbox.bundle.writer import BundleWriter
    from blackbox.detections import Trigger

    # GIVEN a bundle whose supervisor watched one GPU go from busy to 0 %
    w = BundleWriter("run-g", "node7", Trigger.parse("gpu-idle"))
    samples = [{"t": 1000.0 + i, "index": 0, "name": "H100", "utilization_pct": 90.0 if i < 5 else 0.0,
                "temperature_c": 60.0, "memory_used_mib": 1, "memory_total_mib": 2} for i in range(20)]  # fmt: skip
    w.add_json("node/gpu-history.json", {"0": samples})
    w.add_json("detection.json", {"rule": "gpu_idle", "ranks": [], "suspects": [], "reason": "every GPU idle"})
    bundle = w.write(str(tmp_path), {}).path
    out = tmp_path / "r.html"
    assert report([bundle, "--format", "html", "--out", str(out)], tmp_path).returncode == 0
    assert CHROMIUM is not None
    run = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert not [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    # THEN the page has the GPU chart, and the report says how long the GPU sat at 0 %
    assert "GPU utilisation over time" in run.stdout and "GPU 0 H100" in run.stdout
    assert "at 0 % for the last 14 s" in run.stdout


def test_torchs_analyzer_never_walks_a_pickle_of_shared_references(tmp_path: Path) -> None:
    """A 557-byte flight-recorder pickle whose shared references expand to 2**60 paths: refused before PyTorch's
    own analyzer (on by default, in the report's process) walks its frames."""
    from tests.unit.test_hostile_bundles import CASES

    path = CASES["flight recorder: a DAG of shared references"](tmp_path)
    res = report(["--no-index", "--format", "json", str(path)], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "shared references expand" in res.stdout
