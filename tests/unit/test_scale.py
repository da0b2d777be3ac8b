"""Generated bundles of 1,024 and 4,096 ranks: the report finds the one stuck rank, merges the rest into one
stack group and one line of evidence, and every renderer copes. Speed is measured in scripts/bench_report.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundles
from blackbox.render.html import render_html
from blackbox.render.json_render import render_json
from blackbox.render.markdown import render_markdown
from blackbox.render.terminal import render_terminal
from scripts.bench_report import make_bundle


@pytest.mark.parametrize("ranks", [1024, 4096])
def test_one_stuck_rank_among_thousands(tmp_path: Path, ranks: int) -> None:
    # GIVEN a stall bundle of `ranks` ranks where rank 777 sits in its dataset and every other in all_reduce
    report = analyze(read_bundles([make_bundle(ranks, str(tmp_path), stuck=777)]))
    # THEN rank 777 is the suspect of a data-loading hang, and the others are one group, one line
    assert report.verdict.category == "hang.data_loading" and report.verdict.suspect_ranks == [777]
    odd, rest = report.stack_groups
    assert odd["ranks"] == [777] and len(rest["ranks"]) == ranks - 1
    assert rest["describe"] == f"ranks 0-776, 778-{ranks - 1}: all_reduce ← main (train.py:88)"
    grouped = [f for f in report.findings if f"({ranks - 1} ranks)" in f.text]
    assert len(grouped) == 1 and "in all_reduce" in grouped[0].text
    assert len(report.findings) < 20 and len(report.ranks) == ranks
    # AND every renderer copes; the terminal shows the suspect's row and says how many are left out
    for render in (render_terminal, render_markdown, render_html, render_json):
        out = io.StringIO()
        render(report, out)
        assert "777" in out.getvalue()
    out = io.StringIO()
    render_terminal(report, out)
    assert f"{ranks - 32} more rank(s)" in out.getvalue()
    assert len(json.loads(_json(report))["ranks"]) == ranks


def _json(report: object) -> str:
    out = io.StringIO()
    render_json(report, out)  # type: ignore[arg-type]
    return out.getvalue()
