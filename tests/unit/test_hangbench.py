"""The hang benchmark's own logic (scripts/hangbench.py), without running a job: its matrix has the rows it promises,
its measures count what they say, and its CI check fails on a regression of blackbox's recall or false alarms."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import hangbench  # noqa: E402


def outcome(row: str, contender: str, truth: str, detected: bool, latency: Optional[float] = None,
            culprit_ok: Optional[bool] = None, evidence: float = 0.0) -> hangbench.Outcome:  # fmt: skip
    return hangbench.Outcome(row, contender, truth, detected, latency, [1] if detected else None, None, culprit_ok,
                             None, evidence, "", 0, 1.0)  # fmt: skip


def test_the_matrix_holds_twenty_faults_and_twelve_healthy_jobs_from_the_galleries() -> None:
    rows = hangbench.rows()
    faults = [r for r in rows if r.truth != "healthy"]
    healthy = [r for r in rows if r.truth == "healthy"]
    assert len(faults) >= 20 and len(healthy) >= 12
    assert len({r.name for r in rows}) == len(rows)
    assert all(r.culprits for r in faults)  # the truth is written beside every fault
    assert all(r.category for r in faults if r.name != "thread-deadlock")
    assert {r.shape for r in faults} >= {"plain", "ddp", "fsdp"}
    for r in rows:  # every row runs a gallery program that exists
        assert Path(r.program[0]).is_file(), r
    assert set(hangbench.QUICK) <= {r.name for r in rows}
    quick = [r for r in rows if r.name in hangbench.QUICK]
    assert {r.truth for r in quick} == {"hang", "crash", "healthy"}


def test_the_measures_count_detections_false_alarms_latency_and_culprits() -> None:
    outs = [outcome("a", "blackbox", "hang", True, 60.0, True, 1.0), outcome("b", "blackbox", "hang", False),
            outcome("c", "blackbox", "crash", True, 2.0, False, 0.5), outcome("d", "blackbox", "healthy", True),
            outcome("e", "blackbox", "healthy", False)]  # fmt: skip
    s = hangbench.summarise(outs)["blackbox"]
    assert (s["faults"], s["healthy"], s["recall"], s["false_positive_rate"]) == (3, 2, 0.67, 0.5)
    assert (s["latency_median_s"], s["culprit_accuracy"], s["evidence_complete"]) == (31.0, 0.33, 0.5)


def result_of(outs: list[hangbench.Outcome]) -> dict[str, Any]:
    rows = [r for r in hangbench.rows() if r.name in {o.row for o in outs}]
    return {"rows": [asdict(r) for r in rows], "outcomes": [asdict(o) for o in outs],
            "summary": hangbench.summarise(outs)}  # fmt: skip


def test_the_ci_check_fails_on_a_missed_fault_or_a_new_false_alarm(tmp_path: Path) -> None:
    committed = tmp_path / "hangbench.json"
    before = [outcome("ddp-data-hang", "blackbox", "hang", True, 65.0, True), outcome("save", "blackbox", "healthy",
              False), outcome("save", "pytorch", "healthy", True)]  # fmt: skip
    committed.write_text(json.dumps(result_of(before)))
    assert hangbench.check(result_of(before[:2]), committed) == []
    missed = [outcome("ddp-data-hang", "blackbox", "hang", False), before[1]]
    assert hangbench.check(result_of(missed), committed) == [
        "ddp-data-hang: a fault blackbox caught in the committed run is missed now"
    ]
    alarm = [before[0], outcome("save", "blackbox", "healthy", True)]
    assert hangbench.check(result_of(alarm), committed) == [
        "save: a healthy job is ended or alarmed now (quiet in the committed run)"
    ]
    assert hangbench.check(result_of([outcome("tool", "blackbox", "healthy", False)]), committed) == [
        "tool: not in hangbench.json"
    ]


def test_the_tables_show_each_contender_and_each_row() -> None:
    outs = [
        outcome("ddp-data-hang", "blackbox", "hang", True, 65.0, True, 1.0),
        outcome("ddp-data-hang", "torchrun", "hang", False),
        outcome("save", "pytorch", "healthy", True),
    ]
    text = hangbench.markdown(result_of(outs))
    assert "| faults detected (recall) | 100% | - | 0% |" in text
    assert "| ddp-data-hang (ddp) | hang hang.data_loading | [1] | 65.0 s, right | not run | **missed** |" in text
    assert "| save (ddp) | healthy  | [] | not run | **alarm** | not run |" in text


def test_a_latency_under_a_second_is_seconds_not_a_percentage() -> None:
    text = hangbench.markdown(result_of([outcome("ddp-raise", "blackbox", "crash", True, 0.7, True, 1.0)]))
    assert "| latency from onset, median (s) | 0.7 |" in text and "| evidence: ranks with stack + place in the " \
        "collectives / world | 100% |" in text, text  # fmt: skip
    assert "collective trace" not in text  # the measure before the rings is not printed for a result without it


def test_the_partition_row_cuts_two_hosts_and_blames_the_far_side_as_node_0_sees_it() -> None:
    row = next(r for r in hangbench.rows(two_hosts=True) if r.name == "partition")
    assert (row.hosts, row.nproc, row.truth, row.category, row.culprits) == (2, 1, "hang", "hang.network", [1])
    assert row.env["BB_MARK"] == "1" and hangbench.ONSET.search("rank 0: at step 8")
    assert "partition" not in {r.name for r in hangbench.rows(two_hosts=False)}


def test_the_committed_result_is_a_whole_run() -> None:
    result = json.loads((ROOT / "docs" / "hangbench.json").read_text())
    assert set(result["summary"]) == set(hangbench.CONTENDERS)
    assert {o["row"] for o in result["outcomes"]} == {r.name for r in hangbench.rows(two_hosts=True)}
