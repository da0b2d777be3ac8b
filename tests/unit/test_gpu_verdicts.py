"""Verdicts that hold on GPUs, on small hand-made bundles: NCCL's collectives return at once and a waiting rank parks
later at a host sync, where its stack only looks like compute; the stuck collective of each process group; what a
collective timeout is and is not; who is a victim; the wait sites of the frameworks; subgroups; data that does not
come from a DataLoader; a job that cannot set up its network. Pure: bundles are built in memory."""

from __future__ import annotations

import json
import pickle
from typing import Any, Optional

from blackbox.adapters import comm_log
from blackbox.adapters import flight_recorder as fr
from blackbox.adapters.stacks import Frame, ThreadStack
from blackbox.analyze.model import Report
from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import Bundle
from blackbox.frames import where

SITE = "/opt/conda/lib/python3.10/site-packages"
TORCH = f"{SITE}/torch"


def frame(name: str, filename: str, line: int = 1, module: Optional[str] = None) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line, "module": module, "locals": None}


def pyspy(*frames: dict[str, Any]) -> list[dict[str, Any]]:
    """py-spy's JSON for one main thread; frames given outermost first (stored innermost first)."""
    return [{"pid": 1, "thread_id": 7, "thread_name": "MainThread", "owns_gil": False, "active": False,
             "frames": list(reversed(frames))}]  # fmt: skip


# on NCCL the all_reduce returned at once; the host thread parks at the next sync, in the user's own line
AT_ITEM = pyspy(frame("<module>", "/job/train.py", 200), frame("train_step", "/job/train.py", 88))
COMPUTING = pyspy(frame("<module>", "/job/train.py", 200), frame("forward", "/job/model.py", 41))
GET_BATCH = pyspy(frame("<module>", "/job/train.py", 200), frame("get_batch", "/job/train.py", 118))


def fr_dump(rank: int, groups: dict[str, tuple[int, int]], ranks: Optional[dict[str, list[int]]] = None,
            ops: Optional[dict[str, str]] = None) -> bytes:  # fmt: skip
    """A flight-recorder dump: per group id, (last enqueued, last completed), an entry for each enqueued collective
    that has not completed, and the group's members in pg_config."""
    entries = []
    for gid, (enq, done) in groups.items():
        for seq in range(max(done, 0), enq + 1):
            entries.append({"pg_id": int(gid), "process_group": (gid, f"group{gid}"), "collective_seq_id": seq,
                            "profiling_name": f"nccl:{(ops or {}).get(gid, 'all_reduce')}", "is_p2p": False,
                            "state": "scheduled" if seq > done else "completed", "frames": [
                                {"name": "train_step", "filename": "/job/train.py", "line": 87}]})  # fmt: skip
    config = {gid: {"name": gid, "desc": f"group{gid}", "ranks": str((ranks or {}).get(gid, []))} for gid in groups}
    status = {gid: {"last_enqueued_collective": e, "last_started_collective": -1, "last_completed_collective": d}
              for gid, (e, d) in groups.items()}  # fmt: skip
    return pickle.dumps({"version": "2.5", "pg_config": config, "pg_status": status, "entries": entries})


def bundle(trigger: str = "stall", *, stacks: Optional[dict[int, Any]] = None, frs: Optional[dict[int, bytes]] = None,
           heartbeats: Optional[dict[int, dict[str, Any]]] = None, procs: Optional[dict[int, dict[str, Any]]] = None,
           exceptions: Optional[dict[int, list[dict[str, Any]]]] = None, console: str = "",
           world: int = 4, rule: Optional[str] = None, reason: str = "") -> Bundle:  # fmt: skip
    files: dict[str, bytes] = {}
    for rank, threads in (stacks or {}).items():
        files[f"ranks/{rank}/py-spy.json"] = json.dumps(threads).encode()
    for rank, data in (frs or {}).items():
        files[f"flight_recorder/fr_trace_{rank}"] = data
    for rank, hb in (heartbeats or {}).items():
        files[f"ranks/{rank}/heartbeat.json"] = json.dumps(
            {"rank": rank, "pid": 100 + rank, "alive": True, "state": "running", "step": 10, **hb}
        ).encode()
    for rank, proc in (procs or {}).items():
        files[f"ranks/{rank}/proc.json"] = json.dumps({"pid": 100 + rank, "state": "S (sleeping)", **proc}).encode()
    for rank, records in (exceptions or {}).items():
        files[f"ranks/{rank}/exceptions.jsonl"] = "".join(json.dumps({"thread": "MainThread", **r}) + "\n"
                                                          for r in records).encode()  # fmt: skip
    if console:
        files["console-tail.log"] = console.encode()
    if rule:
        files["detection.json"] = json.dumps({"rule": rule, "ranks": [], "reason": reason}).encode()
    local = [{"rank": r, "pid": 100 + r, "alive": True} for r in range(world)]
    manifest = {"schema_version": 2, "run_id": "r", "node": "gpu-node-3", "trigger": trigger,
                "job": {"local_ranks": local, "world_size": world}}  # fmt: skip
    return Bundle("hand-made", manifest, files, [])


