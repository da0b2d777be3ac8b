"""scripts/gpu_check.py's judgement of a row (expected against got) and its table, without running a job."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import ROOT


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_row_matches_only_with_its_verdict_and_its_bundle_member() -> None:
    g = gpu_check()
    members = ["run/flight_recorder/fr_trace_0", "run/ranks/0/rank.json"]
    ok = g.judge("nccl-watchdog", {"category": "crash.comm_timeout", "suspect_ranks": [0], "members": members,
                                   "fr": "nccl:all_reduce scheduled"})  # fmt: skip
    assert ok.result == "ok" and ok.got.endswith("FR: nccl:all_reduce scheduled")
    wrong = g.judge("nccl-watchdog", {"category": "hang.collective", "suspect_ranks": [0], "members": members})
    assert wrong.result == "DIFFERS"
    missing = g.judge("nccl-watchdog", {"category": "crash.comm_timeout", "suspect_ranks": [0], "members": []})
    assert missing.result == "DIFFERS" and "no `flight_recorder/` in the bundle" in missing.got
    assert g.judge("stopped", {"error": "no bundle"}).got == "no bundle"


def test_without_cuda_every_gpu_row_says_so_and_the_table_has_one_line_each(tmp_path: object) -> None:
    g = gpu_check()
    rows = [g.one(name, tmp_path, 60.0, False) for name in g.NEEDS_CUDA]
    assert all(r.result == "NOT RUN" and "no CUDA" in r.got for r in rows)
    lines = g.table(rows).splitlines()
    assert lines[0].split() == ["row", "expected", "got", "result"] and len(lines) == len(rows) + 1
    assert g.one("loader-hang", tmp_path, 5.0, True).got == "NOT RUN: the check's time is spent"
