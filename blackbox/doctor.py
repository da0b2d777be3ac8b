"""`blackbox doctor`: what this machine will let blackbox capture, each check tried for real (py-spy attaching
to a child, a recorder activating in a sample rank, the job's torch asked what it has) with the fix where one
fails. The core never prints. Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ._recorder import protocol as P
from .adapters import gpu, host, procfs, pyspy
from .heartbeat_reader import decode
from .supervisor.rundir import INJECT_DIR

MIN_FREE_BYTES = 1 << 30  # below this, bundles and heartbeats may not fit
CHECKS = (
    "recorder",
    "run-dir",
    "signals",
    "init",
    "py-spy",
    "torch",
    "gpu",
    "kernel-messages",
    "coordination",
    "incident-index",
)
ESSENTIAL = ("recorder", "run-dir", "signals")  # without these `blackbox run` cannot do its job


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: Optional[str] = None


_SLEEPER = "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"
_HANDLER = ("import faulthandler, signal, sys, time; faulthandler.register(signal.SIGUSR1); "
            "faulthandler.register(signal.SIGRTMAX - %d, chain=False); "
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)") % P.DUMP_SIGNAL_FROM_MAX  # fmt: skip
_TORCH_PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
except Exception as exc:
    out["error"] = repr(exc)
else:
    out["torch"] = torch.__version__
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    out["fr_gloo"] = bool(c10d and (hasattr(c10d, "_dump_fr_trace") or hasattr(c10d, "_dump_fr_trace_json")))
    out["fr_nccl"] = bool(c10d and hasattr(c10d, "_dump_nccl_trace"))
    out["memory_history"] = hasattr(getattr(torch.cuda, "memory", None), "_record_memory_history")
    out["oom_error"] = hasattr(torch, "OutOfMemoryError")
    out["cuda"] = bool(torch.cuda.is_available())
    out["fr_analyzer"] = True
    try:
        import torch.distributed.flight_recorder.fr_trace  # noqa: F401
    except Exception:
        out["fr_analyzer"] = False
print(json.dumps(out))
"""


