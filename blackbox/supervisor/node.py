"""The tasks of one Slurm job step on one node (`srun blackbox run -- python train.py`, one task per GPU): one run
directory and one watch for all of them. The task that holds the node's lock (a flock on a node-local file) is the
node's supervisor: it watches every local rank's heartbeat, collects, and coordinates with the other nodes. The
others stay transparent parents of their own task (output, signals, exit code) and take the lock over at once when
its holder ends: handed over when its task ended, said aloud when it died. Also which SIGUSR1 Slurm sent: read with
its sender, a `slurmstepd` means the job's own `--signal` or `scancel --signal` (passed on), anyone else blackbox's
"collect now". Imports the stdlib and blackbox's Slurm adapter."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

from ..adapters import slurm

STALL_ENDED = "stall-ended"  # in the run directory: the node's supervisor ended the job after a stall (exit 86)
TASK_CONSOLE = "console.task%d.log"  # the output of a task that did not lead at its start (the leader's: console.log)


def this_task(env: Mapping[str, str], hostname: str) -> Optional[slurm.Task]:
    """The Slurm task this `blackbox run` is — started by srun itself, or by a non-interactive shell srun started
    (`srun bash -c 'blackbox run …'`) — else None (a batch script, an interactive `srun --pty bash`, no Slurm)."""
    task = slurm.task_of(env, hostname)
    if task is None:
        return None
    task_pid = env.get("SLURM_TASK_PID", "")
    me, parent = os.getpid(), os.getppid()
    if task_pid.isdigit():
        if int(task_pid) == me:
            return task
        return task if int(task_pid) == parent and not _interactive() else None
    return task if _comm(parent) == "slurmstepd" else None


def _interactive() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def run_dir_of(pattern: Optional[str], default_base: str, task: slurm.Task) -> str:
    """The node's run directory: `--run-dir` with Slurm's filename patterns expanded (%j job, %s step, %n node index,
    %N node name, %r requeue count, %% a percent; a requeued job's run goes in `restart<N>/` below unless %r says
    where), or by default <runs>/slurm-<job>.<step>[-r<N>]/<node name>: the same for every task of the node,
    another on every node."""
    if not pattern:
        return os.path.join(default_base, f"slurm-{task.key}", task.node)
    values = {"j": task.job_id, "s": task.step_id, "n": str(task.node_index), "N": task.node, "%": "%",
              "r": str(task.restarts)}  # fmt: skip
    path = re.sub(r"%([jsnNr%])", lambda m: values[m.group(1)], pattern)
    if task.restarts and "%r" not in pattern:  # a requeued job's run is a new run: beside, never over, the last
        path = os.path.join(path, f"restart{task.restarts}")
    return path


class NodeShare:
    """This task's membership of its node's group of tasks, and the node's lock."""

    def __init__(self, task: slurm.Task, run_dir: str) -> None:
        self.task = task
        self.run_dir = run_dir
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{task.key}-{task.node}")
        base = os.path.join(tempfile.gettempdir(), f"blackbox-{os.getuid()}-slurm-{safe}")
        self.lock_path, self.members_path = base + ".lock", base + ".members"
        self.leading = False
        self.before: dict[str, Any] = {}  # what the lock said when this task took it: its previous holder
        self._fd: Optional[int] = None
        self._members: Optional[int] = None

    # --- membership -------------------------------------------------------------------------------------------
    def join(self) -> None:
        self._members = os.open(self.members_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._members, fcntl.LOCK_SH)

    def leave(self) -> bool:
        """Leave the group; True when this task was the last one of the node (the files go then)."""
        if self._members is None:
            return True
        fd, self._members = self._members, None
        last = False
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
                for path in (self.lock_path, self.members_path):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            except BlockingIOError:
                pass
        os.close(fd)
        return last

    # --- the lock ---------------------------------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Take the node's lock if it is free: True while this task leads."""
        if self.leading:
            return True
        if self._fd is None:
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        before = self._read()
        self.before = before if before.get("run_dir") == self.run_dir else {}
        self._write("leading")
        self.leading = True
        return True

    @property
    def first(self) -> bool:
        """This task leads, and nobody led this run before it (it prepares the run directory)."""
        return self.leading and not self.before

    def took_over_from_dead(self) -> bool:
        """The previous holder died holding the lock (killed): its ranks were unwatched until now."""
        return bool(self.before) and self.before.get("state") == "leading"

    def release(self) -> None:
        """Hand the watch over (this task's own job has ended)."""
        if self._fd is None or not self.leading:
            return
        self._write("handed over")
        self.leading = False
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def holder(self) -> dict[str, Any]:
        """Who holds the lock now, as it wrote itself down."""
        return self._read()

    def _record(self, state: str) -> dict[str, Any]:
        t = self.task
        return {"pid": os.getpid(), "task": t.rank, "local_task": t.local_rank, "state": state,
                "run_dir": self.run_dir, "time": time.time()}  # fmt: skip

    def _write(self, state: str) -> None:
        fd = self._fd
        if fd is None:
            return
        data = json.dumps(self._record(state)).encode()
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.lock_path, "rb") as f:
                value = json.loads(f.read(65536) or b"{}")
            return value if isinstance(value, dict) else {}
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        self.release()
        self.leave()

    # --- the stall mark ---------------------------------------------------------------------------------------
    def mark_stall_ended(self) -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(os.path.join(self.run_dir, STALL_ENDED), os.O_WRONLY | os.O_CREAT, 0o600))

    def stall_ended(self) -> bool:
        return os.path.exists(os.path.join(self.run_dir, STALL_ENDED))


