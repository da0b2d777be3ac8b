"""`blackbox status`'s model on a hand-made run directory: real heartbeat pages (the recorder's own writer), an
events log with a straggler episode and a bundle; a run whose supervisor is gone says so; bad paths are one
sentence."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox._recorder.heartbeat_writer import HeartbeatWriter
from blackbox.adapters import gpu
from blackbox.errors import BlackboxError
from blackbox.render.status import render_status, render_status_json
from blackbox.status import find_run, open_table, read_status


def make_run(root: Path, supervisor_pid: int, ended: bool = False) -> Path:
    run = root / "blackbox-runs" / "20261201-000000-abcdef"
    for rank in (0, 1):
        (run / "ranks" / str(rank)).mkdir(parents=True)
        hb = HeartbeatWriter(str(run / "ranks" / str(rank) / "heartbeat"), pid=os.getpid(), start_ticks=0, rank=rank,
                             local_rank=rank, world_size=2, mode="rank")  # fmt: skip
        now, own = time.monotonic(), P.PHASE_DATA if rank else P.PHASE_BACKWARD
        hb.progress(40, now, 0.25, 0.3)
        hb.liveness(9, now)
        # the ledger as the phase writes keep it: 6 s in its own phase, then 4 s of compute, then that phase again
        hb.phase(own, hb.mono0, 0, 0)
        hb.phase(P.PHASE_COMPUTE, hb.mono0 + 6, 0, 0)
        hb.phase(own, hb.mono0 + 10, 0, 0)
    events = [
        {"event": "start", "time": "2026-12-01T00:00:00+00:00", "run_id": "20261201-000000-abcdef",
         "pid": supervisor_pid, "command": ["torchrun", "train.py"]},
        {"event": "straggler", "time": "2026-12-01T00:01:00+00:00", "ranks": [1], "phase": "data", "factor": 2.5,
         "details": {"1": {"phase": "data", "factor": 2.5}}},
        {"event": "bundle", "time": "2026-12-01T00:02:00+00:00", "path": "/b.tar.gz", "trigger": "manual"},
        {"event": "verdict", "bundle": "/b.tar.gz", "category": "ok", "suspect_ranks": [1], "summary": "s"},
        *([{"event": "end", "exit_code": 0}] if ended else []),
    ]  # fmt: skip
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_a_run_as_it_stands(tmp_path: Path) -> None:
    # GIVEN a run whose supervisor is gone (this process's pid is not a blackbox) and whose rank 1 is a straggler
    run = make_run(tmp_path, os.getpid())
    assert find_run(None, str(tmp_path)) == str(run)  # the newest run under ./blackbox-runs
    table = open_table(str(run))
    try:
        s = read_status(find_run(str(run)), table, gpus=[])
    finally:
        table.close()
    # THEN it says it is not live and why, and shows each rank's last state with where its time went
    assert not s.live and "supervisor" in (s.why_not_live or "") and s.run_id == "20261201-000000-abcdef"
    r0, r1 = s.ranks
    assert (r1.phase, r1.step, r1.straggler, r0.straggler) == ("data", 40, True, False)
    assert (r0.stage, r1.stage) == ("training", "training")  # where in its life: step 40, alive
    assert r1.time_share["data"] > 0.5 and r0.time_share["backward"] > 0.5 and r1.steps_per_s == 4.0
    assert s.stragglers == [{"rank": 1, "phase": "data", "factor": 2.5, "started": "2026-12-01T00:01:00+00:00",
                             "ended": None}]  # fmt: skip
    assert s.incidents[0]["category"] == "ok" and s.incidents[0]["bundle"] == "/b.tar.gz"
    out = io.StringIO()
    render_status(s, out)
    assert "not live" in out.getvalue() and "data (straggler)" in out.getvalue()
    out = io.StringIO()
    render_status_json(s, out)
    data = json.loads(out.getvalue())
    assert data["schema_version"] == 1 and data["ranks"][1]["time_share"]["data"] > 0.5
    assert data["ranks"][1]["stage"] == "training"


def test_the_gpus_with_their_memory(tmp_path: Path) -> None:
    # the readings as the GPU adapter gives them (NVML on a lent H200 gave utilisation but, before, no memory here)
    run = make_run(tmp_path, os.getpid())
    reading = gpu.GpuReading(index=0, name="NVIDIA H200", temperature_c=47.0, utilization_pct=100.0,
                             memory_used_mib=1989.875, memory_total_mib=143771.0, power_w=None, throttle=None,
                             slowdown_temp_c=None)  # fmt: skip
    table = open_table(str(run))
    try:
        s = read_status(str(run), table, gpus=[reading])
    finally:
        table.close()
    out = io.StringIO()
    render_status(s, out)
    assert "GPU0 NVIDIA H200 util 100 % 47 C 1990/143771 MiB" in " ".join(out.getvalue().split())
    out = io.StringIO()
    render_status_json(s, out)
    g = json.loads(out.getvalue())["gpus"][0]
    assert (g["utilization_pct"], g["memory_used_mib"], g["memory_total_mib"]) == (100.0, 1989.875, 143771.0)


def test_an_ended_run_and_bad_paths(tmp_path: Path) -> None:
    run = make_run(tmp_path, os.getpid(), ended=True)
    table = open_table(str(run))
    try:
        s = read_status(str(run), table, gpus=[])
    finally:
        table.close()
    assert not s.live and s.why_not_live == "the run ended (blackbox run exited with 0)" and s.exit_code == 0
    with pytest.raises(BlackboxError, match="is not a run directory"):
        find_run(str(tmp_path))
    with pytest.raises(BlackboxError, match="There is no run under"):
        find_run(None, str(tmp_path / "elsewhere"))


def test_each_rank_shows_what_moves(tmp_path: Path) -> None:
    # GIVEN a run whose rank 0 takes no step but its main thread's stack changes and its forward calls are counted,
    # and whose rank 1 (this process: alive) has done I/O
    run = make_run(tmp_path, os.getpid())
    hb = HeartbeatWriter(str(run / "ranks" / "0" / "heartbeat"), pid=os.getpid(), start_ticks=0, rank=0,
                         local_rank=0, world_size=2, mode="rank")  # fmt: skip
    now = time.monotonic()
    hb.progress(40, now - 100, 0.25, 0.3)
    hb.liveness(9, now)
    hb.motion(1234, now - 1, 56, now - 0.5, P.FORWARDS_COUNTING)
    table = open_table(str(run))
    try:
        first = read_status(str(run), table, gpus=[])
        with open(os.devnull, "w") as f:  # this process writes: its I/O moves between two readings (top)
            f.write("x" * 100_000)
        second = read_status(str(run), table, first, gpus=[])
    finally:
        table.close()
    # THEN status says what moved, and when: rank 0 by its stack and forward calls, 100 s after its last step
    r0 = first.ranks[0]
    assert r0.idle_s >= 100 and r0.moved_s < 5 and r0.moving == ["forward", "stack"]
    assert (r0.forwards, r0.forward_mode, r0.stack_changes) == (1234, "counting", 56)
    assert r0.read_bytes is not None and r0.read_bytes > 0  # this process's own counters
    # AND between two readings (top) the I/O rates, and I/O among what moved
    r0 = second.ranks[0]
    assert r0.written_per_s is not None and r0.written_per_s > 0 and "io" in r0.moving
    out = io.StringIO()
    render_status(second, out)
    assert "1234 fwd stack" in out.getvalue() and "B/s" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    render_status_json(second, out)
    data = json.loads(out.getvalue())["ranks"][0]
    assert data["forwards"] == 1234 and data["moving"] == ["forward", "stack", "io"] and data["moved_at"] > 0


def test_an_unreadable_proc_io_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a live run whose ranks (this process) have I/O counters /proc refuses (another user's, no ptrace)
    run = make_run(tmp_path, os.getpid())
    monkeypatch.setattr("blackbox.status.procfs.io_counters", lambda pid, tid=None: None)
    table = open_table(str(run))
    try:
        status = read_status(str(run), table, gpus=[])
    finally:
        table.close()
    # THEN each rank says so, and status says it under the table: its I/O is not seen
    assert all(r.io_unreadable and r.read_bytes is None for r in status.ranks)
    out = io.StringIO()
    render_status(status, out, width=200)
    assert f"/proc/{os.getpid()}/io cannot be read" in out.getvalue()


def test_a_still_rank_says_which_child_it_waits_for(tmp_path: Path) -> None:
    # GIVEN a live run whose rank 0 has not moved for 100 s: its main thread waits for a child (subprocess.run)
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"])
    try:
        run = make_run(tmp_path, os.getpid())
        now = time.monotonic()
        hb = HeartbeatWriter(str(run / "ranks" / "0" / "heartbeat"), pid=parent.pid, start_ticks=0, rank=0,
                             local_rank=0, world_size=2, mode="rank")  # fmt: skip
        hb.progress(40, now - 100, 0.25, 0.3)
        hb.liveness(9, now)
        time.sleep(1.0)  # the parent settles in wait4
        table = open_table(str(run))
        try:
            s = read_status(str(run), table, gpus=[])
        finally:
            table.close()
        # THEN status names the child, and the table's line says so
        r0 = s.ranks[0]
        assert r0.moving == [] and r0.waits_for is not None, r0
        assert r0.waits_for.startswith("its child `sleep 30` (pid ") and r0.waits_for.endswith(")"), r0.waits_for
        out = io.StringIO()
        render_status(s, out, width=200)
        assert "rank 0 waits for its child `sleep 30` (pid " in out.getvalue(), out.getvalue()
        assert s.ranks[1].waits_for is None  # this test's process: it waits for no child
    finally:
        from blackbox.adapters import procfs

        for child in procfs.children(parent.pid):  # this test's own `sleep`, never another's
            os.kill(child, 9)
        parent.kill()
        parent.wait()


@pytest.mark.parametrize(("world", "unseen"), [(4, "2 have"), (3, "1 has")])
def test_who_has_not_joined_while_others_wait_in_the_rendezvous(tmp_path: Path, world: int, unseen: str) -> None:
    # GIVEN a world of 4 (or 3) of which this node holds ranks 0 and 1: rank 0 inside init_process_group for 42 s,
    # rank 1 not yet in it (still before it, at step 0), ranks 2 and 3 (or 2) with no heartbeat here
    run = make_run(tmp_path, os.getpid())
    pages = {}
    for rank, join in ((0, P.JOIN_JOINING), (1, P.JOIN_NOT_YET)):
        path = str(run / "ranks" / str(rank) / "heartbeat")
        hb = pages[rank] = HeartbeatWriter(path, pid=os.getpid(), start_ticks=0, rank=rank, local_rank=rank,
                                           world_size=world, mode="rank")  # fmt: skip
        now = time.monotonic()
        hb.progress(0, now - 42, 0.0, 0.0)
        hb.liveness(1, now)
        hb.join(join)
    table = open_table(str(run))
    try:
        s = read_status(str(run), table, gpus=[])
        # THEN each rank says where it is in joining, rank 0's stage is the rendezvous, and status names who is missing
        assert [(r.join, r.stage) for r in s.ranks] == [("joining", "rendezvous"), ("", "startup")]
        z = s.rendezvous
        assert z is not None and (z.world_size, z.waiting, z.not_arrived, z.elsewhere) == (world, [0], [1], world - 2)
        assert 41 <= z.still_s <= 45, z
        out = io.StringIO()
        render_status(s, out, width=400)
        assert (f"rendezvous: rank 0 waits in init_process_group (still for {z.still_s:.0f} s) for {world - 1} of "
                f"{world} ranks: rank 1 (pid {os.getpid()}) has not called it — step 0, phase startup; {unseen} no "
                "heartbeat here (another node's, or not started)") in out.getvalue(), out.getvalue()  # fmt: skip
        out = io.StringIO()
        render_status_json(s, out)
        assert json.loads(out.getvalue())["rendezvous"]["not_arrived"] == [1]
        # AND once the ranks here have joined (the rendezvous is over: the world has arrived), nothing is said
        for hb in pages.values():
            hb.join(P.JOIN_JOINED)
        after = read_status(str(run), table, gpus=[])
        assert after.rendezvous is None and [r.stage for r in after.ranks] == ["startup", "startup"], after
    finally:
        table.close()


def test_the_ranks_of_other_nodes_are_named_with_their_host_and_the_nodes_not_joined_counted(tmp_path: Path) -> None:
    # GIVEN a 3-node job of 4 ranks, seen from node 0 (ranks 0 and 1, both inside init_process_group for 42 s): node 1
    # (host-b) has joined blackbox's coordination and holds rank 2; node 2 has not joined (rank 3 nowhere)
    run = make_run(tmp_path, os.getpid())
    pages = []
    for rank in (0, 1):
        hb = HeartbeatWriter(str(run / "ranks" / str(rank) / "heartbeat"), pid=os.getpid(), start_ticks=0, rank=rank,
                             local_rank=rank, world_size=4, mode="rank")  # fmt: skip
        now = time.monotonic()
        hb.progress(0, now - 42, 0.0, 0.0)
        hb.liveness(1, now)
        hb.join(P.JOIN_JOINING)
        pages.append(hb)
    (run / P.NODES_FILE).write_text(json.dumps({
        "status": "connected", "address": "host-a:29400", "node": "0", "nnodes": 3, "joined": 2,
        "hosts": {"0": {"host": "host-a", "ranks": [0, 1]}, "1": {"host": "host-b", "ranks": [2]}}}))  # fmt: skip
    table = open_table(str(run))
    try:
        s = read_status(str(run), table, gpus=[])
        z = s.rendezvous
        assert z is not None and (z.elsewhere, z.elsewhere_on, z.nodes_not_joined) == (2, {"host-b": [2]}, 1), z
        out = io.StringIO()
        render_status(s, out, width=400)
        assert ("for 2 of 4 ranks: rank 2 on host-b (`blackbox status` there says which have not called it); 1 on the "
                "1 of 3 node(s) that have not joined blackbox's coordination at host-a:29400 (their launcher or "
                "`blackbox run` has not started, or cannot reach it)") in out.getvalue(), out.getvalue()  # fmt: skip
        # AND a nodes.json that is not the job's (hostile, torn) changes nothing but the naming
        (run / P.NODES_FILE).write_text('{"hosts": {"1": {"host": "x", "ranks": "2"}}, "nnodes": "3"')
        torn = read_status(str(run), table, gpus=[]).rendezvous
        assert torn is not None and (torn.elsewhere, torn.elsewhere_on, torn.nodes_not_joined) == (2, {}, 0), torn
    finally:
        table.close()
