"""The analyzer on bundles built in memory: stack groups across ranks, suspects that cause rather than wait,
crash categories from the recorder's exception records. Pure: no processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle, read_bundles
from blackbox.bundle.writer import BundleWriter
from blackbox.detections import Trigger
from blackbox.errors import BlackboxError

TORCH = "/venv/lib/python3.11/site-packages/torch"


def frame(name: str, filename: str, line: int) -> dict[str, Any]:
    return {"name": name, "filename": filename, "short_filename": filename.rsplit("/", 1)[-1], "line": line,
            "module": None, "locals": None}  # fmt: skip


def pyspy(*frames: dict[str, Any]) -> list[dict[str, Any]]:
    """py-spy's JSON for one main thread; frames given outermost first, stored innermost first as py-spy does."""
    return [{"pid": 1, "thread_id": 7, "thread_name": "MainThread", "owns_gil": False, "active": False,
             "frames": list(reversed(frames))}]  # fmt: skip


IN_ALL_REDUCE = pyspy(frame("<module>", "/job/train.py", 120), frame("main", "/job/train.py", 88),
                      frame("wrapper", f"{TORCH}/distributed/c10d_logger.py", 81),
                      frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 3252))  # fmt: skip
IN_DATASET = pyspy(frame("<module>", "/job/train.py", 120), frame("main", "/job/train.py", 70),
                   frame("__next__", f"{TORCH}/utils/data/dataloader.py", 733),
                   frame("fetch", f"{TORCH}/utils/data/_utils/fetch.py", 52),
                   frame("__getitem__", "/job/data.py", 31))  # fmt: skip