class NodeConsole:
    """The console tail a node's bundle gets: this task's own log, then every other task's, each under a header."""

    def __init__(self, own: Any, run_dir: str) -> None:
        self.own = own
        self.run_dir = run_dir

    def tail(self, limit: int) -> bytes:
        from ..safeopen import RunDir

        run = RunDir(self.run_dir, os.getuid())
        others = sorted(n for n in run.list(".") if re.fullmatch(r"console(\.task\d+)?\.log", n)
                        and os.path.join(self.run_dir, n) != getattr(self.own, "path", None))  # fmt: skip
        share = max(4096, limit // (len(others) + 1))
        parts = [self.own.tail(share if others else limit)]
        for name in others:
            with contextlib.suppress(OSError):
                parts.append(f"\n# --- {name} ---\n".encode() + run.read(name, share, tail=True))
        return b"".join(parts)


class SlurmSignals:
    """SIGUSR1 with its sender. It is blocked in every thread (call `block` before any thread starts) and read by
    one thread with sigwaitinfo; the job's own process gets it unblocked again (`unblocked`)."""

    signals = {signal.SIGUSR1}

    def __init__(self) -> None:
        self.blocked = False
        self.from_slurm: list[bool] = []  # one per SIGUSR1 received, in order: whether slurmstepd sent it

    def block(self) -> None:
        with contextlib.suppress(Exception):
            signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
            self.blocked = True

    @property
    def unblocked(self) -> set[int]:
        """The signals a child must unblock (its mask is inherited)."""
        return set(self.signals) if self.blocked else set()

    def start(self, deliver: Callable[[int], None]) -> None:
        if not self.blocked:
            return

        def wait() -> None:
            while True:
                try:
                    info = signal.sigwaitinfo(self.signals)
                except Exception:
                    return
                self.from_slurm.append(_comm(info.si_pid) == "slurmstepd")
                deliver(info.si_signo)

        threading.Thread(target=wait, name="blackbox-sigusr1", daemon=True).start()

    def sent_by_slurm(self) -> bool:
        """Whether the SIGUSR1 being handled now (the oldest not yet handled) came from Slurm."""
        return self.from_slurm.pop(0) if self.from_slurm else False