def verdict(report: Report) -> tuple[str, list[int], str]:
    return report.verdict.category, report.verdict.suspect_ranks, report.verdict.confidence


# --- 1. the flight recorder's "enqueued, not completed" wins over a stack that only looks like compute ------------
def test_ranks_parked_at_a_host_sync_with_a_collective_pending_are_victims() -> None:
    # GIVEN ranks 0-2 at loss.item() with all_reduce #10 enqueued and not completed; rank 3 never enqueued #10
    frs = {r: fr_dump(r, {"0": (10, 9)}, {"0": [0, 1, 2, 3]}) for r in range(3)}
    frs[3] = fr_dump(3, {"0": (9, 9)}, {"0": [0, 1, 2, 3]})
    stacks = {0: AT_ITEM, 1: AT_ITEM, 2: AT_ITEM, 3: COMPUTING}
    report = analyze(bundle(stacks=stacks, frs=frs))
    # THEN rank 3 is the suspect, computing, with the recorder and its stack agreeing
    assert verdict(report)[:2] == ("hang.compute", [3])
    assert "never entered all_reduce #10 of group 0" in " ".join(f.text for f in report.findings)
    # AND the disagreement on the victims (a stack in user code, the recorder's pending collective) is said
    assert any("the sources disagree" in f.text and "rank 0" in f.text for f in report.findings)
    # WHEN py-spy failed on rank 3: still rank 3 (the recorder alone says it never arrived), not the victims
    del stacks[3]
    category, suspects, confidence = verdict(analyze(bundle(stacks=stacks, frs=frs)))
    assert (category, suspects, confidence) == ("hang.unknown", [3], "medium")


# --- 2. the stuck collective is the lowest not completed, per group ------------------------------------------------
def test_the_stuck_collective_is_the_lowest_not_completed_not_the_furthest() -> None:
    statuses = [fr.GroupStatus(r, "0", enq, -1, 9) for r, enq in enumerate((14, 11, 14, 9))]
    (st,) = fr.stuck(statuses, {"0": [0, 1, 2, 3]})
    assert (st.seq, st.waiting, st.missing, st.untraced) == (10, [0, 1, 2], [3], [])
    frs = {r: fr_dump(r, {"0": (enq, 9)}, {"0": [0, 1, 2, 3]}) for r, enq in enumerate((14, 11, 14, 9))}
    report = analyze(bundle(stacks={r: AT_ITEM for r in range(4)}, frs=frs))
    assert verdict(report)[1] == [3]  # rank 1 ran ahead less: a victim, not a suspect
    (u,) = report.collectives
    assert (u["seq"], u["missing"], u["waiting"]) == (10, [3], [0, 1, 2])
    # AND a status older than its peers' (a dump taken before) says nothing about the stuck collective
    stale = [fr.GroupStatus(0, "0", 70, -1, 69), fr.GroupStatus(1, "0", 5, -1, 4)]
    assert fr.stuck(stale, {"0": [0, 1]})[0].untraced == [1]