def _child(code: str, env: Optional[dict[str, str]] = None, python: str = sys.executable) -> subprocess.Popen[str]:
    proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready": the child is set up
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def check_recorder(python: str) -> Check:
    """A sample rank process: the injected start-up hook must activate the recorder and write a heartbeat."""
    with tempfile.TemporaryDirectory(prefix="blackbox-doctor-") as run_dir:
        os.makedirs(os.path.join(run_dir, P.RANKS_DIR), mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOX_")}
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", PYTHONPATH=INJECT_DIR, **{P.ENV_RUN_DIR: run_dir})
        try:
            proc = _child(_SLEEPER, env, python)
        except OSError as exc:
            return Check("recorder", "fail", f"`{python}` could not be started: {exc.strerror}",
                         "Give the job's interpreter with --python.")  # fmt: skip
        try:
            path = os.path.join(run_dir, P.RANKS_DIR, "0", P.RANK_HEARTBEAT)
            deadline = time.monotonic() + 10
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not os.path.exists(path):
                log = os.path.join(run_dir, P.RANKS_DIR, "0", P.RANK_LOG)
                why = "no heartbeat and no recorder log"
                if os.path.exists(log):
                    with open(log) as logf:
                        why = logf.read().strip()[-300:]
                return Check("recorder", "fail", f"the recorder did not activate in a sample rank: {why}",
                             "Run with BLACKBOX_DEBUG=1 and report it; check that nothing else sets PYTHONPATH "
                             "or turns off site customisation (python -S, -I).")  # fmt: skip
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                hb = decode(mm)
            if hb.pid != proc.pid:
                return Check("recorder", "fail", f"the heartbeat names pid {hb.pid}, not the sample rank {proc.pid}")
            return Check("recorder", "ok", f"activates in a sample rank of `{python}` (heartbeat v{hb.version}, "
                         f"mode {hb.mode})")  # fmt: skip
        finally:
            _end(proc)


def check_run_dir(path: str) -> Check:
    target = os.path.abspath(path)
    probe_dir = target
    while not os.path.exists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    if not os.path.isdir(probe_dir):
        return Check("run-dir", "fail", f"`{probe_dir}` is a file, so `{target}` cannot be created",
                     "Give a writable --run-dir (or BLACKBOX_RUN_DIR).")  # fmt: skip
    if not os.access(probe_dir, os.W_OK):
        return Check("run-dir", "fail", f"`{probe_dir}` is not writable, so `{target}` cannot be created",
                     "Give a writable --run-dir (or BLACKBOX_RUN_DIR).")  # fmt: skip
    free = host.disk_free(probe_dir).get("free")
    if isinstance(free, int) and free < MIN_FREE_BYTES:
        return Check("run-dir", "warn", f"only {free / 2**20:.0f} MiB free at `{probe_dir}`",
                     "Free space, or point --run-dir elsewhere: bundles with snapshots can be large.")  # fmt: skip
    free_text = f"{free / 2**30:.1f} GiB free" if isinstance(free, int) else "free space unknown"
    return Check("run-dir", "ok", f"`{target}` can be created ({free_text})")


def check_signals() -> Check:
    """faulthandler on SIGUSR1 and on the recorder's dump signal in a child, seen from outside the way the
    collector looks before signalling."""
    proc = _child(_HANDLER)
    try:
        for sig, name in ((signal.SIGUSR1, "SIGUSR1"), (P.dump_signal(), "the dump signal (SIGRTMAX-3)")):
            if not procfs.has_handler(proc.pid, sig):
                return Check(
                    "signals",
                    "fail",
                    f"a handler for {name} installed in a child is not visible in /proc/PID/status (SigCgt)",
                    "blackbox needs Linux's /proc; run it on the job's host.",
                )
            os.kill(proc.pid, sig)
            time.sleep(0.2)
            if proc.poll() is not None:
                return Check("signals", "fail", f"a child with a handler for {name} died of it")
        return Check(
            "signals",
            "ok",
            "SIGUSR1 and dump-signal handlers install, show in SigCgt, and a dump leaves the process alive",
        )
    finally:
        _end(proc)


def check_pyspy() -> Check:
    exe, why = pyspy.find()
    if exe is None:
        return Check("py-spy", "fail", why, "pip install py-spy (it comes with torch-blackbox), or set BLACKBOX_PYSPY.")
    proc = _child(_SLEEPER)
    try:
        result = pyspy.dump(proc.pid, timeout=15, exe=exe)
    finally:
        _end(proc)
    if result.threads is None:
        return Check("py-spy", "fail", f"{exe} cannot attach to a child: {result.error}", pyspy.PTRACE_HINT)
    native = pyspy.dump(os.getpid(), native=True, timeout=15, exe=exe)
    extra = "; --native works" if native.threads is not None else f"; --native does not: {native.error}"
    return Check("py-spy", "ok", f"{exe} ({why}) attaches to a child{extra}")


def check_torch(python: str) -> Check:
    try:
        out = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120, check=False)
        facts = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return Check("torch", "fail", f"`{python}` could not be asked about torch: {exc}",
                     "Give the job's interpreter with --python.")  # fmt: skip
    if "error" in facts:
        return Check("torch", "warn", f"torch does not import in `{python}`: {facts['error']}",
                     "Give the job's interpreter with --python.")  # fmt: skip
    recorder = "flight recorder (Gloo and NCCL)" if facts.get("fr_gloo") else "flight recorder (NCCL only)"
    have = {recorder: facts.get("fr_gloo") or facts.get("fr_nccl"),
            "CUDA memory history": facts.get("memory_history"), "torch.OutOfMemoryError": facts.get("oom_error"),
            "flight-recorder analyzer": facts.get("fr_analyzer"), "CUDA": facts.get("cuda")}  # fmt: skip
    yes = [k for k, v in have.items() if v]
    no = [k for k, v in have.items() if not v]
    detail = f"torch {facts.get('torch')} on Python {facts.get('python')}: has {', '.join(yes) or 'none of'}"
    detail += f"; lacks {', '.join(no)}" if no else ""
    old = not facts.get("fr_gloo") and not facts.get("fr_nccl")
    return Check("torch", "warn" if old else "ok", detail,
                 "torch >= 2.5 records collectives in its flight recorder" if old else None)  # fmt: skip


def check_gpu() -> Check:
    readings, how = gpu.query_gpus(5.0)
    if readings:
        return Check("gpu", "ok", f"{how}: {len(readings)} GPU(s): " + "; ".join(g.describe() for g in readings))
    return Check("gpu", "warn", how, "pip install 'torch-blackbox[gpu]' for NVML, or put nvidia-smi on PATH "
                 "(nothing to do on a machine without GPUs).")  # fmt: skip


