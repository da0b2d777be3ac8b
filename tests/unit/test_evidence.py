"""Each rank's evidence at a glance (analyze.evidence) on a golden bundle made to hold a rank that could not answer:
which sources it has, why one is missing, and what its own ring says it last did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from tests.unit.test_hostile_bundles import members, write

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "collective-hang.tar.gz"
T0 = 1795939500.0  # a wall-clock time: 08:05:00 UTC


def bundle_with(tmp_path: Path, change: Any) -> Path:
    files = members(GOLDEN)
    change(files)
    return write(tmp_path / "b.tar.gz", files)


def edge(n: int, phase: str, at: float, collective: str = "", seq: int = 0, step: int = 40) -> dict[str, Any]:
    return {"n": n, "phase": phase, "collective": collective, "seq": seq, "start": 0.0, "start_wall": T0 + at,
            "step": step}  # fmt: skip


def stopped_rank_2(files: dict[str, bytes]) -> None:
    """Rank 2 (the bundle's culprit) stopped: no dump, no trace, no faulthandler; py-spy read it; its ring says
    where it was."""
    for name in [n for n in files if n.startswith(("ranks/2/stacks-", "ranks/2/pydump-", "ranks/2/fr_trace"))]:
        del files[name]
    del files["flight_recorder/fr_trace_2"]
    hb = json.loads(files["ranks/2/heartbeat.json"])
    hb["ring"] = [edge(7, "compute", 0), edge(8, "collective", 1, "all_reduce", 812), edge(9, "data", 2, step=41),
                  edge(10, "collective", 3, "broadcast", 3, step=41)]  # fmt: skip
    files["ranks/2/heartbeat.json"] = json.dumps(hb).encode()
    manifest = json.loads(files["manifest.json"])
    manifest["collection"]["unanswered"] = {"2": "stopped"}
    files["manifest.json"] = json.dumps(manifest).encode()


def test_a_rank_that_could_not_answer_is_named_with_what_it_has_and_why(tmp_path: Path) -> None:
    report = analyze(read_bundle(str(bundle_with(tmp_path, stopped_rank_2))))
    by_rank = {e["rank"]: e for e in report.evidence}
    # THEN its stack came from py-spy, its place from its ring, and why it wrote nothing of its own is said
    assert by_rank[2] == {"rank": 2, "stack": ["py-spy"], "position": ["its ring"], "memory": False,
                          "last_words": [], "why": "stopped: it could not answer", "complete": True}  # fmt: skip
    assert by_rank[0]["stack"] == ["py-spy", "faulthandler", "its own dump"]
    assert by_rank[0]["position"] == ["flight recorder"] and by_rank[0]["why"] is None
    texts = [f.text for f in report.findings]
    assert "evidence: 4/4 rank(s) with a stack and their place in the collectives" in texts
    # AND for the culprit, with no flight-recorder trace, what its ring says it last did
    assert report.verdict.suspect_ranks == [2]
    assert ("rank 2's own record (its ring): last entered broadcast #3 at 08:05:03 UTC, never left; in phase "
            "collective since 08:05:03 UTC, at step 41") in texts  # fmt: skip


def test_a_rank_with_no_stack_and_no_place_is_listed(tmp_path: Path) -> None:
    def nothing_of_rank_1(files: dict[str, bytes]) -> None:
        for name in [n for n in files if n.startswith("ranks/1/") and not n.endswith(("heartbeat.json", "proc.json"))]:
            del files[name]
        del files["flight_recorder/fr_trace_1"]
        manifest = json.loads(files["manifest.json"])
        manifest["collection"]["unanswered"] = {"1": "frozen"}
        files["manifest.json"] = json.dumps(manifest).encode()

    report = analyze(read_bundle(str(bundle_with(tmp_path, nothing_of_rank_1))))
    texts = [f.text for f in report.findings]
    assert "evidence: 3/4 rank(s) with a stack and their place in the collectives" in texts
    assert ("rank 1's evidence: no stack; no place in the collectives (its liveness thread did not run (the GIL "
            "held, or stuck): it could not answer)") in texts  # fmt: skip


def test_the_rings_last_edges_say_whether_the_collective_was_left() -> None:
    from blackbox.analyze.evidence import last_edges

    left = [edge(1, "collective", 1, "all_reduce", 812), edge(2, "compute", 2)]
    assert last_edges(left) == ("last entered all_reduce #812 at 08:05:01 UTC, left at 08:05:02 UTC; in phase "
                                "compute since 08:05:02 UTC, at step 40")  # fmt: skip
    assert last_edges([edge(1, "data", 5)]) == "in phase data since 08:05:05 UTC, at step 40"
    assert last_edges([{"n": "x"}, 7, {"start_wall": "y"}]) == ""  # type: ignore[list-item]
