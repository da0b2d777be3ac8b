"""Each rank's evidence at a glance (analyze.evidence) on a golden bundle made to hold a rank that could not answer:
which sources it has, why one is missing, and what its own ring says it last did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blackbox.analyze.evidence import findings
from blackbox.analyze.verdict import analyze
from blackbox.bundle.evidence import per_rank
from blackbox.bundle.reader import read_bundle
from tests.unit.test_hostile_bundles import members, write

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "collective-hang.tar.gz"
T0 = 1795939500.0  # a wall-clock time: 08:05:00 UTC


def bundle_with(tmp_path: Path, change: Any) -> Path:
    files = members(GOLDEN)
    change(files)
    return write(tmp_path / "b.tar.gz", files)


def edge(n: int, phase: str, at: float, collective: str = "", seq: int = 0, step: int = 40,
         issued: int = 0) -> dict[str, Any]:  # fmt: skip
    return {"n": n, "phase": phase, "collective": collective, "seq": seq, "start": 0.0, "start_wall": T0 + at,
            "step": step, "issued": issued}  # fmt: skip


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


def test_a_detected_hangs_ring_is_read_as_it_stood_when_the_collection_began(tmp_path: Path) -> None:
    # GIVEN the stopped culprit's ring, with two edges written after the collection of the detected hang began (a
    # rank that blackbox's dump signal woke from a native sleep moves on for a moment)
    def woken(files: dict[str, bytes]) -> None:
        stopped_rank_2(files)
        hb = json.loads(files["ranks/2/heartbeat.json"])
        hb["ring"] += [edge(11, "compute", 5, step=41), edge(12, "collective", 6, "all_reduce", 813, step=42)]
        files["ranks/2/heartbeat.json"] = json.dumps(hb).encode()
        manifest = json.loads(files["manifest.json"])
        manifest["collection"]["started"] = T0 + 4.0
        files["manifest.json"] = json.dumps(manifest).encode()

    path = bundle_with(tmp_path, woken)
    texts = [f.text for f in analyze(read_bundle(str(path))).findings]
    # THEN its place is where the hang held it, and the later edges are said to be left out
    assert ("rank 2's own record (its ring): last entered broadcast #3 at 08:05:03 UTC, never left; in phase "
            "collective since 08:05:03 UTC, at step 41; 2 edge(s) after the collection began left out (the dump "
            "signal woke it)") in texts, texts  # fmt: skip

    # AND a collection on request (no detection) reads the ring as written: the job may be running
    def on_request(files: dict[str, bytes]) -> None:
        woken(files)
        del files["detection.json"]
        manifest = json.loads(files["manifest.json"])
        manifest["trigger"] = "manual"
        files["manifest.json"] = json.dumps(manifest).encode()

    b = read_bundle(str(bundle_with(tmp_path, on_request)))
    said = [f.text for f in findings(b, per_rank(b, [0, 1, 2, 3]), [2]) if f.text.startswith("rank 2's own record")]
    assert said == ["rank 2's own record (its ring): last entered all_reduce #813 at 08:05:06 UTC, never left; in "
                    "phase collective since 08:05:06 UTC, at step 42"], said  # fmt: skip


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
    # torch's count is said where it says more than the Python collective: C++ collectives (DDP's) since it was left
    mixed = [edge(1, "collective", 1, "all_reduce", 9, issued=11), edge(2, "compute", 2, issued=12),
             edge(3, "backward", 3, issued=12), edge(4, "compute", 4, issued=15)]  # fmt: skip
    assert last_edges(mixed) == ("last entered all_reduce #9 at 08:05:01 UTC, left at 08:05:02 UTC; had issued "
                                 "collective #15 of its default group by 08:05:04 UTC (torch's count); in phase "
                                 "compute since 08:05:04 UTC, at step 40")  # fmt: skip
    assert "torch's count" not in last_edges(mixed[:3]) and "torch's count" not in last_edges(mixed[:1])
    assert last_edges([{"n": "x"}, 7, {"start_wall": "y"}]) == ""  # type: ignore[list-item]


def stopped_ddp_rank_2(files: dict[str, bytes]) -> None:
    """Rank 2 stopped as `stopped_rank_2`, in a DDP job: its collectives came from C++ (no collective phase in its
    ring), torch's count of them at each edge."""
    stopped_rank_2(files)
    hb = json.loads(files["ranks/2/heartbeat.json"])
    hb["ring"] = [edge(7, "backward", 0, issued=5), edge(8, "compute", 1, issued=7), edge(9, "data", 2, step=41,
                  issued=7), edge(10, "compute", 3, step=41, issued=7)]  # fmt: skip
    files["ranks/2/heartbeat.json"] = json.dumps(hb).encode()


