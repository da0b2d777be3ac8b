"""Golden bundles: real failures made by scripts/make_golden.py (real torchrun, gloo, blackbox run), kept small
under tests/data/golden. The report must give each its expected category, suspects and phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
EXPECTED: dict[str, dict[str, object]] = json.loads((GOLDEN / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_verdict(name: str) -> None:
    report = analyze(read_bundle(str(GOLDEN / f"{name}.tar.gz")))
    want = EXPECTED[name]
    got = {"category": report.verdict.category, "suspect_ranks": report.verdict.suspect_ranks,
           "phase": report.verdict.phase}  # fmt: skip
    assert {k: got[k] for k in want} == want
    # every verdict comes with evidence a reader can check, and a first thing to do
    assert any(f.kind == "observed" and f.source for f in report.findings)
    assert report.next_actions and report.stack_groups


def test_every_category_the_scenarios_reach_is_covered() -> None:
    categories = {str(v["category"]) for v in EXPECTED.values()}
    assert categories >= {"hang.data_loading", "hang.checkpoint_io", "hang.compute", "crash.exception",
                          "crash.oom", "crash.comm_timeout", "crash.signal", "crash.exit", "hang.stopped"}  # fmt: skip
