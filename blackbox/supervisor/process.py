"""The job's processes: the launcher started in its own process group, the signals blackbox receives (counted at
once in the handler, acted on by the run's loop), the exit of the launcher and of any orphan reaped (blackbox is a
child subreaper), and the job ended — SIGTERM, grace, SIGKILL — when blackbox ends it. Only processes of the job
are ever signalled: blackbox's descendants and the ranks whose heartbeats it reads, pid and start time checked.
Imports the stdlib, blackbox's /proc adapter, errors and the launch and alert modules."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from typing import Callable, Optional

from .. import alerts
from ..adapters import procfs
from ..errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, BlackboxError
from .context import RunContext
from .launch import Launched, Sink, spawn

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # passed on to the launcher
HANDLED = (*FORWARDED, signal.SIGUSR1, signal.SIGCHLD, signal.SIGWINCH)
_PR_SET_CHILD_SUBREAPER = 36
CHILDREN_SCAN_S = 5.0  # the loop lists our children at least this often, SIGCHLD or not


def resolve_command(argv: list[str], env: Mapping[str, str]) -> str:
    """The executable the job will run, or a BlackboxError that says why it cannot be run."""
    if not argv:
        raise BlackboxError(
            "No command given: put the job's command line after `--`.",
            hint="For example: blackbox run -- torchrun --nproc-per-node 8 train.py",
        )
    cmd = argv[0]
    if os.sep in cmd:
        if not os.path.exists(cmd):
            raise BlackboxError(f"The command `{cmd}` does not exist.", exit_code=EXIT_NOT_FOUND)
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            raise BlackboxError(
                f"The command `{cmd}` is not executable.",
                hint=f"chmod +x {cmd}, or run it through its interpreter (python {cmd}).",
                exit_code=EXIT_NOT_EXECUTABLE,
            )
        return cmd
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        raise BlackboxError(
            f"The command `{cmd}` was not found on PATH.",
            hint="Check the spelling, or activate the environment that provides it.",
            exit_code=EXIT_NOT_FOUND,
        )
    return found


def exit_code_of(status: int) -> int:
    """The code a shell reports for a wait status: the exit code, or 128+N for a death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def describe_status(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"died of signal {-code} ({signame(-code)})"
    return f"exited with code {code}"


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def become_subreaper() -> None:
    """Orphaned ranks (the launcher died) are handed to us instead of init, so we can find and end them."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def run_plain(argv: list[str], exe: str) -> int:
    """The job without blackbox (where it cannot watch): its exit code as a shell reports it."""
    import subprocess

    proc = subprocess.Popen([exe, *argv[1:]])
    while True:
        try:
            proc.wait()
            break
        except KeyboardInterrupt:
            continue
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


class JobProcess:
    """The launcher and the processes of the job. `ranks` gives (pid, start ticks) of the ranks whose heartbeats
    were read (they may have left blackbox's tree: torchrun starts each in a session of its own); `helpers` the pids
    of blackbox's own helper processes, which are never the job's."""

    def __init__(self, ctx: RunContext, ranks: Callable[[], Iterable[tuple[int, int]]],
                 helpers: Callable[[], Iterable[int]]) -> None:  # fmt: skip
        self.ctx = ctx
        self._ranks = ranks
        self._helpers = helpers
        self.launched: Optional[Launched] = None
        self.launcher_status: Optional[int] = None  # its wait status, once reaped
        self.reaped: dict[int, str] = {}  # pid -> how it ended, for job processes reaped as subreaper
        self.pending: list[int] = []  # signals received, for the loop to act on
        self._children_due = True  # a SIGCHLD came since our children were last listed
        self._children_at = 0.0  # when they were last listed (CLOCK_MONOTONIC)
        self.sigints = 0  # SIGINTs received (counted in the handler, which acts on the 2nd and 3rd at once)
        self.sigints_handled = 0  # ... and those the loop has said and logged
        self.terminating = False  # a termination signal was passed on, or blackbox is ending the job
        self.ending_since: Optional[float] = None  # blackbox is ending the job (SIGTERM sent at this time)
        self.kill_deadline: Optional[float] = None
        self.interrupted = False  # the user interrupted the job (Ctrl-C): what follows is no incident
        self.preempted = False  # Slurm is ending the job (cancel, time limit, preemption): what follows is no incident
        self.shared_node = False  # a Slurm task sharing its node's watch: the ranks read are mostly other tasks'
        self.unblock: set[int] = set()  # signals blackbox blocks, unblocked for the job

    # --- starting -------------------------------------------------------------------------------------
    def start(self, env: Mapping[str, str], watchers: list[Sink]) -> Launched:
        """Start the launcher; OSError (ENOENT, EACCES) as exec reports it."""
        assert self.ctx.console is not None
        self.launched = spawn(self.ctx.argv, env, self.ctx.console, watchers, self.unblock)
        return self.launched

    @property
    def running(self) -> bool:
        return self.launcher_status is None

    # --- signals ----------------------------------------------------------------------------------------
    def on_signal(self, signum: int, frame: object) -> None:
        """The signal handler. A second and third SIGINT act here, at once: the loop may be inside a collection
        (seconds) and a user pressing Ctrl-C again wants the job gone now. Only signals are sent here; the loop
        says and logs it."""
        if signum == signal.SIGINT:
            self.sigints += 1
            try:
                if self.sigints == 2 and self.launched is not None and self.launcher_status is None:
                    os.kill(self.launched.pid, signal.SIGTERM)
                elif self.sigints >= 3:
                    self.kill_all(signal.SIGKILL)
            except Exception:
                pass  # the loop's own handling follows
        if signum == signal.SIGCHLD:
            self._children_due = True
        self.pending.append(signum)

    def forward(self, sig: int) -> None:
        """Pass a termination signal on to the launcher, which passes it on to the ranks."""
        assert self.launched is not None
        if self.launcher_status is None:
            with contextlib.suppress(OSError):
                os.kill(self.launched.pid, sig)
            self.ctx.event("signal", signal=signame(sig), action=f"forwarded to the launcher (pid {self.launched.pid})")

    def say_interrupted(self, how: str = "Ctrl-C") -> None:
        if not self.interrupted:
            self.interrupted = True
            self.ctx.event("interrupted", how=how)
            self.ctx.say(
                f"interrupted ({how}): your decision, so no bundle and no incident (send SIGUSR1 to blackbox "
                "first to keep one)"
            )

    # --- reaping ----------------------------------------------------------------------------------------
    def reap(self, lazy: bool = False) -> None:
        """Collect the exit of the launcher and of any orphaned job process that was handed to us. Each child
        is waited for by pid: the alert commands and the coordination helper are reaped by their own owners,
        which read their exit codes. `lazy` (the loop, several times a second): our children are listed only after
        a SIGCHLD, and every CHILDREN_SCAN_S in case one was missed; the launcher is waited for every time."""
        now = time.monotonic()
        pids: set[int] = set()
        if not lazy or self._children_due or now - self._children_at >= CHILDREN_SCAN_S:
            self._children_due, self._children_at = False, now  # before the listing: a SIGCHLD during it counts
            pids.update(procfs.children(os.getpid()))
        if self.launched is not None:  # whatever /proc says, the launcher is always waited for
            pids.add(self.launched.pid)
        for pid in sorted(pids):
            if self.not_the_jobs(pid):
                continue
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except (ChildProcessError, InterruptedError):
                continue
            if got == 0:
                continue
            if self.launched is not None and pid == self.launched.pid:
                self.launcher_status = status
                self.launched.popen.returncode = os.waitstatus_to_exitcode(status)
            else:
                self.reaped[pid] = describe_status(status)

    def exit_status(self, pid: int) -> Optional[str]:
        """How a job process ended, where blackbox reaped it (the launcher included); None while it runs."""
        status = self.reaped.get(pid)
        if status is None and self.launched is not None and pid == self.launched.pid:
            status = None if self.launcher_status is None else describe_status(self.launcher_status)
        return status

    # --- which processes are the job's ------------------------------------------------------------------
    def job_processes(self, all_ranks: bool = True) -> list[tuple[int, int]]:
        """(pid, start ticks) of every live process of the job: our descendants (orphans are handed to us, a
        subreaper) and the ranks whose heartbeats we read (with `all_ranks` False, on a node shared by several Slurm
        tasks, our own descendants only: the other tasks' ranks are theirs). Nothing else is ever signalled."""
        procs: dict[int, int] = {}
        for pid in procfs.descendants(os.getpid()):
            if self.not_the_jobs(pid):
                continue
            st = procfs.proc_stat(pid)
            if st is not None:
                procs[pid] = st.start_ticks
        for pid, ticks in self._ranks() if all_ranks or not self.shared_node else ():
            if procfs.is_alive(pid, ticks):
                procs[pid] = ticks
        return sorted(procs.items())

    def not_the_jobs(self, pid: int) -> bool:
        """blackbox's own helpers: the coordination helper, and the --on-incident commands with what they
        started (each runs in a session of its own)."""
        if pid in set(self._helpers()) or pid in self.output_pids():
            return True
        with alerts.SESSIONS_LOCK:
            sessions = set(alerts.SESSIONS)
        if not sessions:
            return False
        try:
            return pid in sessions or os.getsid(pid) in sessions
        except OSError:
            return False

    def output_pids(self) -> list[int]:
        """blackbox's processes that carry the job's output: the tee and console.log's writer."""
        pids = list(self.launched.helper_pids) if self.launched is not None else []
        console = self.ctx.console
        return pids + ([console.pid] if console is not None else [])

    # --- ending -----------------------------------------------------------------------------------------
    def end_job(self, reason: str) -> None:
        """SIGTERM to the launcher now, SIGKILL to every job process after the grace period (the loop's)."""
        if self.ending_since is not None:
            return
        assert self.launched is not None
        self._ending_now()
        self.ctx.say(f"ending the job ({reason}): SIGTERM to the launcher (pid {self.launched.pid}), "
                     f"SIGKILL to every job process after {self.ctx.cfg.kill_grace:g} s")  # fmt: skip
        self.ctx.event("end_job", reason=reason)
        if self.launcher_status is None:
            with contextlib.suppress(OSError):
                os.kill(self.launched.pid, signal.SIGTERM)
        if self.shared_node:  # the node's other tasks' ranks: their own blackbox passes their exit on
            mine = set(procfs.descendants(os.getpid()))
            for pid, ticks in self._ranks():
                if pid not in mine:
                    procfs.signal_if_same(pid, ticks, signal.SIGTERM)

    def follow_node_ending(self) -> None:
        """The task that watched this node ended the job after a stall, took its evidence and handed the watch over
        (Slurm, one supervisor per node): this task's ranks dying now are that ending, not a new incident, and one
        still alive after the grace period is killed, as the task that ended the job would have."""
        if self.ending_since is not None:
            return
        self._ending_now()
        self.ctx.event("end_job", reason="the node's supervisor ended the job after a stall", followed=True)

    def _ending_now(self) -> None:
        """From now the job is being ended: what dies is that ending, and what lives past the grace period is killed."""
        self.ending_since = time.monotonic()
        self.terminating = True
        self.kill_deadline = self.ending_since + self.ctx.cfg.kill_grace

    def kill_when_due(self, now: float) -> None:
        """The grace period after blackbox's SIGTERM is over: SIGKILL to every job process."""
        if self.kill_deadline is not None and now >= self.kill_deadline:
            self.kill_deadline = None
            self.ctx.say(f"the job did not end within {self.ctx.cfg.kill_grace:g} s of SIGTERM: killing it (SIGKILL)")
            self.ctx.event("kill", reason="grace period over")
            self.kill_all(signal.SIGKILL)

    def kill_all(self, sig: int) -> None:
        for pid, ticks in self.job_processes():
            procfs.signal_if_same(pid, ticks, sig)

    def end_survivors(self, why: str, all_ranks: bool = True) -> None:
        """Job processes left behind when the launcher is gone (it died of a signal, or the job is being ended)."""
        survivors = self.job_processes(all_ranks)
        if not survivors:
            return
        self.ctx.say(f"{why}; ending {len(survivors)} job process(es) left behind: pids "
                     + ", ".join(str(p) for p, _ in survivors))  # fmt: skip
        self.ctx.event("end_survivors", reason=why, pids=[p for p, _ in survivors])
        for pid, ticks in survivors:
            procfs.signal_if_same(pid, ticks, signal.SIGTERM)
        deadline = time.monotonic() + self.ctx.cfg.kill_grace
        while time.monotonic() < deadline:
            self.reap()
            if not any(procfs.is_alive(p, t) for p, t in survivors):
                return
            time.sleep(0.05)
        for pid, ticks in survivors:
            procfs.signal_if_same(pid, ticks, signal.SIGKILL)
        self.reap()
