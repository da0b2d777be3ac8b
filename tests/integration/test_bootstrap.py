"""The injected recorder in fresh interpreters: stdlib-only, activates where it should and only there,
chains the user's sitecustomize, and never hurts the job."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox.heartbeat_reader import HeartbeatState, decode
from blackbox.supervisor.rundir import INJECT_DIR
from tests.conftest import job_env

HEAVY = ("torch", "click", "rich", "psutil", "numpy")
REPORT_MODULES = "import sys, json; print(json.dumps(sorted(m for m in %r if m in sys.modules)))" % (HEAVY,)


def py(code: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def rank_env(run_dir: Path, **extra: str) -> dict[str, str]:
    return job_env(PYTHONPATH=INJECT_DIR, BLACKBOX_RECORD_DIR=str(run_dir), **extra)


def read_hb(run_dir: Path, rank: int = 0) -> HeartbeatState:
    with open(run_dir / "ranks" / str(rank) / "heartbeat", "rb") as f:
        return decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def test_inject_dir_holds_only_sitecustomize() -> None:
    names = {n for n in os.listdir(INJECT_DIR) if n != "__pycache__"}
    assert names == {"sitecustomize.py"}


def test_sitecustomize_env_names_match_the_protocol() -> None:
    text = Path(INJECT_DIR, "sitecustomize.py").read_text()
    assert f'_RUN_DIR = "{P.ENV_RUN_DIR}"' in text
    assert f'_RECORDER = "{P.ENV_RECORDER}"' in text
    assert f'_DISABLE = "{P.ENV_DISABLE}"' in text
    assert f'"{P.MODE_RANK}"' in text and f'"{P.MODE_SINGLE}"' in text


def test_importing_blackbox_is_light(tmp_path: Path) -> None:
    out = py("import blackbox; blackbox.step(); " + REPORT_MODULES, job_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_active_recorder_imports_nothing_heavy(tmp_path: Path) -> None:
    # GIVEN a process that looks like rank 0 of a job under blackbox
    out = py(REPORT_MODULES, rank_env(tmp_path, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2"))
    # THEN it recorded, and no heavy module was imported on its behalf
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    hb = read_hb(tmp_path)
    assert (hb.rank, hb.world_size, hb.mode, hb.state) == (0, 2, "rank", "exited")


def test_single_process_is_rank_zero_and_counts_optimizer_steps(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    m(torch.ones(1, 2)).sum().backward(); o.step()\n"
    )
    out = py(code, rank_env(tmp_path))
    assert out.returncode == 0, out.stderr
    hb = read_hb(tmp_path)
    assert (hb.rank, hb.mode, hb.step) == (0, "single", 3)
    assert not (tmp_path / "ranks" / "0" / "recorder.log").exists()


def test_public_api_inside_and_outside(tmp_path: Path) -> None:
    code = (
        "import blackbox\n"
        "blackbox.step(); blackbox.step()\n"
        "with blackbox.phase('eval'):\n"
        "    blackbox.annotate(shard='s3://bucket/part-7', epoch=2)\n"
        "    blackbox.log_metrics(2, loss=0.5)\n"
    )
    out = py(code, job_env())  # outside blackbox run: every call is a no-op
    assert out.returncode == 0 and out.stderr == ""
    out = py(code, rank_env(tmp_path))
    assert out.returncode == 0, out.stderr
    hb = read_hb(tmp_path)
    assert hb.step == 2 and hb.phase == "compute"
    rank_dir = tmp_path / "ranks" / "0"
    assert json.loads((rank_dir / "annotations.json").read_text()) == {
        "shard": "s3://bucket/part-7",
        "epoch": 2,
    }
    assert json.loads((rank_dir / "metrics.json").read_text())[0]["loss"] == 0.5


def test_children_of_a_rank_do_not_record(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], check=True)\n"
    )
    out = py(code, rank_env(tmp_path, RANK="1", LOCAL_RANK="1"))
    assert out.returncode == 0, out.stderr
    assert [p.name for p in (tmp_path / "ranks").iterdir()] == ["1"]
    assert read_hb(tmp_path, 1).pid != int(out.stdout)


@pytest.mark.parametrize("options", [[], ["-W", "ignore"], ["-u", "-X", "dev", "-W", "ignore::DeprecationWarning"]])
def test_launchers_do_not_record(tmp_path: Path, options: list[str]) -> None:
    # interpreter options before `-m` (their values too) do not hide the launcher
    out = subprocess.run([sys.executable, *options, "-m", "torch.distributed.run", "--help"], env=rank_env(tmp_path),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "ranks").exists()


def test_chains_the_users_sitecustomize(tmp_path: Path) -> None:
    # GIVEN a user sitecustomize on the job's own PYTHONPATH, which ours shadows
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = rank_env(tmp_path / "rec", RANK="0", LOCAL_RANK="0")
    env["PYTHONPATH"] = INJECT_DIR + os.pathsep + str(user)
    # WHEN a rank starts
    out = py("import os, sitecustomize; print(os.environ.get('USER_SITE_RAN'), sitecustomize.__file__)", env)
    # THEN both ran, and `sitecustomize` is the user's module
    assert out.returncode == 0, out.stderr
    ran, path = out.stdout.split()
    assert ran == "yes" and path == str(user / "sitecustomize.py")
    assert (tmp_path / "rec" / "ranks" / "0" / "heartbeat").exists()


@pytest.mark.timeout(170)
def test_a_short_lived_rank_always_exits_cleanly_on_a_busy_machine(tmp_path: Path) -> None:
    # GIVEN a machine whose cores are busy, as during a large job's start: a spinning process for each core idle now
    # (none beside the suite's other jobs, that keep both cores busy already; one per core when the test runs alone)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(idle_cores())]
    try:
        # WHEN 200 ranks start with the recorder and exit at once (its liveness thread still in its first ticks,
        # loading the redactor, while the interpreter tears itself down: a crash there once hit about one in ten)
        codes = []
        for i in range(200):
            env = rank_env(tmp_path / f"rec{i}", RANK="0", LOCAL_RANK="0")
            codes.append(subprocess.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True,
                                        timeout=60).returncode)  # fmt: skip
    finally:
        for b in burners:
            b.kill()
            b.wait()
    # THEN every one exits 0: never a SIGSEGV or an abort of the job's exit
    assert codes == [0] * len(codes), sorted(set(codes))


def idle_cores(over_s: float = 1.0) -> int:
    """How many of the machine's cores sat idle over the last `over_s` (/proc/stat), rounded."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    idle0, total0 = sample()
    time.sleep(over_s)
    idle1, total1 = sample()
    return round((os.cpu_count() or 1) * (idle1 - idle0) / max(1, total1 - total0))


