"""The bundle's layout and what travels with it: the trigger as data, and a written bundle handed on in memory
exactly as a reader of its file would see it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox.bundle import layout as L
from blackbox.bundle.reader import Bundle, read_bundle
from blackbox.bundle.writer import BundleWriter
from blackbox.detections import Trigger


@pytest.mark.parametrize(
    "name, rule, kind, remote",
    [("stall", "stall", None, False), ("rank-death", "rank_death", None, False), ("gpu-idle", "gpu_idle", None, False),
     ("console-comm-timeout", "console", "comm_timeout", False), ("remote-console-oom", "console", "oom", True),
     ("remote-stall", "stall", None, True), ("manual", "manual", None, False), ("signal", "signal", None, False),
     ("exit", "exit", None, False)],
)  # fmt: skip
def test_a_trigger_is_data_and_its_name_reads_back(name: str, rule: str, kind: str | None, remote: bool) -> None:
    t = Trigger.parse(name)
    assert (t.rule, t.kind, t.remote) == (rule, kind, remote)
    assert t.name == name
    assert Trigger.from_json(json.loads(json.dumps(t.to_json()))) == t


def test_untrusted_trigger_data_falls_back_to_the_name() -> None:
    # GIVEN a manifest whose triggered_by is junk, THEN the trigger's name decides; an old bundle's alias too
    assert Trigger.from_json({"rule": 3}, "console-oom") == Trigger("console", "oom")
    assert Trigger.from_json("stall", "remote-frozen") == Trigger("frozen", None, True)
    assert Trigger.from_json(None, "sigusr1").rule == "manual" and Trigger.parse("collect").on_request


def test_the_written_bundle_is_what_a_reader_of_its_file_sees(tmp_path: Path) -> None:
    # GIVEN a bundle written with a remote console trigger and a few members
    w = BundleWriter("run-1", "node7", Trigger("console", "cuda_error", remote=True))
    w.add_json(L.rank_member(0, L.HEARTBEAT), {"rank": 0, "step": 3})
    w.add_bytes(L.CONSOLE_TAIL, b"CUDA error: an illegal memory access was encountered\n")
    written = w.write(str(tmp_path), {"job": {"world_size": 1}})
    # WHEN it is handed on in memory and read back from disk
    mine, theirs = Bundle.of(written), read_bundle(written.path)
    # THEN both hold the same members, manifest, trigger and digest (the file's own sha256)
    assert written.sha256 == hashlib.sha256(Path(written.path).read_bytes()).hexdigest()
    assert mine.files == theirs.files and mine.manifest == theirs.manifest
    assert mine.digests == theirs.digests == {written.path: written.sha256}
    assert theirs.trigger == Trigger("console", "cuda_error", remote=True)
    assert theirs.manifest["trigger"] == "remote-console-cuda-error" and "remote-console-cuda-error" in written.path


def test_member_names_come_from_one_place() -> None:
    assert L.process_member(3, L.PYSPY) == "ranks/3/py-spy.json"
    assert L.process_member(3, L.PROC, 812) == "ranks/3/proc-worker-812.json"
    assert L.process_member(None, L.PYSPY) == "agent/py-spy.json"
    assert L.worker_pid(3, L.PYSPY, "ranks/3/py-spy-worker-812.json") == 812
    assert L.worker_pid(3, L.PYSPY, "ranks/3/py-spy-worker-\uff18.json") is None  # ASCII digits only
    assert L.numbered(2, P.RANK_STACKS, "ranks/2/stacks-11.txt") == 11
    assert L.numbered(2, P.RANK_PYDUMP, "ranks/2/stacks-11.txt") is None
    assert L.config_member("/job/cfg/train.yaml") == "node/config/job_cfg_train.yaml"
    assert L.glob(P.RANK_MEMORY_SNAPSHOT) == "memory-snapshot-*.pickle"


def test_a_ranks_records_are_one_table_and_read_as_their_members(tmp_path: Path) -> None:
    # GIVEN a bundle whose ranks' records go to the node's rank table, beside a helper's member
    w = BundleWriter("run-1", "node7", Trigger("stall"))
    w.add_record(3, L.HEARTBEAT, {"rank": 3, "step": 9})
    w.add_record(3, L.PYSPY + ".json", [{"thread_name": "MainThread", "frames": []}])
    w.add_record(12, L.PROC + ".json", {"state": "S (sleeping)"})
    w.add_json(L.process_member(3, L.PYSPY, 812), [])
    written = w.write(str(tmp_path), {})
    # THEN the file holds one table, not a member per record, and a reader sees the members they stand for
    assert L.RANK_TABLE in written.members and L.rank_member(3, L.HEARTBEAT) not in written.members
    assert written.manifest["schema_version"] == L.MANIFEST_SCHEMA_VERSION == 2
    for bundle in (read_bundle(written.path), Bundle.of(written)):
        assert bundle.json(L.rank_member(3, L.HEARTBEAT)) == {"rank": 3, "step": 9}
        assert bundle.json(L.process_member(12, L.PROC))["state"] == "S (sleeping)"
        assert bundle.ranks() == [3, 12] and L.process_member(3, L.PYSPY, 812) in bundle.rank_files(3)
        assert not bundle.skipped


def test_a_hostile_rank_table_loses_only_its_bad_lines(tmp_path: Path) -> None:
    from blackbox.bundle.reader import expand_rank_table

    table = (b'[1,"heartbeat.json",{"step":1}]\n'  # good
             b'[2,"../../etc/passwd",{}]\n[x,"heartbeat.json",{}]\n[\xd9\xa3,"proc.json",{}]\n'  # not ours
             b'[0000000003,"proc.json",{}]\n{"rank":4}\n[5,"heartbeat.json",{"step":\n\n'  # too long, junk, cut
             b'[007,"history.json",[]]\n')  # fmt: skip
    files = {L.RANK_TABLE: table, L.rank_member(1, L.HEARTBEAT): b'{"step":0}'}
    skipped: list[str] = []
    expand_rank_table(files, skipped)
    # a member of its own wins over the table's line; the cut line parses as nothing; "007" is rank 7
    assert files[L.rank_member(1, L.HEARTBEAT)] == b'{"step":0}' and L.rank_member(7, L.HISTORY) in files
    assert sorted(files) == [L.rank_member(1, L.HEARTBEAT), L.rank_member(7, L.HISTORY)]
    assert skipped == [f"{L.RANK_TABLE}: 6 line(s) that are not a rank's record"]
