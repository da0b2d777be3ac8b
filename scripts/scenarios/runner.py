"""Runs one scenario of the gallery (scenarios.json beside this file) end to end under `blackbox run`: real
torchrun, real gloo. Shared by tests/integration/test_scenarios.py, scripts/make_golden.py and `make demo`.
Imports the stdlib only; run with the project's venv (blackbox, torchrun and py-spy beside its python)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
BIN = Path(sys.executable).parent
SCENARIOS: dict[str, dict[str, Any]] = json.loads((HERE / "scenarios.json").read_text())
DEFAULT_OPTIONS = ["--stall-timeout", "4"]


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
            "--kill-grace", "5", *options, "--", str(BIN / "torchrun"), "--standalone", "--nproc-per-node",
            str(spec.get("nproc", 2)), str(TRAIN), *map(str, spec["args"])]  # fmt: skip


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_") or k == "BLACKBOX_HOME"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    return env


def run(name: str, run_dir: Path, cwd: Path, timeout: float = 180.0) -> Outcome:
    """Run the scenario; for one with `collect_after_step`, send blackbox SIGUSR1 ("collect now") once rank 0
    printed that step. The job is always ended (its process group killed) by the time this returns."""
    spec = SCENARIOS[name]
    proc = subprocess.Popen(command(name, run_dir), cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
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
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 5
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
    bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
    return Outcome(proc.returncode, "".join(out), "".join(err), bundles)
