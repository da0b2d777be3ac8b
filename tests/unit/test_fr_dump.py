"""Which flight-recorder dump a rank keeps. torch's CUDA builds hold two recorders: NCCL's own
(`_dump_nccl_trace`) and the one gloo uses (`_dump_fr_trace`); on a lent H200 (torch 2.11, NCCL) the rank dumped the
second and the bundle held no collective. NCCL is what this machine lacks, so torch's c10d module is stood in by one
with the same two functions; the dumps are torch's format, pickled plain data."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from blackbox._recorder import dumps
from blackbox._recorder import protocol as P

EMPTY = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}


def dump_of(backend: str) -> dict[str, Any]:
    entry = {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 4,
             "profiling_name": f"{backend}:all_reduce", "state": "scheduled"}  # fmt: skip
    return {**EMPTY, "pg_config": {"0": {"name": "0", "ranks": "[0, 1]"}}, "entries": [entry]}


def fake_torch(nccl: Optional[dict[str, Any]], generic: Optional[dict[str, Any]]) -> Any:
    c10d = SimpleNamespace()
    for name, dump in (("_dump_nccl_trace", nccl), ("_dump_fr_trace", generic)):
        if dump is not None:
            setattr(c10d, name, lambda d=dump: pickle.dumps(d))
            setattr(c10d, name + "_json", lambda d=dump: repr(d["entries"]).encode())
    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    return SimpleNamespace(distributed=dist, _C=SimpleNamespace(_distributed_c10d=c10d))


def dump_with(torch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], Path]:
    rank_dir = tmp_path / "ranks" / "1"
    rank_dir.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(P.ENV_FR_DIR, str(tmp_path / P.FR_DIR))
    rec: Any = SimpleNamespace(rank=1, rank_dir=str(rank_dir))
    out = dumps._dump_flight_recorder(rec, torch, 1)
    assert out is not None
    return out, tmp_path / P.FR_DIR / f"{P.FR_PREFIX}1"


def test_an_nccl_job_keeps_nccls_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a CUDA build whose NCCL recorder holds the job's collectives and whose other recorder is empty
    out, path = dump_with(fake_torch(dump_of("nccl"), EMPTY), tmp_path, monkeypatch)
    # THEN the rank's dump is NCCL's, pickle and JSON alike
    assert out["recorder"] == "dump_nccl_trace"
    assert pickle.loads(path.read_bytes())["entries"][0]["profiling_name"] == "nccl:all_reduce"
    assert b"nccl:all_reduce" in (tmp_path / "ranks" / "1" / P.RANK_FR_JSON).read_bytes()


def test_a_gloo_job_on_a_cuda_build_keeps_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, path = dump_with(fake_torch(EMPTY, dump_of("gloo")), tmp_path, monkeypatch)
    assert out["recorder"] == "dump_fr_trace"
    assert pickle.loads(path.read_bytes())["entries"][0]["profiling_name"] == "gloo:all_reduce"
    # a CPU build has the one recorder; a job with no collective yet keeps the (empty) first
    out, path = dump_with(fake_torch(None, dump_of("gloo")), tmp_path, monkeypatch)
    assert out["recorder"] == "dump_fr_trace"
    out, path = dump_with(fake_torch(EMPTY, EMPTY), tmp_path, monkeypatch)
    assert out["recorder"] == "dump_nccl_trace" and pickle.loads(path.read_bytes()) == EMPTY


def test_torchs_own_dump_at_a_timeout_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the dump torch's watchdog wrote at the timeout (TORCH_FR_DUMP_TEMP_FILE), after this process started
    path = tmp_path / P.FR_DIR / f"{P.FR_PREFIX}1"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps(dump_of("nccl")))
    # WHEN blackbox's collection asks the rank for its dump, NCCL's recorder now emptied by the abort
    out, _ = dump_with(fake_torch(EMPTY, EMPTY), tmp_path, monkeypatch)
    # THEN torch's record of that moment stays as it was
    assert out["by"] == "torch" and pickle.loads(path.read_bytes()) == dump_of("nccl")
    # while a file older than this process (an earlier rank's, restarted) is replaced, and the rank's own later
    # dumps replace its own
    past = time.time() - 86400  # older than this (pytest) process, however long the suite has run
    os.utime(path, (past, past))
    out, _ = dump_with(fake_torch(dump_of("nccl"), EMPTY), tmp_path, monkeypatch)
    assert "by" not in out and str(path) in dumps._WRITTEN
    out, _ = dump_with(fake_torch(EMPTY, dump_of("gloo")), tmp_path, monkeypatch)
    assert "by" not in out and pickle.loads(path.read_bytes())["entries"][0]["profiling_name"] == "gloo:all_reduce"
