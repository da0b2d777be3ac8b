"""The GPU check's rows (started by scripts/gpu_check.sh, which finds what the machine has first): each runs
scripts/gpu_scenarios.py under `blackbox run` on one GPU, reads the report's verdict and what the bundle must hold, and
the check prints one table of expected against got. A row the machine cannot run (no CUDA) says so and fails the check.

    python scripts/gpu_check.py [ROW...]    # env: GPU_CHECK_CUDA=1|0, GPU_CHECK_ROW_S, GPU_CHECK_TOTAL_S, OUT

Imports the stdlib only; run with the interpreter that runs the jobs (blackbox on its PYTHONPATH)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu_scenarios.py"
BB = [sys.executable, "-m", "blackbox"]
HANG = ["--stall-timeout", "15"]


class Row(NamedTuple):
    case: str  # gpu_scenarios.py --case
    ranks: int
    options: list[str]  # blackbox run's
    want: dict[str, Any]  # the verdict's fields
    member: Optional[str]  # a bundle member it must hold (a substring of its name)


ROWS: dict[str, Row] = {
    # the collective sits behind a long kernel; the flight recorder says so, the host-sync stack does not
    "nccl-queued": Row("nccl-queued", 1, HANG, {"category": "hang.compute", "suspect_ranks": [0]}, "flight_recorder/"),
    # the process group gives up after 10 s: NCCL's watchdog fires (before blackbox's stall rule) and dumps
    "nccl-watchdog": Row("nccl-watchdog", 1, ["--stall-timeout", "90"],
                         {"category": "crash.comm_timeout", "suspect_ranks": [0]}, "flight_recorder/"),
    # CPU time is not progress: rank 1 spins in a host sync while its kernel runs, rank 0 waits in the all_reduce
    # the GIL held in C: the recorder cannot answer; the watchdog, asked through the debug pipe, writes the recorder
    "nccl-gil": Row("nccl-gil", 1, HANG, {"category": "hang.compute", "suspect_ranks": [0]}, "flight_recorder/"),
    "gpu-spin": Row("gpu-spin", 2, HANG, {"category": "hang.compute", "suspect_ranks": [1]}, None),
    "loader-hang": Row("loader-hang", 2, HANG,
                       {"category": "hang.data_loading", "suspect_ranks": [1], "phase": "data"}, None),
    "stopped": Row("stopped", 2, HANG, {"category": "hang.stopped", "suspect_ranks": [1]}, None),
    "cuda-oom": Row("oom", 1, ["--stall-timeout", "60", "--cuda-memory-history", "100000"],
                    {"category": "crash.oom", "suspect_ranks": [0]}, "memory-snapshot-oom"),
}  # fmt: skip
EXTRA = ("nvml-status", "doctor", "nccl-gil-collect")  # rows that are not a verdict
NEEDS_CUDA = (*ROWS, "nvml-status", "nccl-gil-collect")
COLLECTED = "written by torch's NCCL watchdog, asked through its debug pipe"  # the rank dumps step's words


class Result(NamedTuple):
    row: str
    expected: str
    got: str
    result: str  # ok, DIFFERS, NOT RUN


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "GPU_CHECK_"))}
    out["OMP_NUM_THREADS"] = "1"
    return out


def stop(proc: subprocess.Popen[str], grace_s: float = 20.0) -> str:
    """End a row's process group (TERM, then KILL) and return its stderr."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        return proc.communicate(timeout=grace_s)[1] or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[1] or ""


def keep(run_dir: Path, name: str) -> None:
    """Copy the row's bundles and raw flight-recorder dumps to $OUT/<row>/ (when OUT is set)."""
    out = os.environ.get("OUT")
    if not out:
        return
    dest = Path(out) / name
    for f in [*(run_dir / "bundles").glob("*.tar.gz"), *(run_dir / "flight_recorder").glob("*")]:
        if f.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / f.name)


def fr_states(bundle: Path) -> str:
    """The states of the last entries of the bundle's flight-recorder dumps ("" when it holds none)."""
    states = []
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            if "flight_recorder/" in m.name and m.isfile():
                try:
                    dump = pickle.load(tar.extractfile(m))  # type: ignore[arg-type]  # our own run's file
                    last = (dump.get("entries") or [{}])[-1]
                    states.append(f"{last.get('profiling_name', '?')} {last.get('state', '?')}")
                except Exception as e:  # a dump we cannot read is a finding, not a crash
                    states.append(f"unreadable ({type(e).__name__})")
    return "; ".join(states)


