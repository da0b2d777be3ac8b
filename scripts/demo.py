"""`make demo`: run one scenario of the gallery (scripts/scenarios/: rank 1's dataset read blocks forever, like
a dead network filesystem, while rank 0 waits in all_reduce) under `blackbox run`, let blackbox catch the hang,
then report the bundle. Run from the repository root inside the project's virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def main() -> int:
    # the job's temporary files (each rank's work directory, torchrun's) in a directory removed at the end: its ranks
    # are ended, never left to clean up after themselves
    with tempfile.TemporaryDirectory(prefix="bb-demo-", ignore_cleanup_errors=True) as scratch:
        return demo(scratch)


def demo(scratch: str) -> int:
    run_dir = ROOT / "blackbox-runs" / ("demo-" + datetime.now().strftime("%Y%m%d-%H%M%S"))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "TMPDIR": scratch}  # fmt: skip
    cmd = ["blackbox", "run", "--run-dir", str(run_dir), "--stall-timeout", "10", "--kill-grace", "10", "--",
           "torchrun", "--standalone", "--nproc-per-node", "2", str(ROOT / "scripts" / "scenarios" / "train.py"),
           "data-hang", "1"]  # fmt: skip
    print("$ " + " ".join([*cmd[:8], "--", "torchrun --standalone --nproc-per-node 2 scripts/scenarios/train.py "
                           "data-hang 1"]))  # fmt: skip
    print("(rank 1 will block reading a dataset shard at step 3; blackbox should notice within ~10 s)\n", flush=True)
    code = subprocess.call(cmd, env=env, cwd=ROOT)
    print(f"\nblackbox run exited with {code} (86 = blackbox ended the job after a stall)\n", flush=True)
    print(f"$ blackbox report {run_dir.relative_to(ROOT)}\n", flush=True)
    report = subprocess.call(["blackbox", "report", str(run_dir)], env=env, cwd=ROOT)
    return 0 if code == 86 and report == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
