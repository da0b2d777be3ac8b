"""Bundles taken on a real GPU: `scripts/gpu_check.sh` on a lent NVIDIA H200 (torch 2.11.0+cu130, NCCL 2.28,
gVisor), 2026-12-04, each row of scripts/gpu_scenarios.py under `blackbox run` with the machine's own python. Each
keeps its exact verdict, for the reason the evidence gives: NCCL's flight recorder there keeps no start times
(`last_started_collective` -1, every pending entry `scheduled`), and its dumps come from NCCL's own recorder."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import NamedTuple

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle

H200 = Path(__file__).resolve().parent.parent / "data" / "h200"


class Want(NamedTuple):
    category: str
    suspects: list[int]
    reason: str  # in the summary: why


CASES = {
    # a 1-rank NCCL group: all_reduce #9 waits behind torch.cuda._sleep on the stream; the host parks at loss.item()
    "nccl-queued": Want("hang.compute", [0], "the group is the rank alone): the GPU still runs the work queued"),
    # the same with a 10 s process-group timeout: NCCL's watchdog raised and torch dumped its recorder at that moment
    "nccl-watchdog": Want("crash.comm_timeout", [0], "the GPU still ran the work queued before it"),
    # 2 ranks, gloo on CUDA tensors: rank 1 in a host sync behind a long kernel, rank 0 in the all_reduce
    "gpu-spin": Want("hang.compute", [1], "rank 1 is computing (never enqueued all_reduce #9"),
    "loader-hang": Want("hang.data_loading", [1], "rank 1 is loading data (__getitem__ (gpu_scenarios.py:57))"),
    "stopped": Want("hang.stopped", [1], "/proc state T (stopped), wchan do_signal_stop"),
    "cuda-oom": Want("crash.oom", [0], "Rank 0 ran out of memory"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bundle_from_the_h200_keeps_its_verdict(name: str) -> None:
    want = CASES[name]
    v = analyze(read_bundle(str(H200 / f"{name}.tar.gz"))).verdict
    assert (v.category, v.suspect_ranks) == (want.category, want.suspects), v.summary
    assert want.reason in v.summary, v.summary


def test_nccls_dump_is_nccls_own_recorder_and_keeps_no_start_times() -> None:
    # the evidence the two NCCL rows rest on: the dump holds the job's NCCL collectives (the other recorder of a CUDA
    # build held none: the bundle had no collective before the dump chose between them)
    import tarfile

    with tarfile.open(H200 / "nccl-queued.tar.gz") as tar:
        f = tar.extractfile("flight_recorder/fr_trace_0")
        assert f is not None
        dump = pickle.loads(f.read())  # a test's own data, written by torch
    assert dump["pg_status"]["0"] == {"last_enqueued_collective": 12, "last_started_collective": -1,
                                      "last_completed_collective": 8}  # fmt: skip
    assert {e["profiling_name"] for e in dump["entries"]} == {"nccl:all_reduce"}
    assert {e["state"] for e in dump["entries"] if e["collective_seq_id"] > 8} == {"scheduled"}