def run_row(name: str, tmp: Path, budget_s: float) -> tuple[dict[str, Any], str]:
    """(the report's verdict and the bundle's members, or an error), and blackbox's stderr tail."""
    row = ROWS[name]
    run_dir = tmp / name
    cmd = [*BB, "run", "--run-dir", str(run_dir), "--poll-interval", "0.5", "--kill-grace", "5", *row.options, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(row.ranks), str(JOB),
           "--case", row.case]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        err = proc.communicate(timeout=budget_s)[1] or ""
    except subprocess.TimeoutExpired:
        err = stop(proc) + f"\n(gpu_check: the row did not end within {budget_s:g} s and was stopped)"
    keep(run_dir, name)
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    if not bundles:
        return {"error": "no bundle"}, err
    res = subprocess.run([*BB, "report", str(bundles[0]), "--format", "json", "--no-fr-analyzer", "--no-index"],
                         capture_output=True, text=True, env=env(), timeout=120)  # fmt: skip
    if res.returncode != 0:
        return {"error": f"report failed: {res.stderr.strip()[-200:]}"}, err
    verdict: dict[str, Any] = json.loads(res.stdout)["verdict"]
    with tarfile.open(bundles[0]) as tar:
        verdict["members"] = tar.getnames()
    verdict["fr"] = fr_states(bundles[0])
    return verdict, err


