"""The incident index: fingerprints that ignore what differs between runs, a store that several processes write
at once, schema versions, and a broken index that never stops a report."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle import layout as L
from blackbox.bundle.reader import Bundle, read_bundle
from blackbox.incidents.fingerprint import normalise, signature
from blackbox.incidents.store import SCHEMA_VERSION, IncidentIndex, IndexUnavailable
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden"


def test_messages_lose_what_changes_between_runs() -> None:
    a = normalise("Permission denied: '/tmp/bb-scenario-x1/shard-0003.bin' at 0x7f00aa12, tried 2.00 GiB on GPU 3")
    b = normalise("Permission denied: '/scratch/run9/data/shard-0117.bin' at 0x55d1, tried 512 MiB on GPU 0")
    assert a == b == "Permission denied: '<path>' at <addr>, tried <size> on GPU <n>"


def test_the_same_failure_elsewhere_has_the_same_fingerprint() -> None:
    report = analyze(read_bundle(str(GOLDEN / "read-failure.tar.gz")))
    other = copy.deepcopy(report)  # another run: other pids, host, times, run id, and the shard path moved
    other.run_id, other.node = "20261201-000000-ffffff", "gpu-b17"
    for row in other.ranks:
        row.pid += 4242
        row.node = "gpu-b17"
        row.idle_s = (row.idle_s or 0) + 17
    assert other.exception is not None
    other.exception["message"] = str(other.exception["message"]).replace("/tmp/", "/scratch/other/")
    assert signature(other).fingerprint() == signature(report).fingerprint()
    assert signature(report).exception_type == "PermissionError"
    different = analyze(read_bundle(str(GOLDEN / "raise.tar.gz")))
    assert signature(different).fingerprint() != signature(report).fingerprint()
    hang = analyze(read_bundle(str(GOLDEN / "data-hang.tar.gz")))
    assert signature(hang).top_frame == "__getitem__ (train.py)"


def record(n: int, fingerprint: str = "f" * 20, category: str = "hang.data_loading") -> dict[str, object]:
    return {"sha256": f"{n:064x}", "bundle": f"/b/{n}.tar.gz", "run_id": f"run{n}", "category": category,
            "top_frame": "__getitem__ (train.py)", "fingerprint": fingerprint, "created": "2026-11-29T00:00:00+00:00",
            "suspects": [3]}  # fmt: skip


def test_link_round_trips_and_similar_finds_same_then_close(tmp_path: Path) -> None:
    index = IncidentIndex(str(tmp_path / "i.sqlite"))
    first, new = index.add(record(1))
    assert new and index.add(record(1)) == (first, False)  # the same bundle twice is one incident
    close, _ = index.add(record(2, fingerprint="e" * 20))
    index.link(first, {"status": "verified", "fix_commit": "3f2a9c1", "rerun_outcome": "clean exit", "note": "n"})
    link = index.links(first)[0]
    assert (link["status"], link["fix_commit"], link["rerun_outcome"], link["note"]) == ("verified", "3f2a9c1",
                                                                                        "clean exit", "n")  # fmt: skip
    found = index.similar("f" * 20, "hang.data_loading", "__getitem__ (train.py)", exclude={f"{3:064x}"})
    assert [(f["id"], f["match"]) for f in found] == [(first, "same"), (close, "similar")]
    assert found[0]["fix"]["fix_commit"] == "3f2a9c1"
    with pytest.raises(ValueError):
        index.link(first, {"status": "maybe"})
    assert [r["id"] for r in index.incidents(category="hang")] == [close, first]
    index.close()


def test_the_same_jobs_other_node_is_not_seen_before(tmp_path: Path) -> None:
    # a node cut off from the coordination posts its own incident (its own id) for the job's failure: on a shared
    # index the other node's bundle of the same job is not an earlier incident; another job's is
    index = IncidentIndex(str(tmp_path / "i.sqlite"))
    same_job, _ = index.add({**record(1), "job_id": "20261204-143629-af6f91", "incident_id": "x-i1", "node": "b"})
    other_job, _ = index.add({**record(2), "job_id": "20261203-101010-aaaaaa", "incident_id": "y-i1", "node": "b"})
    found = index.similar("f" * 20, "hang.data_loading", "__getitem__ (train.py)", set(), job="20261204-143629-af6f91")
    assert [f["id"] for f in found] == [other_job]
    everything = index.similar("f" * 20, "hang.data_loading", "__getitem__ (train.py)", set())
    assert [f["id"] for f in everything] == [other_job, same_job]
    index.close()


def in_work_tree(bundle: Bundle, toplevel: str) -> Bundle:
    """The bundle as a job run in the git work tree `toplevel` leaves it (node.json names the tree's root)."""
    node = json.loads(bundle.files[L.NODE])
    node["git"] = {"commit": "0" * 40, "branch": "main", "dirty": False, "toplevel": toplevel}
    return Bundle(bundle.path, bundle.manifest, {**bundle.files, L.NODE: json.dumps(node).encode()}, bundle.skipped)


def test_another_projects_frame_of_the_same_name_is_not_seen_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:  # fmt: skip
    # GIVEN the scenario's hang (rank 1 in `__getitem__ (train.py)`, its file scripts/scenarios/train.py of the
    # work tree /work/main), and earlier incidents with the same fingerprint: one of this project (any clone), one
    # of another project's train.py at its root, one whose file is not known (outside a work tree, an older record)
    bundle = read_bundle(str(GOLDEN / "data-hang.tar.gz"))
    plain = signature(analyze(bundle))
    sig = signature(analyze(in_work_tree(bundle, "/work/main")))
    assert (plain.top_frame, plain.top_path) == ("__getitem__ (train.py)", None)
    assert (sig.top_frame, sig.top_path) == ("__getitem__ (train.py)", "scripts/scenarios/train.py")
    assert sig.fingerprint() == plain.fingerprint()  # the file is never hashed: earlier fingerprints still match
    assert signature(analyze(in_work_tree(bundle, "/work/mai"))).top_path is None  # a prefix is not the tree
    index = IncidentIndex(str(tmp_path / "incidents.sqlite"))
    this, _ = index.add({**record(1, sig.fingerprint()), "top_path": "scripts/scenarios/train.py"})
    other, _ = index.add({**record(2, sig.fingerprint()), "top_path": "train.py"})
    unknown, _ = index.add(record(3, sig.fingerprint()))
    # WHEN this incident is looked up: THEN the other project's is left out, and only it
    found = index.similar(sig.fingerprint(), sig.category, sig.top_frame, set(), top_path=sig.top_path)
    assert [f["id"] for f in found] == [unknown, this]
    # AND an incident whose own file is unknown matches all three, as before
    assert [f["id"] for f in index.similar(sig.fingerprint(), sig.category, sig.top_frame, set())] == [
        unknown, other, this]  # fmt: skip
    index.close()
    # AND `incidents show` names the file, so that the reader sees which project an incident came from
    monkeypatch.setenv("BLACKBOX_HOME", str(tmp_path))
    code, out, err = cli("incidents", "show", str(this))
    assert code == 0, err
    assert "top frame: __getitem__ (train.py) in scripts/scenarios/train.py" in out


def test_the_work_tree_is_named_from_any_directory_in_it(tmp_path: Path) -> None:
    from blackbox.adapters.host import git_state

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tree = tmp_path / "proj"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "train.py").write_text("print()\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "c"]):
        subprocess.run(["git", *args], cwd=tree, check=True, env={**os.environ, **env})
    state = git_state(str(tree / "scripts"))
    assert (state.branch, state.dirty, state.toplevel) == ("main", False, str(tree.resolve()))
    assert state.commit is not None and len(state.commit) == 40
    (tree / "scripts" / "train.py").write_text("print(1)\n")
    assert git_state(str(tree)).dirty is True
    assert git_state(str(tmp_path)) == git_state(str(tmp_path / "nowhere"))  # outside a work tree: nothing known
    assert git_state(str(tmp_path)).toplevel is None


WRITER = """
import sys
from blackbox.incidents.store import IncidentIndex
index = IncidentIndex(sys.argv[1])
w = int(sys.argv[2])
for i in range(25):
    index.add({"sha256": f"{w:08d}{i:056d}", "bundle": "b", "fingerprint": "f", "category": "c"})
"""


def test_eight_processes_indexing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "i.sqlite")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, str(w)], cwd=ROOT, stderr=subprocess.PIPE)
             for w in range(8)]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT sha256) FROM incidents").fetchone() == (200, 200)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_schema_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "i.sqlite"
    IncidentIndex(str(path)).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(IndexUnavailable, match="written by a newer blackbox"):
        IncidentIndex(str(path))


