"""Golden bundles: real failures made by scripts/make_golden.py (real torchrun, gloo, blackbox run), kept small
under tests/data/golden. The report must give each its expected category, suspects and phase."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle import layout as L
from blackbox.bundle.reader import Bundle, read_bundle

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


def _arriving(phase: str) -> Bundle:
    """The collective-hang bundle (rank 2 calls barrier where ranks 0, 1 and 3 call all_reduce) as a collection of a
    job still moving can make it: ranks 1 and 3 wrote their flight-recorder dumps before they enqueued the stuck
    collective (nothing pending), and their heartbeats say `phase`."""
    b = read_bundle(str(GOLDEN / "collective-hang.tar.gz"))
    for rank in (1, 3):
        name = f"{L.FLIGHT_RECORDER_DIR}fr_trace_{rank}"
        dump = pickle.loads(b.files[name])  # our own golden data
        stuck = dump["pg_status"]["0"]["last_enqueued_collective"]
        dump["pg_status"]["0"]["last_enqueued_collective"] = stuck - 1
        dump["entries"] = [e for e in dump["entries"] if e["collective_seq_id"] != stuck]
        b.files[name] = pickle.dumps(dump)
        hb = b.json(L.rank_member(rank, L.HEARTBEAT))
        hb.update(phase=phase, collective="all_reduce" if phase == "collective" else "none")
        b.files[L.rank_member(rank, L.HEARTBEAT)] = json.dumps(hb).encode()
    return b


def test_a_rank_whose_dump_predates_its_arrival_is_a_late_arrival_not_the_cause() -> None:
    # its heartbeat has it in all_reduce (the hook marks that before torch enqueues): on its way in
    report = analyze(_arriving("collective"))
    assert (report.verdict.category, report.verdict.suspect_ranks) == ("hang.collective", [2]), report.verdict
    assert "ranks 0-1, 3 in all_reduce" in report.verdict.summary
    assert any("it was on its way in" in f.text for f in report.findings), [f.text for f in report.findings]
    # the same dumps with heartbeats outside any collective: ranks 1 and 3 are the ones the others wait for
    report = analyze(_arriving("compute"))
    assert report.verdict.suspect_ranks == [1, 3], report.verdict