def test_a_ddp_ranks_place_in_the_collectives_is_torchs_count_in_its_ring(tmp_path: Path) -> None:
    report = analyze(read_bundle(str(bundle_with(tmp_path, stopped_ddp_rank_2))))
    by_rank = {e["rank"]: e for e in report.evidence}
    # THEN its place comes from its ring, though no Python collective was ever entered
    assert by_rank[2]["position"] == ["its ring"] and by_rank[2]["complete"] is True
    # AND the report says the newest collective torch counted, and since when it is where it is
    assert ("rank 2's own record (its ring): had issued collective #7 of its default group by 08:05:03 UTC (torch's "
            "count); in phase compute since 08:05:03 UTC, at step 41") in [f.text for f in report.findings]  # fmt: skip


def test_a_rank_that_has_not_joined_its_group_is_placed_before_the_first_collective(tmp_path: Path) -> None:
    def unjoined(join: str, version: int) -> Any:
        def change(files: dict[str, bytes]) -> None:
            stopped_rank_2(files)
            hb = json.loads(files["ranks/2/heartbeat.json"])
            hb.update(ring=[edge(1, "startup", 0, step=0)], join=join, version=version)
            files["ranks/2/heartbeat.json"] = json.dumps(hb).encode()

        return change

    def position(join: str, version: int, name: str) -> list[str]:
        (tmp_path / name).mkdir()
        bundle = read_bundle(str(bundle_with(tmp_path / name, unjoined(join, version))))
        return next(e["position"] for e in analyze(bundle).evidence if e["rank"] == 2)

    # GIVEN rank 2 waiting in init_process_group, or (a layout-5 page) not yet in it
    assert position("joining", 4, "a") == ["its join state (no collective yet)"]
    assert position("", 5, "b") == ["its join state (no collective yet)"]
    # BUT a layout-4 page's empty join word may be an older recorder's, and a joined rank with no record is unplaced
    assert position("", 4, "c") == [] and position("joined", 5, "d") == []


def test_a_rank_that_died_before_it_was_read_has_the_stack_it_left(tmp_path: Path) -> None:
    # GIVEN a crash: rank 1 raised and exited before py-spy or its own dump could read it (its record holds the
    # traceback), rank 3 was ended by the launcher's SIGTERM first and rank 0 by a segfault (faulthandler's dumps of
    # them), and rank 2 left only an exception of another thread; none has a py-spy stack, a faulthandler dump on the
    # dump signal or a dump of its own
    def died(files: dict[str, bytes]) -> None:
        read = tuple(f"ranks/{rank}/{kind}" for rank in (0, 1, 2, 3) for kind in ("py-spy", "stacks-", "pydump-"))
        for name in [n for n in files if n.startswith(read)]:
            del files[name]
        frames = [{"file": "train.py", "line": 40, "function": "main"}, {"file": "train.py", "line": 12,
                                                                       "function": "step"}]  # fmt: skip
        files["ranks/1/exceptions.jsonl"] = (
            b"not json\n"
            + json.dumps(
                {"time": T0, "thread": "MainThread", "type": "builtins.ValueError", "traceback": frames}
            ).encode()
            + b"\n"
        )
        files["ranks/2/exceptions.jsonl"] = json.dumps({"time": T0, "thread": "Thread-1", "traceback": frames}).encode()
        files["ranks/3/sigterm.txt"] = b'Thread 0x01 (most recent call first):\n  File "train.py", line 9 in main\n'
        files["ranks/0/fatal.txt"] = b'Fatal Python error: Segmentation fault\n\nCurrent thread 0x01:\n  File "x.py"\n'

    b = read_bundle(str(bundle_with(tmp_path, died)))
    by_rank = {e.rank: e for e in per_rank(b, [0, 1, 2, 3])}
    # THEN the raising rank's stack is its traceback, the terminated rank's is faulthandler's at SIGTERM — each with
    # its place from the flight recorder, complete — and another thread's exception is no stack of the rank
    assert (by_rank[1].stack, by_rank[1].last_words, by_rank[1].complete) == (["its traceback"], ["exception"], True)
    assert (by_rank[3].stack, by_rank[3].last_words, by_rank[3].complete) == (["faulthandler at SIGTERM"],
                                                                             ["SIGTERM"], True)  # fmt: skip
    assert (by_rank[0].stack, by_rank[0].complete) == (["faulthandler at its fatal signal"], True)
    assert (by_rank[2].stack, by_rank[2].complete) == ([], False)
    texts = [f.text for f in analyze(b).findings]
    assert "evidence: 3/4 rank(s) with a stack and their place in the collectives" in texts, texts