def cli(*args: str) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    from blackbox.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_corrupt_index_warns_once_and_the_report_still_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "incidents.sqlite").write_bytes(b"this is not a database\n" * 100)
    monkeypatch.setenv("BLACKBOX_HOME", str(home))
    code, out, err = cli("report", str(GOLDEN / "raise.tar.gz"), "--format", "json", "--no-fr-analyzer")
    assert code == 0, err
    assert json.loads(out)["verdict"]["category"] == "crash.exception"
    warnings = [line for line in err.splitlines() if "incident index" in line]
    assert len(warnings) == 1 and "is unreadable" in warnings[0] and "going on without" in warnings[0], err
    assert "Traceback" not in err
    code, out, err = cli("incidents", "list")
    assert code != 0 and err.startswith("blackbox: error: The incident index"), err
    assert "Traceback" not in err


def test_bundle_text_reaches_the_terminal_inert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fields come from bundles (untrusted): markup and escape sequences are shown, never obeyed."""
    home = tmp_path / "home"
    index = IncidentIndex(str(home / "incidents.sqlite"))
    evil = {**record(1), "top_frame": "[/bold][link=x]f\x1b[2J\x1b]0;pwned\x07 (a.py)", "summary": "s\x1b[31mred"}
    number, _ = index.add(evil)
    index.close()
    monkeypatch.setenv("BLACKBOX_HOME", str(home))
    for args in (["list"], ["show", str(number)]):
        code, out, err = cli("incidents", *args)
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out and "[/bold]" in out.replace("\n", "")


def test_a_piped_list_is_one_row_a_line_at_full_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped or redirected, `incidents list` never wraps a cell: each incident is one line, its fields whole."""
    home = tmp_path / "home"
    index = IncidentIndex(str(home / "incidents.sqlite"))
    long_frame = "a_function_with_a_name_long_enough_to_wrap_any_eighty_column_table_in_two (train_model.py)"
    numbers = [index.add({**record(i), "top_frame": long_frame})[0] for i in (1, 2)]
    index.close()
    monkeypatch.setenv("BLACKBOX_HOME", str(home))
    code, out, err = cli("incidents", "list")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("incidents (") and lines[1].split()[:3] == ["#", "when", "(UTC)"]
    rows = lines[2:]
    assert len(rows) == 2 and all(long_frame in row for row in rows), out
    assert sorted(int(row.split()[0]) for row in rows) == sorted(numbers)
    code, out, err = cli("incidents", "list", "--format", "json")
    assert code == 0 and sorted(r["id"] for r in json.loads(out)["incidents"]) == sorted(numbers), err