def nvml_row(tmp: Path, budget_s: float) -> tuple[bool, str]:
    """`blackbox status` of a job keeping the GPU busy shows its utilisation and memory, read through NVML."""
    how = subprocess.run([sys.executable, "-c", "from blackbox.adapters import gpu; print(gpu.query_gpus(5.0)[1])"],
                         capture_output=True, text=True, env=env(), timeout=60).stdout.strip()  # fmt: skip
    if how != "NVML":
        return False, f"GPU readings come from `{how}`, not NVML (no nvidia-ml-py?)"
    run_dir = tmp / "nvml-status"
    cmd = [*BB, "run", "--run-dir", str(run_dir), "--poll-interval", "0.5", "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(JOB), "--case", "busy"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp, env={**env(), "BB_BUSY_S": str(int(budget_s))}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    seen = "no status read"
    try:
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            res = subprocess.run([*BB, "status", str(run_dir), "--format", "json"], capture_output=True, text=True,
                                 env=env(), timeout=30)  # fmt: skip
            if res.returncode == 0:
                gpus = json.loads(res.stdout).get("gpus") or []
                seen = ", ".join(f"GPU{g.get('index')} {g.get('utilization_pct')} % "
                                 f"{g.get('memory_used_mib')} MiB" for g in gpus) or "no GPU in status"  # fmt: skip
                if any((g.get("utilization_pct") or 0) > 0 and g.get("memory_used_mib") for g in gpus):
                    return True, f"NVML: {seen}"
            time.sleep(1.0)
        return False, f"no GPU busy in `blackbox status` within {budget_s:g} s ({seen})"
    finally:
        stop(proc)
        keep(run_dir, "nvml-status")


def collect_row(tmp: Path, budget_s: float) -> tuple[bool, str]:
    """`blackbox collect` of the nccl-gil job started without blackbox, torch's flight recorder and debug pipe named
    in its environment as a user names them: torch's NCCL watchdog, asked through the pipe, writes the rank's record
    while its Python holds the GIL."""
    work = tmp / "nccl-gil-collect"
    work.mkdir()
    job_env = {**env(), "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE":
               f"{work}/nccl_trace_rank_", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{work}/nccl_pipe_"}  # fmt: skip
    log = work / "job.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "1", str(JOB), "--case", "nccl-gil"], cwd=work, env=job_env, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + budget_s / 2
        while "failing now" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        if "failing now" not in log.read_text():
            return False, f"the job did not reach its hang: {log.read_text()[-300:]!r}"
        time.sleep(5)  # its liveness thread (none here: no recorder) and py-spy see the GIL held a while
        res = subprocess.run([*BB, "collect", str(proc.pid), "--out", str(work / "out"), "--format", "json"],
                             capture_output=True, text=True, env=env(), timeout=budget_s / 2)  # fmt: skip
        if res.returncode != 0:
            return False, f"blackbox collect failed: {res.stderr.strip()[-300:]}"
        outcome = json.loads(res.stdout)
        (step,) = [s for s in outcome["steps"] if s["name"] == "rank dumps"]
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "nccl-gil-collect").mkdir(parents=True, exist_ok=True)
            shutil.copy2(outcome["bundle"], Path(os.environ["OUT"], "nccl-gil-collect"))
        return COLLECTED in step["detail"], f"rank dumps: {step['status']}: {step['detail'][:240]}"
    except (subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return False, f"no collection ({type(e).__name__})"
    finally:
        stop(proc)


def doctor_row(tmp: Path, budget_s: float) -> tuple[bool, str]:
    """`blackbox doctor`: what this machine lets blackbox capture; the row holds each check's status."""
    try:
        res = subprocess.run([*BB, "doctor", "--format", "json", "--python", sys.executable, "--run-dir",
                              str(tmp / "doctor")], capture_output=True,
                             text=True, env=env(), timeout=budget_s)  # fmt: skip
        checks = json.loads(res.stdout)["checks"]
    except (subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return False, f"doctor gave no checks ({type(e).__name__})"
    out = os.environ.get("OUT")
    if out:
        Path(out, "doctor.json").write_text(res.stdout)
    for c in checks:
        if c["status"] != "ok":
            print(f"gpu_check: doctor: {c['name']} {c['status']}: {c['detail']}", flush=True)
    return True, ", ".join(f"{c['name']} {c['status']}" for c in checks)


def short(v: dict[str, Any]) -> str:
    if "error" in v:
        return str(v["error"])
    return f"{v.get('category')} {v.get('suspect_ranks')}" + (f" {v['phase']}" if v.get("phase") else "")


def judge(name: str, verdict: dict[str, Any]) -> Result:
    """A verdict row's line of the table: its expected fields and bundle member against what the run gave."""
    want, member = ROWS[name].want, ROWS[name].member
    same = "error" not in verdict and all(verdict.get(k) == v for k, v in want.items())
    has = member is None or any(member in m for m in verdict.get("members", []))
    got = short(verdict) + ("" if has else f" (no `{member}` in the bundle)")
    if verdict.get("fr"):
        got += f"; FR: {verdict['fr']}"
    expected = short(want) + (f" + {member}" if member else "")
    return Result(name, expected, got, "ok" if same and has else "DIFFERS")


def expected_of(name: str) -> str:
    if name == "nvml-status":
        return "GPU utilisation and memory via NVML"
    if name == "doctor":
        return "each check's status"
    if name == "nccl-gil-collect":
        return "blackbox collect, no blackbox run: the watchdog's flight recorder through the debug pipe"
    return short(ROWS[name].want) + (f" + {ROWS[name].member}" if ROWS[name].member else "")


def table(rows: list[Result]) -> str:
    width = max(len(r.row) for r in [*rows, Result("row", "", "", "")])
    ew = max(len(r.expected) for r in [*rows, Result("", "expected", "", "")])
    gw = max(len(r.got) for r in [*rows, Result("", "", "got", "")])
    lines = [f"{'row':<{width}}  {'expected':<{ew}}  {'got':<{gw}}  result"]
    lines += [f"{r.row:<{width}}  {r.expected:<{ew}}  {r.got:<{gw}}  {r.result}" for r in rows]
    return "\n".join(lines)


def one(name: str, tmp: Path, budget_s: float, cuda: bool) -> Result:
    if name in NEEDS_CUDA and not cuda:
        return Result(name, expected_of(name), "NOT RUN: no CUDA (torch sees no GPU)", "NOT RUN")
    if budget_s < 10:
        return Result(name, expected_of(name), "NOT RUN: the check's time is spent", "NOT RUN")
    if name == "doctor":
        ok, got = doctor_row(tmp, budget_s)
        return Result(name, expected_of(name), got, "ok" if ok else "DIFFERS")
    if name in ("nvml-status", "nccl-gil-collect"):
        ok, got = (nvml_row if name == "nvml-status" else collect_row)(tmp, budget_s)
        return Result(name, expected_of(name), got, "ok" if ok else "DIFFERS")
    verdict, err = run_row(name, tmp, budget_s)
    res = judge(name, verdict)
    if res.result != "ok":
        print(f"--- {name}: blackbox's stderr (tail)\n{err[-2500:]}", file=sys.stderr)
    return res


def main(argv: list[str]) -> int:
    names = argv or [
        "doctor",
        *ROWS,
        "nvml-status",
        "nccl-gil-collect",
    ]  # doctor first: what gVisor allows, even if a row hangs
    unknown = [n for n in names if n not in ROWS and n not in EXTRA]
    if unknown:
        print(f"gpu_check: unknown row(s) {unknown}; rows: {[*ROWS, *EXTRA]}", file=sys.stderr)
        return 2
    cuda = os.environ.get("GPU_CHECK_CUDA") == "1"
    row_s, total_s = float(os.environ.get("GPU_CHECK_ROW_S", "55")), float(os.environ.get("GPU_CHECK_TOTAL_S", "450"))
    end = time.monotonic() + total_s
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bb-gpu-check-") as tmp_name:
        for name in names:
            t = time.monotonic()
            rows.append(one(name, Path(tmp_name), min(row_s, end - t), cuda))
            print(f"gpu_check: {name}: {rows[-1].result} ({time.monotonic() - t:.0f} s)", flush=True)
    text = table(rows)
    print("\n" + text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check_table.txt").write_text(text + "\n")
    bad = [r for r in rows if r.result != "ok"]
    if bad:
        print(f"\ngpu_check: FAILED: {len(bad)} of {len(rows)} row(s) did not run or did not match", file=sys.stderr)
        return 1
    print(f"\ngpu_check: all {len(rows)} rows match")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