def test_a_recorder_that_cannot_start_leaves_the_job_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = py("print('job output')", rank_env(blocker / "run", RANK="0", LOCAL_RANK="0"))
    assert (out.returncode, out.stdout, out.stderr) == (0, "job output\n", "")


def test_disable_switch(tmp_path: Path) -> None:
    out = py("pass", rank_env(tmp_path, RANK="0", LOCAL_RANK="0", BLACKBOX_DISABLE="1"))
    assert out.returncode == 0 and not (tmp_path / "ranks").exists()


def test_rank_side_parses_as_python_3_9() -> None:
    import ast

    rank_side = Path(INJECT_DIR).parent
    for path in [*rank_side.glob("*.py"), *rank_side.glob("inject/*.py")]:
        ast.parse(path.read_text(), str(path), feature_version=(3, 9))


PHASE_PROBE = """
import mmap, os, sys
from blackbox.heartbeat_reader import decode

def phase():
    path = os.path.join(os.environ["BLACKBOX_RECORD_DIR"], "ranks", "0", "heartbeat")
    with open(path, "rb") as f:
        return decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)).phase

import torch
from torch.utils.data import DataLoader, Dataset

class D(Dataset):
    def __len__(self): return 4
    def __getitem__(self, i):
        print("in __getitem__:", phase())
        return torch.zeros(2)

class Sink:
    def write(self, b):
        print("in torch.save:", phase()); sys.stdout.flush(); return len(b)
    def flush(self): pass

for _ in DataLoader(D(), batch_size=4):
    print("after __next__:", phase())
torch.save({"w": torch.ones(2)}, Sink())
"""