def test_seen_before_leaves_out_the_same_run_and_is_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blackbox.incidents.indexing import index_bundle
    from blackbox.supervisor.evidence import SaidOnce

    bundle = read_bundle(str(GOLDEN / "raise.tar.gz"))
    report = analyze(bundle)
    fingerprint = signature(report).fingerprint()
    home = tmp_path / "home"
    index = IncidentIndex(str(home / "incidents.sqlite"))
    earlier_here = {**record(1, fingerprint=fingerprint), "run_id": bundle.manifest["run_id"]}
    other_run = {**record(2, fingerprint=fingerprint), "incident_id": "inc-2"}
    index.add(earlier_here)
    index.add(other_run)
    index.close()
    monkeypatch.setenv("BLACKBOX_HOME", str(home))
    # an earlier incident of this same run is not "seen before"; one of another run is
    seen = index_bundle(report, bundle, lambda m: None)
    assert [s["run_id"] for s in seen] == ["run2"] and seen[0]["incident_id"] == "inc-2", seen
    # the same incident from the local index and from shared storage is said once
    once = SaidOnce()
    assert once.first([seen[0]["incident_id"], None, "run2/n/t"])
    assert not once.first(["inc-2", "s3://b/p/run2/n/x.tar.gz", None])
    assert once.first(["inc-3", "s3://b/p/run3/n/y.tar.gz", None])


def test_a_verdict_naming_no_cause_matches_nothing_and_report_adds_only_when_asked(tmp_path: Path) -> None:
    from blackbox.incidents.fingerprint import names_a_cause
    from blackbox.intake import Intake

    env = {"BLACKBOX_HOME": str(tmp_path)}
    hang = read_bundle(str(GOLDEN / "data-hang.tar.gz"))
    # GIVEN a report that names a cause (the culprit's frame), and signatures that name none
    assert names_a_cause("__getitem__ (train.py)", None, None) and names_a_cause(None, "OSError", None)
    assert not names_a_cause(None, None, None)
    # WHEN a bundle is read with `report` (record=False): it is looked up, not added
    assert Intake(hang, pytest.fail, env=env, record=False).report.similar_incidents == []
    assert IncidentIndex(str(tmp_path / "incidents.sqlite")).count() == 0
    # AND added when asked (`report --record`, as `run` and `collect` do): the same bundle again finds nothing
    # "before" but itself, which is no incident of its own
    Intake(hang, pytest.fail, env=env)
    assert IncidentIndex(str(tmp_path / "incidents.sqlite")).count() == 1
    assert Intake(hang, pytest.fail, env=env, record=False).report.similar_incidents == []
