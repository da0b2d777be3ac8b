"""The scenario gallery end to end: every scenario of scripts/scenarios/ runs under `blackbox run` (real
torchrun, real gloo, real failures) and must end with its expected exit code and, where it leaves a bundle,
the report's JSON verdict it is expected to get (category, suspects, phase)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import BLACKBOX, ROOT, job_env

sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
from runner import SCENARIOS


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_verdict(gallery: Callable[[str], tuple[Path, Any]], name: str) -> None:
    spec = SCENARIOS[name]
    _, outcome = gallery(name)
    assert outcome.exit_code == spec["exit"], outcome.stderr[-3000:]
    if spec["verdict"] is None:
        # a healthy job: its own exit, no bundle, nothing from blackbox in the way
        assert not outcome.bundles and "blackbox:" not in outcome.stderr, outcome.stderr[-3000:]
        return
    assert outcome.bundles, outcome.stderr[-3000:]
    res = subprocess.run([*BLACKBOX, "report", str(outcome.bundles[0]), "--format", "json", "--no-fr-analyzer"],
                         capture_output=True, text=True, env=job_env(), timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    verdict = json.loads(res.stdout)["verdict"]
    got = {key: verdict[key] for key in spec["verdict"]}
    assert got == spec["verdict"], f"{verdict}\n{outcome.stderr[-3000:]}"
