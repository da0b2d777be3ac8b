"""Flight-recorder cases in PyTorch's own dump format: every field torch's FlightRecorder writes (FlightRecorder.hpp,
FlightRecorderDetail.hpp, version "2.10": version, comm_lib_version, pg_config, pg_status with the collective and
p2p counters, nccl_comm_state, entries with record_id, pg_id, process_group, collective_seq_id, p2p_seq_id, op_id,
profiling_name, time_created_ns, time_discovered_started_ns, time_discovered_completed_ns, input/output sizes and
dtypes, state, retired, is_p2p, timeout_ms, duration_ms, frames, thread_id, thread_name), pickled as torch pickles
them. Each case asserts its exact category and suspect set: a collective hang, a subgroup hang, a p2p hang, a
collective mismatch, a watchdog timeout with the dumps, and a collective queued behind a long kernel (`scheduled`,
not `started`) on a 1-rank group."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from blackbox.adapters import flight_recorder as fr
from blackbox.analyze.verdict import analyze
from tests.unit.test_gpu_verdicts import AT_ITEM, COMPUTING, _exc, bundle, frame, pyspy

T0 = 1_764_800_000_000_000_000  # ns
FRAMES = [
    {"name": "all_reduce", "filename": "/opt/torch/distributed/distributed_c10d.py", "line": 2810},
    {"name": "train_step", "filename": "/job/train.py", "line": 87},
]


@dataclass
class Op:
    """One entry: its group, its op, its sequence numbers and state."""

    pg: str  # the group's id (pg_status key, entries' pg_id)
    name: str  # "allreduce", "send", ...
    seq: int  # collective_seq_id (p2p entries keep the group's last one)
    state: str  # "scheduled", "started", "completed"
    p2p: int = 0  # p2p_seq_id
    is_p2p: bool = False
    sizes: list[list[int]] = field(default_factory=lambda: [[1024, 1024]])


def dump(rank: int, groups: dict[str, list[int]], ops: list[Op], version: str = "2.10") -> bytes:
    """Rank `rank`'s dump: `groups` id -> member ranks; pg_status counted from the entries, as torch counts."""
    entries: list[dict[str, Any]] = []
    for i, op in enumerate(ops):
        started = op.state in ("started", "completed")
        entries.append(
            {
                "record_id": i,
                "pg_id": int(op.pg),
                "process_group": (op.pg, "default_pg" if op.pg == "0" else f"tp{op.pg}"),
                "collective_seq_id": op.seq,
                "p2p_seq_id": op.p2p,
                "op_id": i + 1,
                "profiling_name": f"nccl:{op.name}",
                "time_created_ns": T0 + i * 5_000_000,
                "time_discovered_started_ns": T0 + i * 5_000_000 + 1_000 if started else None,
                "time_discovered_completed_ns": T0 + i * 5_000_000 + 900_000 if op.state == "completed" else None,
                "input_sizes": op.sizes,
                "input_dtypes": ["Float"],
                "output_sizes": op.sizes,
                "output_dtypes": ["Float"],
                "state": op.state,
                "retired": op.state == "completed",
                "is_p2p": op.is_p2p,
                "timeout_ms": 600_000,
                "duration_ms": 0.9 if op.state == "completed" else None,
                "frames": FRAMES,
                "thread_id": "140245",
                "thread_name": "pt_main_thread",
            }
        )
    status: dict[str, dict[str, int]] = {}
    for gid in groups:
        mine = [op for op in ops if op.pg == gid]
        coll, p2p = [op for op in mine if not op.is_p2p], [op for op in mine if op.is_p2p]

        def last(xs: list[Op], states: tuple[str, ...], key: str) -> int:
            return max((getattr(o, key) for o in xs if o.state in states), default=-1)

        status[gid] = {
            "last_enqueued_collective": last(coll, ("scheduled", "started", "completed"), "seq"),
            "last_started_collective": last(coll, ("started", "completed"), "seq"),
            "last_completed_collective": last(coll, ("completed",), "seq"),
            "last_enqueued_p2p": last(p2p, ("scheduled", "started", "completed"), "p2p"),
            "last_started_p2p": last(p2p, ("started", "completed"), "p2p"),
            "last_completed_p2p": last(p2p, ("completed",), "p2p"),
        }
    config = {
        gid: {"name": gid, "desc": "default_pg" if gid == "0" else f"tp{gid}", "ranks": str(ranks)}
        for gid, ranks in groups.items()
    }
    return pickle.dumps(
        {
            "version": version,
            "comm_lib_version": "2.27.5",
            "pg_config": config,
            "pg_status": status,
            "nccl_comm_state": {},
            "entries": entries,
        }
    )