def bundle(tmp_path: Path, trigger: str, stacks: dict[int, list[dict[str, Any]]],
           heartbeats: Optional[dict[int, dict[str, Any]]] = None,
           exceptions: Optional[dict[int, list[dict[str, Any]]]] = None,
           detection: Optional[dict[str, Any]] = None) -> Path:  # fmt: skip
    w = BundleWriter("run-1", "node7", Trigger.parse(trigger))
    for rank, threads in stacks.items():
        w.add_json(f"ranks/{rank}/py-spy.json", threads)
    for rank, hb in (heartbeats or {}).items():
        w.add_json(f"ranks/{rank}/heartbeat.json", {"rank": rank, "pid": 100 + rank, "alive": True, **hb})
    for rank, records in (exceptions or {}).items():
        w.add_bytes(f"ranks/{rank}/exceptions.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
    if detection is not None:
        w.add_json("detection.json", detection)
    local = [{"rank": r, "pid": 100 + r, "local_rank": r, "recorder": False, "alive": True} for r in stacks]
    return Path(w.write(str(tmp_path), {"job": {"local_ranks": local, "world_size": len(stacks)}}).path)


def test_odd_rank_out_is_the_suspect_of_a_manual_collection(tmp_path: Path) -> None:
    # GIVEN eight ranks collected without the recorder: seven wait in all_reduce, rank 3 sits in its dataset
    path = bundle(tmp_path, "manual", {r: IN_DATASET if r == 3 else IN_ALL_REDUCE for r in range(8)})
    report = analyze(read_bundle(str(path)))
    # THEN rank 3 is the suspect of a data-loading hang, and the stack groups put it first
    assert report.verdict.category == "hang.data_loading" and report.verdict.suspect_ranks == [3]
    first, second = report.stack_groups
    assert first["ranks"] == [3] and first["odd"] and first["signature"] == "__getitem__ (data.py:31)"
    assert second["ranks"] == [0, 1, 2, 4, 5, 6, 7] and not second["odd"]
    assert second["describe"] == "ranks 0-2, 4-7: all_reduce ← main (train.py:88)"
    assert "… 1 library frame(s) …" in second["frames"]
    rows = {r.rank: r for r in report.ranks}
    assert rows[3].top_frame == "__getitem__ (data.py:31)" and rows[3].step is None
    assert any(f.kind == "inferred" and "holds the others up" in f.text for f in report.findings)


def test_first_exception_is_the_cause_of_a_crash(tmp_path: Path) -> None:
    # GIVEN rank 1 raised first, then rank 0 failed because its peer was gone
    exc = {1: [{"time": 100.0, "thread": "MainThread", "type": "builtins.ValueError", "message": "bad batch"}],
           0: [{"time": 100.4, "thread": "MainThread", "type": "builtins.RuntimeError",
                "message": "Connection reset by peer"}]}  # fmt: skip
    hbs = {0: {"state": "exception", "phase": "collective"}, 1: {"state": "exception", "phase": "compute"}}
    report = analyze(read_bundle(str(bundle(tmp_path, "exception", {}, hbs, exc))))
    assert report.verdict.category == "crash.exception" and report.verdict.suspect_ranks == [1]
    assert "ValueError" in report.verdict.summary and "bad batch" in report.verdict.summary


def test_collective_timeout_blames_the_rank_that_never_arrived(tmp_path: Path) -> None:
    # GIVEN rank 0 raised a Gloo timeout while waiting in all_reduce; rank 1 was elsewhere
    exc = {0: [{"time": 50.0, "thread": "MainThread", "type": "torch.distributed.DistBackendError",
                "message": "Timed out waiting 5000ms for recv operation to complete"}]}  # fmt: skip
    hbs = {0: {"state": "exception", "phase": "collective"}, 1: {"state": "running", "phase": "data"}}
    report = analyze(read_bundle(str(bundle(tmp_path, "exception", {}, hbs, exc))))
    # THEN the victim that raised is not the suspect: the rank that never arrived is
    assert report.verdict.category == "crash.comm_timeout" and report.verdict.suspect_ranks == [1]
    assert report.verdict.phase == "data"


def test_console_oom_line_is_an_oom(tmp_path: Path) -> None:
    exc = {2: [{"time": 5.0, "thread": "MainThread", "type": "torch.OutOfMemoryError",
                "message": "CUDA out of memory. Tried to allocate 2.00 GiB"}]}  # fmt: skip
    report = analyze(read_bundle(str(bundle(tmp_path, "console-oom", {r: IN_ALL_REDUCE for r in range(3)},
                                            exceptions=exc))))  # fmt: skip
    assert report.verdict.category == "crash.oom" and report.verdict.suspect_ranks == [2]
    assert report.headline()[0].startswith("verdict: crash.oom, suspect rank(s) 2")


def test_memory_snapshot_and_oom_figures(tmp_path: Path) -> None:
    # GIVEN an OOM record and a CUDA memory snapshot (plain data, as torch.cuda.memory._snapshot() pickles it)
    import pickle

    snapshot = {"segments": [{"device": 0, "total_size": 6 * 2**30, "blocks": [
        {"size": 4 * 2**30, "state": "active_allocated", "frames": [
            {"filename": f"{TORCH}/nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": "/job/model.py", "line": 42, "name": "forward"}]},
        {"size": 2**30, "state": "inactive", "frames": []}]}], "device_traces": []}  # fmt: skip
    w = BundleWriter("run-1", "node7", Trigger.parse("console-oom"))
    w.add_bytes("ranks/0/oom.jsonl", (json.dumps({
        "message": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
                   "1.06 GiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 3.50 GiB is "
                   "reserved by PyTorch but unallocated.",
        "phase": "compute", "step": 7, "last_batch": [{"path": "batch[0]", "shape": [64, 2048], "dtype": "int64"}],
    }) + "\n").encode())  # fmt: skip
    w.add_bytes("ranks/0/memory-snapshot-oom-1.pickle", pickle.dumps(snapshot), keep="whole")
    w.add_json("ranks/0/heartbeat.json", {"rank": 0, "pid": 5, "alive": False, "state": "exception", "step": 7})
    report = analyze(read_bundle(w.write(str(tmp_path), {}).path))
    texts = [f.text for f in report.findings]
    # THEN the figures, the shapes and the largest live allocation with its user frame are all there
    assert report.verdict.category == "crash.oom" and report.verdict.suspect_ranks == [0]
    assert any("requested 2.00 GiB" in t and "reserved unallocated 3.50 GiB" in t for t in texts)
    assert any("live allocation of 4.00 GiB from model.py:42 (forward)" in t for t in texts)
    assert "batch[0] [64, 2048] int64" in report.next_actions[0]
    assert any("trace_plot memory-snapshot-oom-1.pickle" in a for a in report.next_actions)
    assert any("expandable_segments" in a and "3.50 GiB" in a for a in report.next_actions)


def test_a_snapshot_that_would_run_code_is_refused(tmp_path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    w = BundleWriter("run-1", "node7", Trigger.parse("manual"))
    w.add_bytes("ranks/0/memory-snapshot-1.pickle", pickle.dumps({"segments": [Evil()]}), keep="whole")
    w.add_json("ranks/0/py-spy.json", IN_ALL_REDUCE)
    report = analyze(read_bundle(w.write(str(tmp_path), {}).path))
    assert any("could not be read" in f.text and "builtins.print" in f.text for f in report.findings)


def test_flight_recorder_names_the_collective_not_joined(tmp_path: Path) -> None:
    # GIVEN flight-recorder dumps: rank 0 enqueued all_reduce #5 from train.py:88; rank 1 stopped at #4
    import pickle

    def dump(last: int) -> bytes:
        entries = [{"process_group": ("0", "default_pg"), "collective_seq_id": seq, "profiling_name": "gloo:all_reduce",
                    "frames": [{"name": "all_reduce", "filename": f"{TORCH}/distributed/distributed_c10d.py",
                                "line": 3245}, {"name": "main", "filename": "/job/train.py", "line": 80 + seq}]}
                   for seq in range(1, last + 1)]  # fmt: skip
        return pickle.dumps({"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
                             "pg_status": {"0": {"last_enqueued_collective": last, "last_completed_collective": 4}},
                             "entries": entries})  # fmt: skip

    w = BundleWriter("run-1", "node7", Trigger.parse("manual"))
    w.add_bytes("flight_recorder/fr_trace_0", dump(5), keep="whole")
    w.add_bytes("flight_recorder/fr_trace_1", dump(4), keep="whole")
    w.add_json("ranks/0/py-spy.json", IN_ALL_REDUCE)
    w.add_json("ranks/1/py-spy.json", IN_ALL_REDUCE)
    report = analyze(read_bundle(w.write(str(tmp_path), {}).path))
    # THEN rank 1 is named with the op, its number, the group, and where each side was
    assert report.verdict.category == "hang.collective" and report.verdict.suspect_ranks == [1]
    (u,) = report.collectives
    assert (u["op"], u["seq"], u["missing"], u["waiting"]) == ("all_reduce", 5, [1], [0])
    assert any("rank 1 never entered all_reduce #5 (group default_pg) that rank 0 waits in at train.py:85 (main)"
               in f.text and "rank 1 last entered a collective at train.py:84 (main)" in f.text
               for f in report.findings)  # fmt: skip


def test_kernel_oom_killer_makes_a_host_oom(tmp_path: Path) -> None:
    w = BundleWriter("run-1", "node7", Trigger.parse("rank-death"))
    w.add_json("ranks/1/heartbeat.json", {"rank": 1, "pid": 77, "alive": False, "state": "running", "step": 3})
    w.add_json("ranks/0/heartbeat.json", {"rank": 0, "pid": 76, "alive": True, "state": "running", "step": 3})
    w.add_bytes("node/kernel-messages.txt", b"[Sun Nov 29 12:00:00 2026] Out of memory: Killed process 77 (python)\n")
    w.add_json("detection.json", {"rule": "rank_death", "ranks": [1], "suspects": [1], "reason": "rank 1 was killed"})
    report = analyze(read_bundle(w.write(str(tmp_path), {}).path))
    assert report.verdict.category == "crash.host_oom" and report.verdict.suspect_ranks == [1]
    assert any(f.source == "node/kernel-messages.txt" for f in report.findings)
    assert "OOM killer" in report.next_actions[0]


def test_an_oom_kill_of_another_process_is_not_this_jobs_death(tmp_path: Path) -> None:
    # GIVEN a rank killed by SIGKILL, and a kernel log whose OOM killer ended another process earlier (pid 2366)
    w = BundleWriter("run-1", "node7", Trigger.parse("rank-death"))
    w.add_json("ranks/1/heartbeat.json", {"rank": 1, "pid": 77, "alive": False, "state": "running", "step": 3})
    w.add_json("ranks/0/heartbeat.json", {"rank": 0, "pid": 76, "alive": True, "state": "running", "step": 3})
    w.add_bytes("node/kernel-messages.txt", b"[Sun Dec  6 05:21:22 2026] oom-kill:constraint=CONSTRAINT_NONE,nodemask="
                b"(null),cpuset=/,mems_allowed=0,global_oom,task=python,pid=2366,uid=0\n[Sun Dec  6 05:21:22 2026] "
                b"Out of memory: Killed process 2366 (python) total-vm:1001388kB, anon-rss:221828kB\n")  # fmt: skip
    w.add_json("detection.json", {"rule": "rank_death", "ranks": [1], "suspects": [1], "reason": "rank 1 was killed"})
    w.add_json("ranks/1/rank.json", {"exit_code": -9})
    report = analyze(read_bundle(w.write(str(tmp_path), {}).path))
    # THEN the rank died by its signal, not of the node's memory; the OOM kill is said as what it was
    assert report.verdict.category != "crash.host_oom" and "OOM killer was active" not in report.verdict.summary
    assert any(f.text.startswith("the kernel's OOM killer ended a process that is none of this job's ranks")
               and "Killed process 2366" in f.text for f in report.findings), report.findings  # fmt: skip
    assert not report.next_actions[0].startswith("The kernel killed")


def node_bundle(out: Path, run_id: str, node: str, stacks: dict[int, list[dict[str, Any]]], world: int) -> str:
    w = BundleWriter(run_id, node, Trigger.parse("manual"))
    for rank, threads in stacks.items():
        w.add_json(f"ranks/{rank}/py-spy.json", threads)
    w.add_json("node.json", {"hostname": node})
    local = [{"rank": r, "pid": 100 + r, "local_rank": r % 2, "recorder": False, "alive": True} for r in stacks]
    out.mkdir(exist_ok=True)
    return w.write(str(out), {"job": {"local_ranks": local, "world_size": world}}).path


def test_node_bundles_of_one_job_merge_into_one_view(tmp_path: Path) -> None:
    # GIVEN two nodes' bundles of one 4-rank job: rank 3 (node b) sits in its dataset, the rest in all_reduce
    a = node_bundle(tmp_path / "x", "run-9", "node-a", {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, 4)
    b = node_bundle(tmp_path / "x", "run-9", "node-b", {2: IN_ALL_REDUCE, 3: IN_DATASET}, 4)
    # WHEN reported together (as two paths, or as the directory that holds them)
    for merged in (read_bundles([a, b]), read_bundles([str(tmp_path / "x")])):
        report = analyze(merged)
        # THEN the suspect is found across nodes, with its node, and the stack groups span both nodes
        assert report.verdict.suspect_ranks == [3] and report.verdict.category == "hang.data_loading"
        assert {r.rank: r.node for r in report.ranks} == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
        assert [g["ranks"] for g in report.stack_groups] == [[3], [0, 1, 2]]
        assert "nodes/node-a/node.json" in merged.files and "nodes/node-b/node.json" in merged.files
        assert not any("none of the bundles" in f.text for f in report.findings)


def test_a_missing_node_is_named(tmp_path: Path) -> None:
    a = node_bundle(tmp_path, "run-9", "node-a", {0: IN_ALL_REDUCE, 1: IN_DATASET}, 4)
    report = analyze(read_bundles([a]))
    assert any("ranks 2-3 of 4 are in none of the bundles given" in f.text for f in report.findings)


def test_bundles_of_different_jobs_are_refused(tmp_path: Path) -> None:
    a = node_bundle(tmp_path, "run-1", "node-a", {0: IN_ALL_REDUCE}, 2)
    b = node_bundle(tmp_path, "run-2", "node-b", {1: IN_ALL_REDUCE}, 2)
    with pytest.raises(BlackboxError, match="belong to different jobs"):
        read_bundles([a, b])


def test_a_healthy_job_collected_on_request_is_ok(tmp_path: Path) -> None:
    in_compute = pyspy(frame("<module>", "/job/train.py", 120), frame("main", "/job/train.py", 60),
                       frame("forward", "/job/model.py", 12))  # fmt: skip
    report = analyze(read_bundle(str(bundle(tmp_path, "manual", {r: in_compute for r in range(4)}))))
    assert report.verdict.category == "ok" and report.verdict.suspect_ranks == []
    (only,) = report.stack_groups
    assert only["ranks"] == [0, 1, 2, 3] and not only["odd"]


def test_cuda_error_message_is_a_cuda_error(tmp_path: Path) -> None:
    exc = {1: [{"time": 1.0, "thread": "MainThread", "type": "builtins.RuntimeError",
                "message": "CUDA error: an illegal memory access was encountered"}]}  # fmt: skip
    hbs = {0: {"state": "running", "phase": "collective"}, 1: {"state": "exception", "phase": "compute"}}
    report = analyze(read_bundle(str(bundle(tmp_path, "exception", {}, hbs, exc))))
    assert report.verdict.category == "crash.cuda_error" and report.verdict.suspect_ranks == [1]
    assert "Xid" in report.next_actions[0]


def test_a_stall_before_the_first_step_is_unknown(tmp_path: Path) -> None:
    hbs = {0: {"state": "running", "phase": "startup", "step": 0}, 1: {"state": "running", "phase": "startup",
                                                                        "step": 0}}  # fmt: skip
    det = {"rule": "stall", "ranks": [0, 1], "suspects": [0, 1], "reason": "no rank stands out"}
    report = analyze(read_bundle(str(bundle(tmp_path, "stall", {}, hbs, detection=det))))
    assert report.verdict.category == "hang.unknown" and report.verdict.confidence == "low"


def test_a_script_the_interpreter_could_not_start_is_quoted_not_a_traceback() -> None:
    from blackbox.adapters.comm_log import parse_console

    cant = "/usr/bin/python3: can't open file '/work/trian.py': [Errno 2] No such file or directory"
    text = "\n".join(
        [
            cant,
            cant,
            "/usr/bin/python3: No module named trian",
            "Traceback (most recent call last):",
            "ModuleNotFoundError: No module named 'trian'",
            "E1206 08:25:34 failed (exitcode: 2)",
        ]
    )
    assert parse_console(text).no_start == [cant, "/usr/bin/python3: No module named trian"]


def test_an_exit_status_is_read_as_the_supervisor_words_it() -> None:
    # (a rank blackbox reaped with code 7 was "exited normally": its words were not read, only the analysis' own)
    from blackbox.analyze.states import _exit_code

    said = ("exited with code 7", "exited with code 0", "died of signal 9 (SIGKILL)", "exit code 3",
            "signal 15 (SIGTERM)", "running")  # fmt: skip
    assert [_exit_code(s) for s in said] == [7, 0, -9, 3, -15, None]


def test_the_life_stage_of_a_rank_and_a_hang_after_training() -> None:
    from blackbox.analyze.model import RankRow, Report, Verdict
    from blackbox.detections import life_stage

    # a rank's place in its life, from its step, its recorder's state, and what its stack says
    assert life_stage(None, "unknown", True, False, False) == ""  # no recorder, nothing else known
    assert life_stage(0, "starting", True, True, False) == "rendezvous"
    assert life_stage(0, "starting", True, False, False) == "startup"
    assert life_stage(12, "running", True, False, False) == "training"
    assert life_stage(12, "running", True, False, True) == "exiting"  # joining its threads at exit
    assert life_stage(12, "exited", True, False, False) == "exiting"  # its exit handlers ran, it is still there
    assert life_stage(12, "exited", False, False, False) == "exited"
    assert life_stage(12, "running", False, False, False) == "training"  # it died where it was

    def report(category: str, stages: dict[int, str], suspects: list[int]) -> Report:
        rows = [RankRow(r, "n", 1, "running", 3, "compute", None, stage=s) for r, s in stages.items()]
        return Report("run", "n", "stall", "b", Verdict(category, None, suspects, "high", ""), rows, [], [])

    # a job ended for a hang is "after training" only when every rank it blamed was exiting
    assert report("hang.io", {0: "exiting", 1: "exited"}, [0]).after_training()
    assert not report("hang.io", {0: "exiting", 1: "training"}, [0, 1]).after_training()
    assert not report("hang.io", {0: "training", 1: "exited"}, [0]).after_training()
    assert not report("crash.exit", {0: "exiting"}, [0]).after_training()
    assert not report("hang.io", {0: "exiting"}, []).after_training()


def test_the_next_actions_name_several_suspects_of_one_host_in_plain_words() -> None:
    from blackbox.analyze.actions import Facts, next_actions
    from blackbox.analyze.model import RankRow, Verdict

    # GIVEN two ranks of one host that raised the same exception, naming a file
    rows = {r: RankRow(r, "vm", 100 + r, "exception", 3, "compute", None, alive=False) for r in (0, 1)}
    facts = Facts("vm", rows, exception="FileNotFoundError: '/data/shard-3.bin' at train.py:88",
                  exception_path="/data/shard-3.bin")  # fmt: skip
    actions = next_actions(Verdict("crash.exception", "data", [0, 1], "high", ""), facts)
    # THEN both are named once, as ranks of that host, in sentences that read for several
    assert actions[0].startswith("Check `/data/shard-3.bin`, the file named in the exception of ranks 0, 1 on vm: ")
    assert actions[1].startswith("Read the exception of ranks 0, 1 on vm: FileNotFoundError: '/data/shard-3.bin' "
                                 "at train.py:88.")  # fmt: skip
    # AND one suspect reads as before
    one = next_actions(Verdict("crash.signal", None, [1], "high", ""), Facts("vm", rows))
    assert one[0].startswith("Read the fatal.txt (faulthandler) of rank 1 on vm for a segfault or abort")


def test_a_failure_after_another_nodes_preemption_says_so_first(tmp_path: Path) -> None:
    # GIVEN a real bundle of a rank's exception, taken after node 0 of the job was being ended from outside
    from tests.unit.test_hostile_bundles import GOLDEN, edit_json, members, write

    peer = {"node": "0", "host": "pod-a", "why": "the pod is being deleted, preempted or drained (Kubernetes)",
            "time": 1_700_000_000.0}  # fmt: skip
    files = edit_json(members(GOLDEN / "raise.tar.gz"), "manifest.json",
                      lambda m: m.setdefault("incident", {}).update(after_peer_preemption=peer))  # fmt: skip
    r = analyze(read_bundle(str(write(tmp_path / "b.tar.gz", files))))
    # THEN the verdict's sentence opens with that preemption, then the failure's own words; the blame is unchanged
    said = r.verdict.summary
    assert said == ("Node 0 (pod-a) was being ended from outside at 22:13:20 UTC (the pod is being deleted, preempted "
                    "or drained (Kubernetes)), and what failed here followed it: rank 1 raised ValueError: bad sample "
                    "at step 3 first."), said  # fmt: skip
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("crash.exception", [1])
    # AND the first action sends the reader to that node's ending, the failure's own actions after it
    assert r.next_actions[0].startswith("Start with why node 0 (pod-a) was ended (its own bundle,"), r.next_actions
    assert r.next_actions[1].startswith("Read the exception of rank 1 on "), r.next_actions