def test_gloos_lagging_completed_count_is_raised_to_its_retired_entries() -> None:
    # GIVEN a gloo rank's dump that says completed 4 of 8 enqueued, while entries 5..8 are retired (gloo updates the
    # count lazily: this rank finished them and went on to user code), and no dump of its peer (it was exiting)
    entries = [{"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": n, "p2p_seq_id": 0,
                "profiling_name": "gloo:all_reduce", "state": "scheduled", "retired": True, "is_p2p": False}
               for n in range(1, 9)]  # fmt: skip
    dump = {"pg_status": {"0": {"last_enqueued_collective": 8, "last_started_collective": -1,
                                "last_completed_collective": 4}}, "entries": entries}  # fmt: skip
    # THEN it has completed all 8: nothing is pending on it, it waits in no collective
    (status,) = fr.pg_status(1, dump)
    assert (status.last_enqueued, status.last_completed) == (8, 8)
    assert fr.stuck([status], {"0": [0, 1]}) == []
    # AND an NCCL entry's retired flag changes nothing (its count is the watchdog's own), nor a gloo one not retired
    nccl = {**dump, "entries": [{**e, "profiling_name": "nccl:all_reduce"} for e in entries]}
    pending = {**dump, "entries": [{**e, "retired": e["collective_seq_id"] <= 4} for e in entries]}
    assert [fr.pg_status(1, d)[0].last_completed for d in (nccl, pending)] == [4, 4]


# --- 3. what a collective timeout is --------------------------------------------------------------------------------
def test_only_a_collectives_timeout_is_a_comm_timeout() -> None:
    kind = comm_log.error_kind
    assert kind("RuntimeError: DataLoader timed out after 120 seconds") is None
    assert kind("urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='s3', port=443): Read timed "
                "out.") is None  # fmt: skip
    assert kind("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error "
                "(run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5") == "cuda_error"  # fmt: skip
    assert kind("DistBackendError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
                "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds before timing "
                "out.") == "comm_timeout"  # fmt: skip
    assert kind("DistBackendError: NCCL error: remote process exited or there was a network error, ncclRemoteError: "
                "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=600000)") == "peer_loss"  # fmt: skip


def _exc(t: float, kind: str, message: str, *frames: tuple[str, str]) -> dict[str, Any]:
    return {"time": t, "type": kind, "message": message,
            "traceback": [{"file": file, "line": 1, "function": fn} for fn, file in frames]}  # fmt: skip


def test_a_dataloader_timeout_is_the_ranks_own_failure_in_data() -> None:
    data = (("<module>", "/job/train.py"), ("__next__", f"{TORCH}/utils/data/dataloader.py"))
    exc = {1: [_exc(10.0, "builtins.RuntimeError", "DataLoader timed out after 120 seconds", *data)]}
    report = analyze(bundle("exception", stacks={0: AT_ITEM}, exceptions=exc, world=2, rule="exception"))
    assert (report.verdict.category, report.verdict.suspect_ranks, report.verdict.phase) == (
        "crash.exception",
        [1],
        "data",
    )


def test_an_nccl_error_that_is_a_cuda_fault_names_the_rank_that_faulted() -> None:
    # GIVEN rank 2's NCCL reports an unhandled CUDA error first; the others' watchdogs time out ten minutes later
    fault = _exc(5.0, "torch.distributed.DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda "
                 "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5")  # fmt: skip
    timeout = "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, " \
              "Timeout(ms)=600000) ran for 600031 milliseconds before timing out."  # fmt: skip
    exc = {2: [fault], **{r: [_exc(605.0 + r, "torch.distributed.DistBackendError", timeout.format(r=r))]
                          for r in (0, 1, 3)}}  # fmt: skip
    report = analyze(bundle("exception", exceptions=exc, rule="exception"))
    assert verdict(report)[:2] == ("crash.cuda_error", [2])
    assert "CUDA_LAUNCH_BLOCKING=1" in " ".join(report.next_actions)


