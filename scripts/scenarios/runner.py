"""Runs one scenario of the gallery (scenarios.json beside this file) end to end: under `blackbox run` (real
torchrun, real gloo), or — the `collect` variant of a hang — under plain torchrun, collected by
`blackbox collect AGENT` once the failure has come. Shared by tests/integration/test_scenarios.py,
scripts/make_golden.py and `make demo`. As a script it runs the gallery and prints the table of verdicts:

    python scripts/scenarios/runner.py [--collect] [NAME...]    (exit 1 when any row differs)

Imports the stdlib only; run with the project's venv (blackbox, torchrun and py-spy beside its python)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
BIN = Path(sys.executable).parent
SCENARIOS: dict[str, dict[str, Any]] = json.loads((HERE / "scenarios.json").read_text())
DEFAULT_OPTIONS = ["--stall-timeout", "4"]
LIVE: set[int] = set()  # pids of the gallery jobs running now (a test fixture that reaps leftovers spares them)
LIVE_LOCK = threading.Lock()  # held from a job's start until its pid is in LIVE


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    bundles: list[Path] = field(default_factory=list)


def command(name: str, run_dir: Path) -> list[str]:
    spec = SCENARIOS[name]
    options = spec.get("options", DEFAULT_OPTIONS)
    return [sys.executable, "-m", "blackbox", "run", "--run-dir", str(run_dir), "--poll-interval", "0.5",
            "--kill-grace", "3", *options, "--", *torchrun_command(name)]  # fmt: skip


def torchrun_command(name: str) -> list[str]:
    spec = SCENARIOS[name]
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(spec.get("nproc", 2)), str(TRAIN),
            *map(str, spec["args"])]  # fmt: skip


def environment(name: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_") or k == "BLACKBOX_HOME"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    env.update(SCENARIOS.get(name, {}).get("env", {}))
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own: killing the launcher's
    process group would leave them running)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def run(name: str, run_dir: Path, cwd: Path, timeout: float = 180.0) -> Outcome:
    """Run the scenario; for one with `collect_after_step`, send blackbox SIGUSR1 ("collect now") once rank 0
    printed that step. The job is always ended (its process group killed) by the time this returns."""
    spec = SCENARIOS[name]
    with LIVE_LOCK:
        proc = subprocess.Popen(command(name, run_dir), cwd=cwd, env=environment(name), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        LIVE.add(proc.pid)
    out: list[str] = []
    err: list[str] = []
    after = spec.get("collect_after_step")
    asked = threading.Event()

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if after is not None and not asked.is_set() and f"rank 0 step {after} " in line:
                asked.set()
                time.sleep(0.15)  # rank 0 has gone on into the next all_reduce, where it waits for the others
                os.kill(proc.pid, signal.SIGUSR1)

    def read_err() -> None:
        assert proc.stderr is not None
        err.extend(proc.stderr)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        LIVE.discard(proc.pid)
        deadline = time.monotonic() + 5
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    return Outcome(proc.returncode, "".join(out), "".join(err), bundles)


SETTLE_S = 3.0  # after the failing rank's line: time for its peers to reach the collective they will wait in


def collect(name: str, out_dir: Path, cwd: Path, timeout: float = 120.0) -> Outcome:
    """The scenario under plain torchrun (no blackbox, no recorder), collected by `blackbox collect AGENT` once
    the failing rank said so and its peers had a moment to reach their wait; then the job is killed."""
    with LIVE_LOCK:
        proc = subprocess.Popen(torchrun_command(name), cwd=cwd, env=environment(name), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        LIVE.add(proc.pid)
    out: list[str] = []
    failing = threading.Event()

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "failing now" in line:
                failing.set()

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        if not failing.wait(timeout / 2):
            return Outcome(-1, "".join(out), "the failing rank never said `failing now`")
        time.sleep(SETTLE_S)
        argv = [sys.executable, "-m", "blackbox", "collect", str(proc.pid), "--out", str(out_dir)]
        with LIVE_LOCK:
            collector = subprocess.Popen(argv, cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
            LIVE.add(collector.pid)
        try:
            _, err = collector.communicate(timeout=timeout / 2)
        finally:
            LIVE.discard(collector.pid)
            if collector.poll() is None:
                collector.kill()
                collector.communicate()
    finally:
        kill_tree(proc.pid)
        proc.wait()
        LIVE.discard(proc.pid)
        reader.join(5)
    return Outcome(collector.returncode, "".join(out), err, sorted(out_dir.glob("*.tar.gz")))


def verdict_of(bundle: Path) -> dict[str, Any]:
    """`blackbox report --format json`'s verdict for a bundle (not indexed, no PyTorch analyzer)."""
    res = subprocess.run([sys.executable, "-m", "blackbox", "report", str(bundle), "--format", "json",
                          "--no-fr-analyzer", "--no-index"], capture_output=True, text=True, env=environment(),
                         timeout=120)  # fmt: skip
    if res.returncode != 0:
        return {"error": res.stderr.strip()[-300:]}
    verdict: dict[str, Any] = json.loads(res.stdout)["verdict"]
    return verdict


def compare(name: str, verdict: Optional[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(what was got of the expected keys, whether it matches)."""
    want = SCENARIOS[name]["verdict"]
    if want is None:
        return {}, verdict is None
    got = {k: (verdict or {}).get(k) for k in want}
    return got, got == want


def table(rows: list[tuple[str, str, Any, Any, bool]]) -> str:
    """scenario x mode -> expected, got: one line each, the differing ones marked."""

    def short(v: Any) -> str:
        if not v:
            return "(no bundle)" if v is None else "-"
        return f"{v.get('category')} {v.get('suspect_ranks')}" + (f" {v['phase']}" if v.get("phase") else "")

    lines = [f"{'scenario':<24} {'mode':<8} {'expected':<40} got"]
    for name, mode, want, got, ok in rows:
        lines.append(f"{name:<24} {mode:<8} {short(want):<40} {short(got)}{'' if ok else '   <-- DIFFERS'}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    modes = ["run", "collect"] if "--collect" in argv else ["run"]
    names = [a for a in argv if not a.startswith("--")] or list(SCENARIOS)
    rows = []
    for name in names:
        for mode in modes:
            if mode == "collect" and not SCENARIOS[name].get("collect"):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                outcome = (run if mode == "run" else collect)(name, Path(tmp, "out"), Path(tmp))
                verdict = verdict_of(outcome.bundles[0]) if outcome.bundles else None
            got, ok = compare(name, verdict)
            rows.append((name, mode, SCENARIOS[name]["verdict"], got if verdict is not None else None, ok))
            print(table(rows).splitlines()[-1], flush=True)
    print(table(rows))
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
