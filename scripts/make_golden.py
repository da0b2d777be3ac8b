"""Regenerate the golden bundles under tests/data/golden/: each scenario of tests/programs/lastwords_job.py run
end to end under `blackbox run` (real torchrun, real gloo), its bundle kept with the verdict expected of it in
expected.json. The bundles are redacted like any other; they hold paths of the machine that made them.
Run with the project's venv: python scripts/make_golden.py [NAME...]"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
JOB = ROOT / "tests" / "programs" / "lastwords_job.py"
OUT = ROOT / "tests" / "data" / "golden"

# name: (scenario, misbehaving rank, extra blackbox options, expected verdict)
SCENARIOS: dict[str, tuple[str, int, list[str], dict[str, object]]] = {
    "data-hang": ("data-hang", 1, [], {"category": "hang.data_loading", "suspect_ranks": [1], "phase": "data"}),
    "data-hang-workers": ("data-hang-workers", 1, [],
                          {"category": "hang.data_loading", "suspect_ranks": [1], "phase": "data"}),
    "ckpt-hang": ("ckpt-hang", 0, [], {"category": "hang.checkpoint_io", "suspect_ranks": [0], "phase": "checkpoint"}),
    "compute-hang": ("skip-allreduce", 1, [], {"category": "hang.compute", "suspect_ranks": [1], "phase": "compute"}),
    "gil-hang": ("gil-hang", 1, [], {"category": "hang.compute", "suspect_ranks": [1], "phase": "compute"}),
    "exception": ("raise", 1, [], {"category": "crash.exception", "suspect_ranks": [1], "phase": "compute"}),
    "oom": ("oom", 0, [], {"category": "crash.oom", "suspect_ranks": [0], "phase": "compute"}),
    "segfault": ("segv", 1, [], {"category": "crash.signal", "suspect_ranks": [1]}),
    "sigkill": ("sigkill", 1, [], {"category": "crash.signal", "suspect_ranks": [1]}),
    "mismatch": ("mismatch", 1, [], {"category": "hang.collective", "suspect_ranks": [0, 1], "phase": "collective"}),
    "cuda-error": ("cuda-error", 1, [], {"category": "crash.cuda_error", "suspect_ranks": [1], "phase": "compute"}),
    "comm-timeout": ("comm-timeout", 1, ["--stall-timeout", "60"],
                     {"category": "crash.comm_timeout", "suspect_ranks": [1], "phase": "compute"}),
}  # fmt: skip


def run(name: str) -> None:
    scenario, rank, extra, expected = SCENARIOS[name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp, "run")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_")}
        env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        cmd = [sys.executable, "-m", "blackbox", "run", "--run-dir", str(run_dir), "--stall-timeout", "4",
               "--poll-interval", "0.5", "--kill-grace", "5", *extra, "--", str(BIN / "torchrun"), "--standalone",
               "--nproc-per-node", "2", str(JOB), scenario, str(rank)]  # fmt: skip
        t = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip
        try:
            _, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        bundles = sorted((run_dir / "bundles").glob("*.tar.gz"))
        if not bundles:
            raise SystemExit(f"{name}: no bundle (exit {proc.returncode}):\n{err.decode()[-2000:]}")
        shutil.copyfile(bundles[0], OUT / f"{name}.tar.gz")
        print(f"{name}: {bundles[0].name} ({bundles[0].stat().st_size} bytes, {time.monotonic() - t:.0f} s)")
    expected_path = OUT / "expected.json"
    table = json.loads(expected_path.read_text()) if expected_path.exists() else {}
    table[name] = expected
    expected_path.write_text(json.dumps(dict(sorted(table.items())), indent=2) + "\n")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or list(SCENARIOS):
        run(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