# --- 4. only timeouts and lost peers make a raiser a victim ---------------------------------------------------------
def test_an_error_raised_inside_a_collective_is_the_ranks_own() -> None:
    # GIVEN rank 1 gave NCCL a CPU tensor: all_reduce raised at once; rank 0 waits in the all_reduce
    in_reduce = (("<module>", "/job/train.py"), ("all_reduce", f"{TORCH}/distributed/distributed_c10d.py"))
    exc = {1: [_exc(3.0, "builtins.ValueError", "Tensors must be CUDA and dense", *in_reduce)]}
    waiting = pyspy(frame("<module>", "/job/train.py"), frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py"))
    report = analyze(bundle("exception", stacks={0: waiting}, exceptions=exc, world=2, rule="exception"))
    assert verdict(report)[:2] == ("crash.exception", [1])
    # AND a lost peer out of the same all_reduce is a victim's: the rank that died is the suspect
    lost = {0: [_exc(3.0, "builtins.RuntimeError", "[pair.cc:534] Connection closed by peer [10.0.0.2]:4321",
                     *in_reduce)]}  # fmt: skip
    dead = {1: {"alive": False, "state": "running", "exit_status": "signal 9"}}
    assert verdict(analyze(bundle("rank-death", exceptions=lost, heartbeats=dead, world=2, rule="rank_death")))[:2] == (
        "crash.signal",
        [1],
    )


# --- 5. the frameworks' wait sites ---------------------------------------------------------------------------------
def _where(*frames: tuple[str, str], module: str = "") -> tuple[str, bool]:
    fs = tuple(Frame(file, 1, fn, module if not file.endswith(".py") else "") for fn, file in frames)
    w = where(ThreadStack("1", "MainThread", False, fs))
    return w.kind, w.fallback


USER = ("main", "/job/train.py")


def test_wait_sites_of_ddp_process_groups_pipelining_fsdp1_megatron_and_deepspeed() -> None:
    ddp_ctor = (USER, ("__init__", f"{TORCH}/nn/parallel/distributed.py"),
                ("_verify_param_shape_across_processes", f"{TORCH}/distributed/utils.py"))  # fmt: skip
    assert _where(*ddp_ctor) == ("collective", False)
    for fn in ("_new_process_group_helper", "_store_based_barrier", "init_process_group"):
        assert _where(USER, (fn, f"{TORCH}/distributed/distributed_c10d.py"))[0] == "collective"
    assert (
        _where(
            USER,
            ("step", f"{TORCH}/distributed/pipelining/schedules.py"),
            ("_wait_batch_p2p", f"{TORCH}/distributed/pipelining/schedules.py"),
        )[0]
        == "collective"
    )
    fsdp1 = (USER, ("_pre_forward_unshard", f"{TORCH}/distributed/fsdp/_runtime_utils.py"),
             ("_unshard", f"{TORCH}/distributed/fsdp/_runtime_utils.py"),
             ("dequeue_if_needed", f"{TORCH}/distributed/fsdp/_limiter_utils.py"),
             ("synchronize", f"{TORCH}/cuda/streams.py"))  # fmt: skip
    assert _where(*fsdp1)[0] == "collective"
    megatron = (USER, ("forward_backward_pipelining", "/work/Megatron-LM/megatron/core/pipeline_parallel/schedules.py"),
                ("_communicate", "/work/Megatron-LM/megatron/core/pipeline_parallel/p2p_communication.py"),
                ("synchronize", f"{TORCH}/cuda/__init__.py"))  # fmt: skip
    assert _where(*megatron)[0] == "collective"
    deepspeed = (USER, ("all_reduce", f"{SITE}/deepspeed/comm/comm.py"))
    assert _where(*deepspeed)[0] == "collective"
    zero3 = (USER, ("fetch_sub_module", f"{SITE}/deepspeed/runtime/zero/partitioned_param_coordinator.py"),
             ("synchronize", f"{SITE}/deepspeed/accelerator/cuda_accelerator.py"),
             ("synchronize", f"{TORCH}/cuda/__init__.py"))  # fmt: skip
    assert _where(*zero3)[0] == "collective"


def test_a_cuda_sync_is_ambiguous_not_compute_and_native_frames_are_known_by_module() -> None:
    assert _where(USER, ("synchronize", f"{TORCH}/cuda/__init__.py")) == ("ambiguous", False)
    assert _where(USER, ("forward", "/job/model.py")) == ("compute", True)  # a fallback, marked as one
    # autograd on CUDA: the main thread waits for its device threads, where DDP's hooks run
    backward = (USER, ("_engine_run_backward", f"{TORCH}/autograd/graph.py"))
    engine = (
        *backward,
        ("torch::autograd::Engine::execute", "libtorch_cpu.so"),
        ("torch::autograd::ReadyQueue::pop", "libtorch_cpu.so"),
        ("pthread_cond_wait", "libc.so.6"),
    )
    assert _where(*engine, module="libtorch_cpu.so")[0] == "ambiguous"
    # py-spy with debug info gives a native frame its .cpp file: the module says it is native
    with_debug = (USER, ("c10d::ProcessGroupNCCL::WorkNCCL::wait", "/pytorch/torch/csrc/distributed/c10d/"
                         "ProcessGroupNCCL.cpp"))  # fmt: skip
    w = where(ThreadStack("1", "MainThread", False, (Frame("/job/train.py", 1, "main"), Frame(
        with_debug[1][1], 812, with_debug[1][0], "/usr/lib/libtorch_cuda.so"))))  # fmt: skip
    assert (w.kind, w.native) == ("collective", True)
    item = (USER, ("at::native::_local_scalar_dense_cuda", "libtorch_cuda.so"),
            ("cudaStreamSynchronize", "libcudart.so.12"))  # fmt: skip
    assert _where(*item, module="libcudart.so.12")[0] == "ambiguous"


# --- 6. subgroups: the blame follows the group each waiter waits in ------------------------------------------------
def test_the_blame_follows_each_waiters_group_through_subgroups() -> None:
    # GIVEN TP groups {0,1} (id 1) and {2,3} (id 2), DP groups {0,2} (id 3) and {1,3} (id 4); rank 3 is stuck reading
    # data. Rank 2 waits in TP all_reduce #7 for rank 3; rank 1 in DP #5 for rank 3; rank 0 in DP #5 for rank 2.
    members = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    frs = {
        0: fr_dump(0, {"1": (7, 7), "3": (5, 4)}, members),
        1: fr_dump(1, {"1": (7, 7), "4": (5, 4)}, members),
        2: fr_dump(2, {"2": (7, 6), "3": (4, 4)}, members),
        3: fr_dump(3, {"2": (6, 6), "4": (4, 4)}, members),
    }
    in_loader = pyspy(frame("<module>", "/job/train.py"), frame("__next__", f"{TORCH}/utils/data/dataloader.py"),
                      frame("__getitem__", "/job/data.py", 31))  # fmt: skip
    report = analyze(bundle(stacks={0: AT_ITEM, 1: AT_ITEM, 2: AT_ITEM, 3: in_loader}, frs=frs))
    assert verdict(report)[:2] == ("hang.data_loading", [3])
    # AND two groups' collectives at the same numbers are not "different collectives"
    assert not any("not the same on every rank" in f.text for f in report.findings)


def test_ranks_that_wait_for_each_other_across_groups_are_a_deadlock() -> None:
    members = {"1": [0, 1], "2": [0, 1]}
    frs = {0: fr_dump(0, {"1": (3, 2), "2": (2, 2)}, members), 1: fr_dump(1, {"1": (2, 2), "2": (3, 2)}, members)}
    category, suspects, _ = verdict(analyze(bundle(stacks={0: AT_ITEM, 1: AT_ITEM}, frs=frs, world=2)))
    assert (category, suspects) == ("hang.collective", [0, 1])


# --- 7. data that does not come from a DataLoader -------------------------------------------------------------------
READ_NFS = {"main_thread": {"tid": 103, "state": "S", "syscall": "read", "fd": 7, "fd_target": "/data/train.bin",
                            "fd_kind": "file", "fs_type": "nfs4", "mount": "/data"}}  # fmt: skip
RECV = {"main_thread": {"tid": 103, "state": "S", "syscall": "recvfrom", "fd": 9, "fd_target": "socket:[4242]",
                        "fd_kind": "socket", "peer": "10.0.0.9:443"}}  # fmt: skip


def test_a_rank_blocked_in_a_read_under_its_get_batch_is_loading_data_not_computing() -> None:
    waiting = pyspy(frame("<module>", "/job/train.py"), frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py"))
    report = analyze(bundle(stacks={0: waiting, 1: GET_BATCH}, procs={1: READ_NFS}, world=2))
    assert (report.verdict.category, report.verdict.suspect_ranks, report.verdict.phase) == (
        "hang.data_loading",
        [1],
        "data",
    )
    assert "/data/train.bin" in report.next_actions[0] and "nfs4" in report.next_actions[0]
    # a socket read under code that is not the data: waiting for I/O
    other = pyspy(frame("<module>", "/job/train.py"), frame("report_metrics", "/job/metrics.py", 12))
    report = analyze(bundle(stacks={0: waiting, 1: other}, procs={1: RECV}, world=2))
    assert verdict(report)[:2] == ("hang.io", [1])
    assert "10.0.0.9:443" in report.next_actions[0]


def test_a_declared_phase_wins_over_a_fallback_and_the_stack_over_the_heartbeat() -> None:
    waiting = pyspy(frame("<module>", "/job/train.py"), frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py"))
    for phase, category in (("checkpoint", "hang.checkpoint_io"), ("data", "hang.data_loading")):
        report = analyze(bundle(stacks={0: waiting, 1: COMPUTING}, heartbeats={1: {"phase": phase}}, world=2))
        assert verdict(report)[:2] == (category, [1])
    # a stack that says where it is (in the DataLoader) beats a heartbeat that says collective; both are reported
    in_loader = pyspy(frame("<module>", "/job/train.py"), frame("__next__", f"{TORCH}/utils/data/dataloader.py"))
    report = analyze(bundle(stacks={0: waiting, 1: in_loader}, heartbeats={1: {"phase": "collective"}}, world=2))
    assert verdict(report)[:2] == ("hang.data_loading", [1])
    assert any("disagree" in f.text and "heartbeat phase collective" in f.text for f in report.findings)


# --- 9. a job that cannot set up its network -----------------------------------------------------------------------
GLOO_FALLBACK = ("[W ProcessGroupGloo.cpp:1200] Warning: Unable to resolve hostname to a (local) address. Using the "
                 "loopback address as fallback. Manually set the network interface to bind to with "
                 "GLOO_SOCKET_IFNAME. (function operator())")  # fmt: skip


def test_a_full_mesh_that_cannot_connect_is_a_network_set_up_failure() -> None:
    setup = (("<module>", "/job/train.py"), ("init_process_group", f"{TORCH}/distributed/distributed_c10d.py"),
             ("_new_process_group_helper", f"{TORCH}/distributed/distributed_c10d.py"))  # fmt: skip
    message = ("Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error, "
               "remote=[127.0.0.1]:40213")  # fmt: skip
    exc = {0: [_exc(2.0, "torch.distributed.DistNetworkError", message, *setup)]}
    console = f"[rank0]:{GLOO_FALLBACK}\n[rank0]: torch.distributed.DistNetworkError: {message}\n"
    report = analyze(bundle("exception", exceptions=exc, console=console, world=2, rule="exception"))
    assert verdict(report)[:2] == ("crash.network_setup", [0])
    text = " ".join(report.next_actions)
    assert "GLOO_SOCKET_IFNAME" in text and "NCCL_SOCKET_IFNAME" in text and "127.0.0.1:40213" in text
    assert "getent hosts $(hostname)" in text
    # AND the other host, whose rank still waits in set-up when node 0's incident reaches it, says the same
    waiting = pyspy(*(frame(fn, file) for fn, file in setup))
    remote = bundle("remote-exception", stacks={1: waiting}, world=2, rule="exception",
                    reason=f"node 0 reported: rank 0 raised DistNetworkError: {message}")  # fmt: skip
    assert verdict(analyze(remote))[:2] == ("crash.network_setup", [1])


def test_the_nccl_watchdogs_lines_are_the_flight_recorder_in_words() -> None:
    # GIVEN no flight recorder, only the console: ranks 0, 1, 3 time out on all_reduce #15734; rank 2 says nothing
    lines = "".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum=15734, OpType=ALLREDUCE, NumelIn=220084533, NumelOut=220084533, "
        f"Timeout(ms)=600000) ran for 600037 milliseconds before timing out.\n"
        for r in (0, 1, 3)
    )
    report = analyze(bundle("console-comm-timeout", console=lines, rule="console",
                            reason="the job printed `Watchdog caught collective operation timeout`"))  # fmt: skip
    assert verdict(report)[:2] == ("crash.comm_timeout", [2])


def test_the_standard_librarys_native_frames_say_nothing_of_where_the_job_is() -> None:
    # GIVEN py-spy --native of a rank blocked in socket.recv under user code (as taken here, with debug info)
    dynload = "/usr/lib/python3.11/lib-dynload/_socket.cpython-311-x86_64-linux-gnu.so"
    frames = (Frame("/job/train.py", 9, "current"), Frame("Modules/socketmodule.c", 0, "sock_recv", dynload),
              Frame("Modules/socketmodule.c", 0, "sock_call_ex", dynload),
              Frame("/usr/lib/libc.so.6", 0, "recv", "/usr/lib/libc.so.6"))  # fmt: skip
    w = where(ThreadStack("1", "MainThread", False, frames))
    # THEN it is a fallback, for the kernel's word (blocked in recvfrom on a socket) to settle
    assert (w.kind, w.fallback) == ("compute", True)
