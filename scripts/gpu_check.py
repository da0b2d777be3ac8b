"""The GPU check's rows (started by scripts/gpu_check.sh, which checks the machine first): each runs scripts/gpu_job.py
under `blackbox run` on the GPUs, reads the report's verdict and what the bundle must hold, and the check prints one
table of expected against got. A row that cannot run here (fewer GPUs than it needs) says why and fails the check.

    python scripts/gpu_check.py GPU_PYTHON NGPUS [ROW...]

Imports the stdlib only; run with blackbox's interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu_job.py"
BB = [sys.executable, "-m", "blackbox"]
ROW_TIMEOUT_S = 100.0

# row: (scenario, model, ranks, blackbox run options, expected verdict, bundle member it must hold)
ROWS: dict[str, tuple[str, str, int, list[str], dict[str, Any], Optional[str]]] = {
    "ddp-loader-hang": ("loader-hang", "ddp", 2, ["--stall-timeout", "15"],
                        {"category": "hang.data_loading", "suspect_ranks": [1], "phase": "data"}, None),
    "ddp-stopped": ("stopped", "ddp", 2, ["--stall-timeout", "15"],
                    {"category": "hang.stopped", "suspect_ranks": [1]}, None),
    "fsdp2-loader-hang": ("loader-hang", "fsdp", 2, ["--stall-timeout", "15"],
                          {"category": "hang.data_loading", "suspect_ranks": [1], "phase": "data"}, None),
    "fsdp2-stopped": ("stopped", "fsdp", 2, ["--stall-timeout", "15"],
                      {"category": "hang.stopped", "suspect_ranks": [1]}, None),
    # the process group gives up after 15 s: NCCL's watchdog fires (before blackbox's stall rule) and dumps
    "nccl-watchdog-timeout": ("watchdog", "ddp", 2, ["--stall-timeout", "90"],
                              {"category": "crash.comm_timeout", "suspect_ranks": [1]}, "flight_recorder/"),
    "cuda-oom": ("oom", "ddp", 1, ["--stall-timeout", "60", "--cuda-memory-history", "100000"],
                 {"category": "crash.oom", "suspect_ranks": [0]}, "memory-snapshot-oom"),
}  # fmt: skip


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_")}
    out.pop("PYTHONPATH", None)
    out["OMP_NUM_THREADS"] = "1"
    return out


def run_row(name: str, gpu_py: str, tmp: Path) -> tuple[dict[str, Any], str]:
    """(the report's verdict and the bundle's members, or an error), and blackbox's stderr tail."""
    scenario, model, ranks, options, _, _ = ROWS[name]
    run_dir = tmp / name
    cmd = [*BB, "run", "--run-dir", str(run_dir), "--poll-interval", "0.5", "--kill-grace", "5", *options, "--",
           gpu_py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), str(JOB), scenario,
           model]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        err += f"\n(gpu_check: the row did not end within {ROW_TIMEOUT_S:g} s and was killed)"
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    if not bundles:
        return {"error": "no bundle"}, err
    res = subprocess.run([*BB, "report", str(bundles[0]), "--format", "json", "--no-fr-analyzer", "--no-index"],
                         capture_output=True, text=True, env=env(), timeout=120)  # fmt: skip
    if res.returncode != 0:
        return {"error": f"report failed: {res.stderr.strip()[-200:]}"}, err
    verdict = json.loads(res.stdout)["verdict"]
    import tarfile

    with tarfile.open(bundles[0]) as tar:
        verdict["members"] = tar.getnames()
    return verdict, err


def nvml_row(gpu_py: str, tmp: Path) -> tuple[bool, str]:
    """`blackbox status` of a job keeping the GPU busy shows its utilisation, read through NVML."""
    how = subprocess.run([sys.executable, "-c", "from blackbox.adapters import gpu; print(gpu.query_gpus(5.0)[1])"],
                         capture_output=True, text=True, env=env(), timeout=60).stdout.strip()  # fmt: skip
    if how != "NVML":
        return False, f"GPU readings come from `{how}`, not NVML: pip install 'torch-blackbox[gpu]' (nvidia-ml-py)"
    run_dir = tmp / "nvml-status"
    cmd = [*BB, "run", "--run-dir", str(run_dir), "--poll-interval", "0.5", "--", gpu_py, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(JOB), "busy"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp, env={**env(), "BB_BUSY_S": "45"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    seen = "no status read"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            res = subprocess.run([*BB, "status", str(run_dir), "--format", "json"], capture_output=True, text=True,
                                 env=env(), timeout=30)  # fmt: skip
            if res.returncode == 0:
                gpus = json.loads(res.stdout).get("gpus") or []
                seen = ", ".join(f"GPU{g['index']} {g['utilization_pct']} %" for g in gpus) or "no GPU in status"
                if any((g.get("utilization_pct") or 0) > 0 for g in gpus):
                    return True, f"status through NVML: {seen}"
            time.sleep(1.0)
        return False, f"no GPU above 0 % in `blackbox status` within 60 s ({seen})"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def short(v: dict[str, Any]) -> str:
    if "error" in v:
        return str(v["error"])
    return f"{v.get('category')} {v.get('suspect_ranks')}" + (f" {v['phase']}" if v.get("phase") else "")


def main(argv: list[str]) -> int:
    gpu_py, ngpus = argv[0], int(argv[1])
    names = argv[2:] or [*ROWS, "nvml-status"]
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bb-gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        for name in names:
            t = time.monotonic()
            if name == "nvml-status":
                ok, got = nvml_row(gpu_py, tmp)
                rows.append((name, "GPU utilisation > 0 via NVML", got, "ok" if ok else "DIFFERS"))
            elif ROWS[name][2] > ngpus:
                rows.append((name, short(ROWS[name][4]), f"NOT RUN: needs {ROWS[name][2]} GPUs, this machine has "
                             f"{ngpus} (NCCL puts one rank on each GPU)", "NOT RUN"))  # fmt: skip
            else:
                verdict, err = run_row(name, gpu_py, tmp)
                want, member = ROWS[name][4], ROWS[name][5]
                same = "error" not in verdict and all(verdict.get(k) == v for k, v in want.items())
                has = member is None or any(member in m for m in verdict.get("members", []))
                got = short(verdict) + ("" if has else f" (no `{member}` in the bundle)")
                rows.append((name, short(want), got, "ok" if same and has else "DIFFERS"))
                if not (same and has):
                    print(f"--- {name}: blackbox's stderr (tail)\n{err[-2500:]}", file=sys.stderr)
            print(f"gpu_check: {name}: {rows[-1][3]} ({time.monotonic() - t:.0f} s)", flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'row':<{width}}  {'expected':<36}  {'got':<50}  result")
    for name, want, got, result in rows:
        print(f"{name:<{width}}  {want:<36}  {got:<50}  {result}")
    bad = [r for r in rows if r[3] != "ok"]
    if bad:
        print(f"\ngpu_check: FAILED: {len(bad)} of {len(rows)} row(s) did not run or did not match", file=sys.stderr)
        return 1
    print(f"\ngpu_check: all {len(rows)} rows match")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
