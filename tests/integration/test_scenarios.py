"""The scenario gallery end to end: every scenario of scripts/scenarios/ runs under `blackbox run` (real
torchrun, real gloo, real failures, models wrapped in DDP and FSDP2 as real jobs are) and must end with its
expected exit code and, where it leaves a bundle, the report's JSON verdict it is expected to get (category,
suspects, phase). Every hang is also run under plain torchrun and collected by `blackbox collect`, which must
reach the same verdict without the recorder. The session ends with the table of every row."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import ROOT, table_row

sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
from runner import SCENARIOS, compare

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle

ROWS = [(name, "run") for name in SCENARIOS] + [(name, "collect") for name, s in SCENARIOS.items() if s.get("collect")]


@pytest.mark.parametrize(("name", "mode"), ROWS, ids=[f"{n}-{m}" for n, m in ROWS])
def test_scenario_verdict(request: pytest.FixtureRequest, gallery: Callable[..., tuple[Path, Any]], name: str,
                          mode: str) -> None:  # fmt: skip
    spec = SCENARIOS[name]
    _, outcome = gallery(name, mode)
    if mode == "run":
        assert outcome.exit_code == spec["exit"], outcome.stderr[-3000:]
    else:
        assert outcome.exit_code == 0, outcome.stderr[-3000:]
    if spec["verdict"] is None:
        # a healthy job: its own exit, no bundle, nothing from blackbox in the way
        assert not outcome.bundles and "blackbox:" not in outcome.stderr, outcome.stderr[-3000:]
        return
    assert outcome.bundles, outcome.stderr[-3000:]
    if mode == "run" and "bundles" in spec:  # e.g. a frozen rank ended like a stall: the stall after it is no 2nd
        assert len(outcome.bundles) == spec["bundles"], outcome.stderr[-3000:]
    if mode == "run" and "trigger" in spec:  # the rule that fired (an endless Python loop: busy, not stall)
        assert outcome.bundles[0].name.endswith(f"-{spec['trigger']}.tar.gz"), outcome.bundles
    # the report's analysis in this process (the CLI's JSON of it is tested elsewhere): a second saved per row
    verdict = analyze(read_bundle(str(outcome.bundles[0]))).to_json()["verdict"]
    got, same = compare(name, verdict)
    table_row(request, "gallery", (name, mode, spec["verdict"], got, same))
    assert same, f"{verdict}\n{outcome.stderr[-3000:]}"
