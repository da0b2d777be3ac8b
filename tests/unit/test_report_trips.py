"""Small things a reader of a report trips over (issue 35 §3): a live-process command after blackbox ended the
job, and the HTML report's next actions with their backticks raw."""

from __future__ import annotations

import io
from pathlib import Path

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundles
from blackbox.render.html import render_html, with_code
from scripts.bench_report import make_bundle


def test_no_live_dump_is_offered_once_blackbox_has_ended_the_job(tmp_path: Path) -> None:
    # GIVEN a stall bundle whose ranks were alive when it was taken
    bundle = read_bundles([make_bundle(4, str(tmp_path))])
    assert any(a.startswith("While it hangs: `py-spy dump") for a in analyze(bundle).next_actions)
    # WHEN blackbox took it just before ending the job (--on-stall kill: the collection's job_ends)
    bundle.manifest["collection"] = {"options": {"job_ends": True}}
    actions = analyze(bundle).next_actions
    # THEN nothing asks for a live process any more; the rerun with --on-stall keep is still offered
    assert not any("While it hangs" in a for a in actions), actions
    assert any("--on-stall keep" in a for a in actions), actions


def test_the_html_report_shows_commands_as_code(tmp_path: Path) -> None:
    report = analyze(read_bundles([make_bundle(4, str(tmp_path))]))
    out = io.StringIO()
    render_html(report, out)
    page = out.getvalue()
    actions = page[page.index("<h2>Next actions</h2>") : page.index("</ol>")]
    assert "`" not in actions and "<code>py-spy dump --native --pid" in actions, actions


def test_code_spans_are_escaped_and_a_lone_backtick_stays() -> None:
    assert with_code("run `a <b>` then") == "run <code>a &lt;b&gt;</code> then"
    assert with_code("a `b` and ` alone") == "a <code>b</code> and ` alone"