def done(pg: str, upto: int) -> list[Op]:
    return [Op(pg, "allreduce", s, "completed") for s in range(1, upto + 1)]


@dataclass
class Case:
    name: str
    frs: dict[int, bytes]
    stacks: dict[int, Any]
    world: int
    want: tuple[str, list[int]]
    finding: Optional[str] = None  # a finding must contain this
    console: str = ""
    rule: Optional[str] = None
    raised: list[int] = field(default_factory=list)  # ranks that raised the watchdog's DistBackendError


WORLD = {"0": [0, 1, 2, 3]}
IN_LOADER = pyspy(
    frame("<module>", "/job/train.py"),
    frame("__next__", "/opt/torch/utils/data/dataloader.py"),
    frame("__getitem__", "/job/data.py", 31),
)
WATCHDOG = "\n".join(
    f"[rank{r}]:[E1204 00:20:03.1188 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=11, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
    "600020 milliseconds before timing out."
    for r in (0, 1, 3)
)

CASES = [
    # ranks 0, 1, 3 started all_reduce #11; rank 2 is still in its DataLoader
    Case(
        "collective-hang",
        {
            r: dump(r, WORLD, done("0", 10) + ([Op("0", "allreduce", 11, "started")] if r != 2 else []))
            for r in range(4)
        },
        {0: AT_ITEM, 1: AT_ITEM, 2: IN_LOADER, 3: AT_ITEM},
        4,
        ("hang.data_loading", [2]),
    ),
    # TP groups {0,1} (1) and {2,3} (2): rank 2 waits in tp2's all_gather #5 for rank 3, which computes; ranks 0 and 1
    # wait in the default group's #20 for ranks 2 and 3
    Case(
        "subgroup-hang",
        {
            0: dump(
                0,
                {"0": [0, 1, 2, 3], "1": [0, 1]},
                done("1", 5) + done("0", 19) + [Op("0", "allreduce", 20, "started")],
            ),
            1: dump(
                1,
                {"0": [0, 1, 2, 3], "1": [0, 1]},
                done("1", 5) + done("0", 19) + [Op("0", "allreduce", 20, "started")],
            ),
            2: dump(
                2,
                {"0": [0, 1, 2, 3], "2": [2, 3]},
                done("2", 4) + done("0", 19) + [Op("2", "_allgather_base", 5, "started")],
            ),
            3: dump(3, {"0": [0, 1, 2, 3], "2": [2, 3]}, done("2", 4) + done("0", 19)),
        },
        {0: AT_ITEM, 1: AT_ITEM, 2: AT_ITEM, 3: COMPUTING},
        4,
        ("hang.compute", [3]),
    ),
    # a 2-stage pipeline: rank 0 posted send #7 to rank 1, which never posted its recv #7 (it loads data)
    Case(
        "p2p-hang",
        {
            0: dump(
                0,
                {"0": [0, 1]},
                done("0", 3)
                + [Op("0", "send", 3, "completed", p2p=p, is_p2p=True) for p in range(1, 7)]
                + [Op("0", "send", 3, "started", p2p=7, is_p2p=True)],
            ),
            1: dump(
                1,
                {"0": [0, 1]},
                done("0", 3) + [Op("0", "recv", 3, "completed", p2p=p, is_p2p=True) for p in range(1, 7)],
            ),
        },
        {0: AT_ITEM, 1: IN_LOADER},
        2,
        ("hang.data_loading", [1]),
        "send/recv #7 of group 0/p2p",
    ),
    # #11: ranks 0-2 all_reduce, rank 3 all_gather: the odd one out
    Case(
        "collective-mismatch",
        {
            r: dump(r, WORLD, [*done("0", 10), Op("0", "allreduce" if r != 3 else "_allgather_base", 11, "started")])
            for r in range(4)
        },
        {r: AT_ITEM for r in range(4)},
        4,
        ("hang.collective", [3]),
        "a collective mismatch",
    ),
    # the watchdog fired on 0, 1, 3 (TORCH_NCCL_DUMP_ON_TIMEOUT=1 wrote the dumps); rank 2 never entered #11
    Case(
        "watchdog-timeout",
        {
            r: dump(r, WORLD, done("0", 10) + ([Op("0", "allreduce", 11, "started")] if r != 2 else []))
            for r in range(4)
        },
        {2: COMPUTING},
        4,
        ("crash.comm_timeout", [2]),
        console=WATCHDOG,
        rule="console",
        raised=[0, 1, 3],
    ),
    # a 1-rank NCCL group: all_reduce #5 is `scheduled` behind a long kernel, not `started`; the main thread parks at
    # loss.item(): the GPU is still computing, not waiting for a peer
    Case(
        "scheduled-behind-a-kernel",
        {0: dump(0, {"0": [0]}, [*done("0", 4), Op("0", "allreduce", 5, "scheduled")])},
        {0: AT_ITEM},
        1,
        ("hang.compute", [0]),
        "scheduled",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_real_format_dump_gets_its_exact_verdict(case: Case) -> None:
    raised = {
        r: [
            _exc(
                100.0 + r,
                "DistBackendError",
                f"[Rank {r}] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=11, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600020 milliseconds before "
                "timing out.",
                ("train_step", "/job/train.py"),
            )
        ]
        for r in case.raised
    }
    report = analyze(
        bundle(
            "console" if case.rule else "stall",
            stacks=case.stacks,
            frs=case.frs,
            world=case.world,
            console=case.console,
            rule=case.rule,
            exceptions=raised,
            reason="watchdog timeout" if case.rule else "",
        )
    )
    v = report.verdict
    assert (v.category, v.suspect_ranks) == case.want, v.summary
    if case.finding:
        assert case.finding in v.summary + " ".join(f.text for f in report.findings), v.summary


def test_every_dump_carries_every_field_torch_writes() -> None:
    entry_keys = {
        "record_id",
        "pg_id",
        "process_group",
        "collective_seq_id",
        "p2p_seq_id",
        "op_id",
        "profiling_name",
        "time_created_ns",
        "time_discovered_started_ns",
        "time_discovered_completed_ns",
        "input_sizes",
        "input_dtypes",
        "output_sizes",
        "output_dtypes",
        "state",
        "retired",
        "is_p2p",
        "timeout_ms",
        "duration_ms",
        "frames",
        "thread_id",
        "thread_name",
    }
    for case in CASES:
        for data in case.frs.values():
            d = pickle.loads(data)
            assert {"version", "comm_lib_version", "pg_config", "pg_status", "nccl_comm_state", "entries"} <= set(d)
            assert all(set(e) == entry_keys for e in d["entries"]), case.name
    assert len(CASES) >= 6


def _hang_without(ranks: set[int], world: int = 4, multinode: bool = False) -> tuple[str, list[int], str]:
    """The collective-hang case with `ranks`' dumps and stacks taken away (and, where asked, a two-node bundle)."""
    case = CASES[0]
    b = bundle(
        stacks={r: s for r, s in case.stacks.items() if r not in ranks},
        frs={r: d for r, d in case.frs.items() if r not in ranks},
        world=world,
    )
    b.manifest["job"]["local_ranks"] = [e for e in b.manifest["job"]["local_ranks"] if e["rank"] not in ranks]
    if multinode:
        b.manifest["multinode"] = {"job_id": "j", "node": "gpu-node-3", "node_rank": 0, "nnodes": 2}
    v = analyze(b).verdict
    return v.category, v.suspect_ranks, v.confidence


def test_a_rank_without_a_dump_is_named_only_by_elimination_or_when_its_node_was_expected() -> None:
    # rank 2 (the one in its DataLoader) loses its dump and stack: the only member without a trace, by elimination
    assert _hang_without({2})[:2] == ("hang.collective", [2])
    # ranks 2 and 3 both without evidence: rank 3 waited, rank 2 did not, and nothing says which: none is named
    assert _hang_without({2, 3}) == ("hang.collective", [], "low")
    # one node's bundle of a two-node job: the other node's ranks were expected elsewhere, and are named
    assert _hang_without({2, 3}, multinode=True)[1] == [2, 3]


# --- a job that moved on once collected: each dump read as it stood when the collection began ---------------------
IN_ALL_REDUCE = pyspy(frame("<module>", "/job/train.py", 200), frame("train_step", "/job/train.py", 87),
                      frame("all_reduce", "/opt/torch/distributed/distributed_c10d.py", 2810))  # fmt: skip


def moved_on(detected: bool) -> Any:
    """Rank 3 held the GIL in a native sleep after collective #8 while ranks 0-2 waited in #9; blackbox's dump signal
    ended the sleep, and ranks 0-2 wrote their dumps 31 collectives later (entries 5 ms apart: #10 and after were
    created after the collection began). Rank 3 wrote its own before it moved."""
    frs = {r: dump(r, WORLD, done("0", 40)) for r in range(3)}
    frs[3] = dump(3, WORLD, done("0", 8))
    b = bundle(stacks={0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_ALL_REDUCE, 3: COMPUTING}, frs=frs)
    b.manifest["collection"] = {"started": (T0 + 42_000_000) / 1e9}
    if detected:
        phases = {0: "collective", 1: "collective", 2: "collective", 3: "compute"}
        b.files["detection.json"] = json.dumps({"rule": "stall", "ranks": [0, 1, 2, 3], "findings": [
            {"rank": r, "phase": p} for r, p in phases.items()]}).encode()  # fmt: skip
    return b


def test_a_job_that_moved_on_once_collected_is_judged_as_it_stood_when_the_collection_began() -> None:
    # GIVEN the detection says ranks 0-2 were inside a collective then: #9 is pending for them, rank 3 never entered
    report = analyze(moved_on(detected=True))
    assert (report.verdict.category, report.verdict.suspect_ranks) == ("hang.compute", [3]), report.verdict.summary
    texts = " ".join(f.text for f in report.findings)
    assert "rank 3 never entered allreduce #9" in texts, texts
    assert "ranks 0-2 entered 93 more collective(s) after the collection began" in texts, texts
    assert [c["seq"] for c in report.collectives] == [9]
    # WITHOUT a detection (a collection on request: the job may be running, its order of arrival is read) every dump
    # is read as written, and nothing is said of it; the stacks taken before the signal still name rank 3
    report = analyze(moved_on(detected=False))
    assert report.verdict.suspect_ranks == [3], report.verdict.summary
    texts = " ".join(f.text for f in report.findings)
    assert "after the collection began" not in texts and "rank 3 never entered" not in texts, texts


def test_a_rank_whose_dump_counts_a_collective_it_has_no_entry_for_yet_is_read_as_it_stood() -> None:
    # GIVEN rank 3's dump written as it entered #9 once woken: its group counts #9 enqueued, its entries end at #8 (a
    # quiet-gallery run of gil-hang: the rank counted as waiting, the verdict every rank in a collective)
    b = moved_on(detected=True)
    d3 = pickle.loads(b.files["flight_recorder/fr_trace_3"])
    d3["pg_status"]["0"]["last_enqueued_collective"] = 9
    b.files["flight_recorder/fr_trace_3"] = pickle.dumps(d3)
    assert fr.newer_than(d3, T0 + 10**12) == 1 and [g.last_enqueued for g in fr.pg_status(3, d3)] == [9]
    # THEN it is read as it stood: #8 its last, so it never entered #9, and it is the one the others wait for
    report = analyze(b)
    assert (report.verdict.category, report.verdict.suspect_ranks) == ("hang.compute", [3]), report.verdict.summary
    assert "rank 3 never entered allreduce #9" in " ".join(f.text for f in report.findings)
    # AND a dump whose count and entries agree is itself; one with no entries keeps its count (nothing to recount)
    assert fr.as_of(pickle.loads(b.files["flight_recorder/fr_trace_0"]), T0 + 10**12, True)["pg_status"] == (
        pickle.loads(b.files["flight_recorder/fr_trace_0"])["pg_status"])  # fmt: skip
    bare = {**d3, "entries": []}
    assert fr.newer_than(bare, 0) == 0 and fr.as_of(bare, 0, False) is bare


def test_a_dump_cut_at_a_moment_keeps_what_came_before_and_counts_its_group_again() -> None:
    full = pickle.loads(dump(0, WORLD, done("0", 12)))
    t = T0 + 27_000_000  # entries 0-5 (#1-#6) created before it
    assert fr.newer_than(full, t) == 6 and fr.as_of(full, T0 + 10**12, True) is full  # nothing newer: itself
    waiting = fr.as_of(full, t, True)
    assert [e["collective_seq_id"] for e in waiting["entries"]] == [1, 2, 3, 4, 5, 6]
    assert fr.pg_status(0, waiting) == [fr.GroupStatus(0, "0", 6, 6, 5)]  # #6 still pending: retired no longer
    assert waiting["entries"][-1]["retired"] is False and waiting["entries"][0]["retired"] is True
    assert fr.p2p_status(0, waiting, {"0"}) == []  # the pair counters cannot be counted again from entries
    assert fr.pg_status(0, fr.as_of(full, t, False)) == [fr.GroupStatus(0, "0", 6, 6, 6)]
    # untrusted: odd times and groups are kept as they are, never raise
    odd = {**full, "entries": [*full["entries"], {"time_created_ns": True}, {"time_created_ns": "x"}, 7],
           "pg_status": "?"}  # fmt: skip
    assert fr.newer_than(odd, t) == 6 and len(fr.as_of(odd, t, True)["entries"]) == 8