def test_data_and_checkpoint_phases_without_code_change(tmp_path: Path) -> None:
    out = py(PHASE_PROBE, rank_env(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = set(out.stdout.splitlines())
    assert "in __getitem__: data" in lines
    assert "after __next__: startup" in lines  # back to the phase it came from
    assert "in torch.save: checkpoint" in lines
    hb = read_hb(tmp_path)
    assert hb.batches == 1 and hb.data_wait_total > 0


RECORDS_PROBE = """
import random, threading, torch
random.seed(7)
torch.manual_seed(11)
import numpy
numpy.random.seed(13)
import torch.distributed.checkpoint as dcp
from blackbox.heartbeat_reader import decode
import mmap, os

def phase():
    path = os.path.join(os.environ["BLACKBOX_RECORD_DIR"], "ranks", "0", "heartbeat")
    with open(path, "rb") as f:
        return decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)).phase

class Probe:
    def __reduce__(self):
        print("in dcp.save:", phase(), flush=True)
        return (dict, ())

dcp.save({"w": torch.ones(2), "probe": Probe()}, checkpoint_id=os.environ["CKPT"], no_dist=True)
t = threading.Thread(target=lambda: 1 / 0, name="loader-thread")
t.start(); t.join()
"""


def test_seeds_dcp_phase_and_thread_exceptions(tmp_path: Path) -> None:
    out = py(RECORDS_PROBE, rank_env(tmp_path / "rec", CKPT=str(tmp_path / "ckpt")))
    assert out.returncode == 0, out.stderr
    assert "in dcp.save: checkpoint" in out.stdout
    assert "ZeroDivisionError" in out.stderr  # the thread's traceback still printed as before
    rank_dir = tmp_path / "rec" / "ranks" / "0"
    (record,) = [json.loads(line) for line in (rank_dir / "exceptions.jsonl").read_text().splitlines()]
    assert record["thread"] == "loader-thread" and record["type"] == "builtins.ZeroDivisionError"
    # torch.manual_seed seeds the CUDA generators too, through torch.cuda.manual_seed_all
    assert record["seeds"] == {"random.seed": 7, "torch.manual_seed": 11, "torch.cuda.manual_seed_all": 11,
                               "numpy.random.seed": 13}  # fmt: skip
    assert read_hb(tmp_path / "rec").state == "exited"  # a thread's exception does not end the rank


THREAD_SIGNAL_PROBE = """
import os, signal, sys, threading
errors = []
def install():
    try:
        signal.signal(signal.SIGTERM, lambda *a: None)
    except ValueError as exc:
        errors.append(str(exc))
t = threading.Thread(target=install)
t.start(); t.join()
print(errors[0]); sys.stdout.flush()
os.kill(os.getpid(), signal.SIGTERM)
"""


def test_signal_from_a_thread_fails_as_before_and_sigterm_still_dumps(tmp_path: Path) -> None:
    out = py(THREAD_SIGNAL_PROBE, rank_env(tmp_path, RANK="0", LOCAL_RANK="0"))
    assert out.stdout.startswith("signal only works in main thread")  # the job's own error, unchanged
    assert out.returncode == -15  # SIGTERM's default action still happens after the dump
    assert "Current thread" in (tmp_path / "ranks" / "0" / "sigterm.txt").read_text()