# what reaps the orphans handed to it as PID 1 (a container's first process, a machine's init)
REAPERS = frozenset({"blackbox", "tini", "dumb-init", "catatonit", "systemd", "init", "s6-svscan", "runsvdir",
                     "supervisord", "bash", "sh", "dash", "zsh", "docker-init", "pause"})  # fmt: skip


def check_init() -> Check:
    """PID 1 of this machine or container: whether it reaps orphaned processes (a dead rank's children, the job's
    grandchildren) and acts on SIGTERM — a container's own command as PID 1 does neither."""
    argv = procfs.cmdline(1)
    if not argv:
        return Check("init", "ok", "PID 1 cannot be read here (/proc hides it): nothing to say")
    names = [os.path.basename(a) for a in argv[:3]]
    if "blackbox" in names:
        return Check("init", "ok", "PID 1 is `blackbox run`: it reaps the job's orphaned processes and passes SIGTERM "
                     "and SIGINT on to the launcher")  # fmt: skip
    if names[0] in REAPERS:
        return Check("init", "ok", f"PID 1 is `{names[0]}`, which reaps orphaned processes")
    shown = " ".join(argv)[:80]
    return Check("init", "warn", f"PID 1 is `{shown}` (a container's own command?): orphaned processes — a dead rank's "
                 "children — are never reaped, and a SIGTERM it has no handler for is ignored",
                 "Start the container's command under blackbox (`blackbox run -- torchrun …`: as PID 1 it reaps "
                 "orphans and passes signals on), or under an init such as tini.")  # fmt: skip


def check_kernel() -> Check:
    lines, how = host.kernel_messages(5.0)
    if lines is None:
        return Check("kernel-messages", "warn", how, host.DMESG_HINT)
    return Check("kernel-messages", "ok", how)


_STORE_PROBE = r"""
import datetime, json, os
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch
from torch.distributed import TCPStore
server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))
client.set("probe", "ok")
print(json.dumps({"torch": torch.__version__, "value": server.get("probe").decode()}))
"""


def check_coordination() -> Check:
    """Multi-node jobs: the coordination helper serves a TCPStore from blackbox's own interpreter."""
    try:
        res = subprocess.run([sys.executable, "-c", _STORE_PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return Check("coordination", "warn", "a TCPStore round trip on 127.0.0.1 did not finish within 60 s",
                     "Multi-node jobs would run with each node on its own.")  # fmt: skip
    try:
        facts = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return Check("coordination", "warn", f"blackbox's interpreter cannot serve a TCPStore: {tail}",
                     f"Install torch beside blackbox ({sys.executable}) for multi-node coordination; without it "
                     "each node watches and collects on its own.")  # fmt: skip
    return Check("coordination", "ok", f"blackbox's interpreter serves and joins a TCPStore (torch {facts['torch']}): "
                 "multi-node supervisors can coordinate")  # fmt: skip


def check_incident_index() -> Check:
    from .incidents.store import IncidentIndex, IndexUnavailable, default_path

    path = default_path(os.environ)
    try:
        index = IncidentIndex(path)
    except IndexUnavailable as exc:
        return Check("incident-index", "warn", str(exc), "Set BLACKBOX_HOME to a writable local directory.")
    try:
        count = index.count()
    finally:
        index.close()
    return Check("incident-index", "ok", f"`{path}` holds {count} incident(s)")


def run_checks(run_dir: str, python: str, only: Optional[list[str]] = None) -> list[Check]:
    table: dict[str, Callable[[], Check]] = {
        "recorder": lambda: check_recorder(python), "run-dir": lambda: check_run_dir(run_dir),
        "signals": check_signals, "init": check_init, "py-spy": check_pyspy, "torch": lambda: check_torch(python),
        "gpu": check_gpu, "kernel-messages": check_kernel, "coordination": check_coordination,
        "incident-index": check_incident_index,
    }  # fmt: skip
    out = []
    for name in only or list(CHECKS):
        try:
            out.append(table[name]())
        except Exception as exc:  # a check that breaks is itself a finding, never a traceback
            out.append(Check(name, "fail", f"the check itself failed: {exc!r}", "Run with BLACKBOX_DEBUG=1."))
    return out


def job_python() -> str:
    """The interpreter the job will most likely use: blackbox's own when torch is installed beside it, else
    `python` on PATH (blackbox installed with pipx, the job in its own environment)."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    return shutil.which("python") or shutil.which("python3") or sys.executable
