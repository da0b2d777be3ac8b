"""The supervisor of `blackbox run`: a transparent parent that starts the launcher, forwards signals, passes the exit
code through, watches the heartbeats and acts on stalls and crashes. This module is the story of a run; its rooms
do the work: the job's processes and signals (process), watching (watch), deciding (episodes) and the evidence
(evidence), sharing one context. It never prints: it speaks through `say`.
Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Callable, Optional

from .. import __version__
from .._recorder import protocol as P
from ..adapters import gpu, host, procfs
from ..collect import delegate
from ..config import RUNS_DIR, RunConfig, working_directory
from ..coord.topology import Topology, topology
from ..detections import Trigger
from ..errors import (
    EXIT_CANT_CREATE,
    EXIT_ENDED_AFTER_TRAINING,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_STALL_ENDED,
    BlackboxError,
)
from ..events import EventLog
from ..redact import add_known_secret, add_known_secrets, redact_argv, redact_url
from ..storage.urls import add_url_secrets
from .console_log import ConsoleLogProcess
from .context import RunContext
from .episodes import Episodes
from .evidence import Evidence
from .launch import resize_ptys
from .metrics import Metrics
from .node import TASK_CONSOLE, NodeConsole, NodeShare, SlurmSignals, run_dir_of, this_task
from .process import HANDLED, JobProcess, become_subreaper, describe_status, exit_code_of, resolve_command, run_plain
from .rundir import new_run_id, prepare_run_dir
from .watch import Watch

PRESTOP_WINDOW_S = 120.0  # a SIGTERM this soon after a preStop hook's collection is the one the hook came before
RACES_TOLERATED = 3  # polls in a row cut short by a process of the job ending under it, before it counts as a bug
DUE_AFTER_S = 0.05  # the poll for a stall timeout that runs out comes this long after it (the rule asks for more)
LAUNCHER_TAIL_BYTES = 4096  # the end of the launcher's output read for its last line, when it fails before any rank
RECORD_S = 5.0  # what Slurm says of a SIGTERM it sent is asked within this, again while it refuses (its KillWait,
# 30 s by default, must leave the supervisor time to end after it: the record is joined before the run ends)


class Supervisor:
    def __init__(self, argv: list[str], cfg: RunConfig, env: Mapping[str, str], say: Callable[[str], None]):
        cwd = working_directory()
        run_id, node = new_run_id(), host.hostname()
        run_dir = os.path.abspath(cfg.run_dir or os.path.join(RUNS_DIR, run_id))
        # A task srun started: the node's tasks share one run directory and one watch (supervisor.node)
        self.task = this_task(env, node) if sys.platform.startswith("linux") else None
        self.node: Optional[NodeShare] = None
        self.usr1 = SlurmSignals()
        if self.task is not None:
            run_id, node = f"slurm-{self.task.key}", self.task.node
            run_dir = os.path.abspath(run_dir_of(cfg.run_dir, RUNS_DIR, self.task))
            self.node = NodeShare(self.task, run_dir)
        self.ctx = RunContext(argv, cfg, env, say, run_id, node, run_dir, cwd)
        self.topology: Optional[Topology] = None  # this node's place in a multi-node job (None: one node)
        self._episodes: Optional[Episodes] = None
        self.process = JobProcess(self.ctx, lambda: self.watch.rank_processes(),
                                  lambda: self._episodes.helper_pids() if self._episodes else [])  # fmt: skip
        self.watch = Watch(self.ctx, self.process)
        self.evidence = Evidence(self.ctx, self.process, self.watch)
        self.metrics: Optional[Metrics] = None
        self._wake_fd: Optional[int] = None
        self._output_ended = False  # the tee read the job's output to its end: console.log is finished, not left
        self._raced = 0  # polls in a row cut short by a process or file of the job that went away meanwhile
        self._recording: Optional[threading.Thread] = None  # a preemption's record, Slurm asked for its cause
        self._prestop_at: Optional[float] = None  # when a preStop hook's collection was taken (monotonic)

    @property
    def episodes(self) -> Episodes:
        assert self._episodes is not None
        return self._episodes

    # --- the run --------------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.ctx.close_speech()  # a refusal before the job started still says what came before it

    def _run(self) -> int:
        ctx = self.ctx
        exe = resolve_command(ctx.argv, ctx.env)
        if not sys.platform.startswith("linux"):
            ctx.say(f"cannot watch on {sys.platform} (blackbox reads /proc, which only Linux has); "
                    "running the job unwatched")  # fmt: skip
            ctx.close_speech()
            return run_plain(ctx.argv, exe)
        leading = True
        if self.node is not None:
            self.usr1.block()  # before any thread starts: SIGUSR1 is read with its sender (Slurm's is the job's)
            self.process.unblock, self.process.shared_node = self.usr1.unblocked, True
            self.node.join()
            leading = self.node.try_lead()
            ctx.watching = leading
        if leading:
            self._find_topology()
        self._episodes = Episodes(ctx, self.process, self.evidence, self.topology)
        if self.node is not None:  # the node's other tasks exit 86 too
            self._episodes.on_stall_end = self.node.mark_stall_ended
        if self.node is None or self.node.first:
            self._prepare()
        else:
            self._prepare_task()
        become_subreaper()
        try:
            with self._signals() as wakeup_fd:
                self.usr1.start(self._deliver)
                self.episodes.start_coordination(self._wake)
                self._launch(exe)
                self._loop(wakeup_fd)
                return self._finish()
        finally:
            if self.process.launched is not None:
                self.process.launched.restore_terminal()
            self.episodes.close()
            self.watch.close()
            if self.metrics is not None:
                self.metrics.close()
            if ctx.console is not None:
                ctx.console.close(wait=self._output_ended)
            ctx.close_speech()  # before the event log closes: what stderr would not take is kept there
            if ctx.events is not None:
                ctx.events.close()
            if self.node is not None:
                self.node.close()

    def _find_topology(self) -> None:
        cfg = self.ctx.cfg
        port = cfg.coord_port if isinstance(cfg.coord_port, int) else 0
        try:
            self.topology = topology(self.ctx.argv, self.ctx.env, cfg.coord, port)
        except BlackboxError as exc:  # the launcher will say what is wrong with its options; the job runs
            self.ctx.say(f"{exc.message[:-1] if exc.message.endswith('.') else exc.message}: no multi-node "
                         "coordination, this node watches and collects on its own")  # fmt: skip

    def _prepare(self) -> None:
        """The run directory and its logs, the heartbeat table, console.log's header and the start event."""
        ctx = self.ctx
        add_known_secrets(ctx.env, ctx.argv, ctx.cwd)  # the job's credentials: env, stores, config files
        if ctx.cfg.notify_url:  # a webhook URL is a credential too: only its host is ever written
            add_known_secret(ctx.cfg.notify_url)
        if ctx.cfg.upload:  # a storage URL's password and query (an Azure SAS token) too
            add_url_secrets(ctx.cfg.upload)
        ctx.run_dir = prepare_run_dir(ctx.run_dir)
        ctx.events = EventLog(os.path.join(ctx.run_dir, P.EVENTS_LOG))
        # console.log's own process is forked here, before any thread of ours exists, with every secret known
        ctx.console = ConsoleLogProcess(os.path.join(ctx.run_dir, P.CONSOLE_LOG), lambda m: ctx.say_once("console", m),
                                        max(1, ctx.cfg.console_log_max) * 1024 * 1024, ctx.say)  # fmt: skip
        ctx.start_speech()  # its thread after the fork
        self.watch.open()
        facts = self._header()
        if self.task is not None:
            facts["slurm_task"] = self.task.__dict__
            self.evidence.console = NodeConsole(ctx.console, ctx.run_dir)
        cfg = ctx.cfg
        ctx.event(
            "start", run_id=ctx.run_id, node=ctx.node, pid=os.getpid(), command=redact_argv(ctx.argv),
            cwd=ctx.cwd, blackbox_version=__version__, config={
                k: redact_url(v) if k == "notify_url" and v else v
                for k, v in ((k, getattr(cfg, k)) for k in cfg.sources)},
            config_sources=dict(cfg.sources),
            **facts,
        )  # fmt: skip
        if cfg.metrics_port:
            self._serve_metrics()

    def _serve_metrics(self) -> None:
        """--metrics-port: the collector over what each poll read (never the ranks themselves)."""
        ctx, watch = self.ctx, self.watch

        def run() -> str:
            coord = self._episodes.coord if self._episodes is not None else None
            return coord.job_id if coord is not None and coord.job_id else ctx.run_id

        node = ctx.node if self.topology is None or self.topology.node_rank is None else (
            f"{ctx.node}-node{self.topology.node_rank}")  # fmt: skip
        metrics = Metrics(ctx, run, lambda: node, lambda: watch.gpus.latest() if watch.gpus.seen_gpus else [],
                          lambda: set(watch.stragglers.active))  # fmt: skip
        try:
            if metrics.start(ctx.cfg.metrics_addr, ctx.cfg.metrics_port):
                self.metrics = metrics
                ctx.listeners.append(metrics.on_event)
        except Exception as exc:
            ctx.internal_error("metrics", exc)

    def _prepare_task(self) -> None:
        """A task of a node whose run directory another task prepared: its own console log; the watch only when it
        leads (the node's first leader died before this task started)."""
        ctx, task = self.ctx, self.task
        assert task is not None and self.node is not None
        add_known_secrets(ctx.env, ctx.argv, ctx.cwd)
        if ctx.cfg.upload:
            add_url_secrets(ctx.cfg.upload)
        try:
            for sub in ("", P.RANKS_DIR, P.BUNDLES_DIR):
                os.makedirs(os.path.join(ctx.run_dir, sub), mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BlackboxError(f"Cannot use `{ctx.run_dir}` as the run directory: {exc.strerror or exc}.",
                                hint="Pass --run-dir (or BLACKBOX_RUN_DIR) pointing at a writable directory.",
                                exit_code=EXIT_CANT_CREATE) from None  # fmt: skip
        ctx.console = ConsoleLogProcess(os.path.join(ctx.run_dir, TASK_CONSOLE % task.local_rank),
                                        lambda m: ctx.say_once("console", m),
                                        max(1, ctx.cfg.console_log_max) * 1024 * 1024, ctx.say)  # fmt: skip
        ctx.start_speech()
        if self.node.leading:
            self._take_over()

    def _take_over(self) -> None:
        """This task now watches the node's ranks: the task that did ended (handed over) or died (said aloud)."""
        ctx, node, task = self.ctx, self.node, self.task
        assert node is not None and task is not None and ctx.console is not None
        ctx.events = ctx.events or EventLog(os.path.join(ctx.run_dir, P.EVENTS_LOG))
        if self.watch.table is None:
            self.watch.open()
        self.evidence.console = NodeConsole(ctx.console, ctx.run_dir)
        self._find_topology()
        self.episodes.topology = self.topology
        ctx.watching = True
        before = node.before
        ctx.event("watch_taken", task=task.rank, pid=os.getpid(), previous_task=before.get("task"),
                  previous_pid=before.get("pid"), handed_over=not node.took_over_from_dead())  # fmt: skip
        if node.stall_ended():  # the task before ended the job after a stall: this is its teardown
            self.process.follow_node_ending()
        if node.took_over_from_dead():
            ctx.say(f"the blackbox supervisor of this node's ranks (task {before.get('task')}, pid "
                    f"{before.get('pid')}) ended without handing over; task {task.rank} (pid {os.getpid()}) "
                    "watches them now")  # fmt: skip
        if self._wake_fd is not None:
            self.episodes.start_coordination(self._wake)

    def _deliver(self, sig: int) -> None:
        """A signal read by a thread (SIGUSR1 with its sender): for the loop, as the handler would."""
        self.process.pending.append(sig)
        self._wake()

    def _header(self) -> dict[str, object]:
        """console.log's header: which host, which IP, which GPU and how hot, which code. Git and GPU
        probes run in parallel and are bounded, so a slow filesystem never delays the job by much."""
        ctx = self.ctx
        results: dict[str, object] = {}

        def probe(name: str, fn: Callable[[], object]) -> None:
            with contextlib.suppress(Exception):
                results[name] = fn()

        threads = [
            threading.Thread(target=probe, args=("git", lambda: host.git_state(ctx.cwd, 2.0)), daemon=True),
            threading.Thread(target=probe, args=("gpus", lambda: gpu.query_gpus(2.0)), daemon=True),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3.0)
        git = results.get("git")
        gpu_probe = results.get("gpus")
        gpus: list[gpu.GpuReading] = []
        gpu_how = "GPU probe timed out"
        if isinstance(gpu_probe, tuple):
            gpus, gpu_how = gpu_probe
        ips = host.ip_addresses()
        torch_version = host.package_version("torch")
        lines = [
            f"blackbox {__version__} run {ctx.run_id}",
            f"host: {ctx.node} ({', '.join(ips) or 'no non-loopback address'})",
            f"command: {' '.join(redact_argv(ctx.argv))}",
            f"cwd: {ctx.cwd}",
            f"git: {git.describe() if isinstance(git, host.GitState) else 'unknown (probe timed out)'}",
            f"torch: {torch_version or 'not installed'} (blackbox's environment)",
            f"started: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
            "gpus: " + (" | ".join(g.describe() for g in gpus) if gpus else gpu_how),
            f"run dir: {ctx.run_dir}",
        ]
        assert ctx.console is not None
        ctx.console.write(("".join(f"# {line}\n" for line in lines) + "# ---\n").encode())
        return {
            "ips": ips,
            "git": git.__dict__ if isinstance(git, host.GitState) else None,
            "torch_version": torch_version,
            "gpus": [g.__dict__ for g in gpus],
        }

    @contextlib.contextmanager
    def _signals(self) -> Iterator[int]:
        """blackbox's signal handlers, and the pipe that wakes the loop (a signal, a fatal line, another node)."""
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        self._wake_fd = wfd
        old_wakeup = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        old_handlers = {s: signal.signal(s, self.process.on_signal) for s in HANDLED}
        try:
            yield rfd
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_wakeup)
            self._wake_fd = None
            os.close(rfd)
            os.close(wfd)

    def _wake(self) -> None:
        """Wake the loop from another thread (a fatal console line, a message from the other nodes)."""
        fd = self._wake_fd
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, b"\0")

    def _launch(self, exe: str) -> None:
        try:
            launched = self.process.start(self.ctx.job_env(), [self._watch_console])
        except OSError as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            self.ctx.event("end", exit_code=code, error=str(exc))
            raise BlackboxError(f"The command `{self.ctx.argv[0]}` could not be started: {exc.strerror}.",
                                exit_code=code) from None  # fmt: skip
        self.ctx.event("launched", pid=launched.pid, executable=exe, tee_pid=launched.tee.pid if launched.tee else None)
        if launched.tee_error:
            self.ctx.say(f"{launched.tee_error}: the job's output goes straight to ours, without console.log or the "
                         "watch for fatal lines")  # fmt: skip
            self._output_ended = True

    def _watch_console(self, data: bytes, stream: int) -> None:
        """Runs in an output thread: fatal lines wake the loop at once."""
        if self.episodes.watch_console(data, stream):
            self._wake()

    # --- the loop ------------------------------------------------------------------------------------
    def _loop(self, wakeup_fd: int) -> None:
        ctx, process = self.ctx, self.process
        next_poll = time.monotonic() + min(ctx.cfg.poll_interval, 0.5)
        while True:
            process.reap(lazy=True)
            if self.node is not None and not self.node.leading and process.running and self.node.try_lead():
                self._guarded("takeover", self._take_over)
            if not process.running:
                with contextlib.suppress(Exception):  # signals acted on in the handler are still said and logged
                    self._handle_signals()
                return
            self._guarded("signals", self._handle_signals)
            self._guarded("console", lambda: self.episodes.on_console(self._poll_guarded))
            self._guarded("coordination", self.episodes.on_coordination)
            now = time.monotonic()
            if now >= next_poll:
                self._poll_guarded()
                next_poll = self._next_poll(time.monotonic())
            process.kill_when_due(now)
            deadline = next_poll if process.kill_deadline is None else min(next_poll, process.kill_deadline)
            timeout = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([wakeup_fd], [], [], timeout)
                if ready:
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        os.read(wakeup_fd, 512)

    def _next_poll(self, now: float) -> float:
        """A poll interval from now, or sooner where a rank's stall timeout runs out before (just after it)."""
        due = self.episodes.rules.due
        if due is not None and now < due + DUE_AFTER_S < now + self.ctx.cfg.poll_interval:
            return due + DUE_AFTER_S
        return now + self.ctx.cfg.poll_interval

    def _guarded(self, where: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:
            self.ctx.internal_error(where, exc)

    def _handle_signals(self) -> None:
        process = self.process
        while process.pending:
            sig = process.pending.pop(0)
            if sig == signal.SIGCHLD:
                continue
            if sig == signal.SIGWINCH:
                if process.launched is not None:
                    resize_ptys(process.launched)
                continue
            if sig == signal.SIGUSR1 and self.usr1.sent_by_slurm():  # the job's own (--signal, scancel --signal)
                self._slurm_signal(sig)
                continue
            if sig == signal.SIGUSR1 and self.node is not None and not self.node.leading:
                self._relay_to_leader(sig)
                continue
            if sig == signal.SIGUSR1 and delegate.take_request(self.ctx.run_dir) == delegate.PREEMPTION:
                self._prestop()  # `blackbox collect --preemption`: the pod's preStop hook
                continue
            if sig == signal.SIGUSR1:  # "collect now": never passed on (torchrun dies of it)
                self.ctx.event("signal", signal="SIGUSR1", action="collect")
                self.episodes.collect(Trigger("manual"), None)
                continue
            if sig == signal.SIGTERM and self.task is not None and not process.terminating:
                self._slurm_signal(sig)  # in a Slurm task: a cancel, the time limit, a preemption
                continue
            if sig == signal.SIGTERM and not process.terminating:
                self._terminated()  # a pod deleted, preempted or drained; `docker stop`; a user
                continue
            if sig == signal.SIGINT:
                process.sigints_handled += 1
                if process.sigints_handled == 2:
                    self.ctx.event("signal", signal="SIGINT", action="end job")
                    process.end_job("a second SIGINT")
                    continue
                if process.sigints_handled >= 3:
                    self.ctx.event("signal", signal="SIGINT", action="kill job")
                    self.ctx.say("third SIGINT: killing every job process now (SIGKILL)")
                    process.kill_all(signal.SIGKILL)
                    continue
                # the user's own decision: pass it on, keep no bundle, file no incident
                process.say_interrupted("SIGINT, passed on to the job")
                process.terminating = True
            if not process.terminating:
                # The launcher will now tear the ranks down: keep what they were doing first (a job that hung
                # until the scheduler's time limit is a stall nobody saw).
                process.terminating = True
                if self.ctx.watching:
                    self.episodes.collect(Trigger("signal"), None, job_ends=True)
            process.forward(sig)

    def _terminated(self) -> None:
        """SIGTERM from outside the job, not from Slurm: the job is being ended — a pod deleted, preempted or drained
        (the kubelet's SIGTERM, its grace period, then SIGKILL), `docker stop`, a user. What the ranks were doing is
        collected first, within --grace-budget (a hang nobody saw until then is still in the bundle), then the
        signal is passed on; recorded as a preemption, not an incident (no alarm; what the ranks do as they end is
        that ending). The bundle's upload goes on while the job ends."""
        ctx, process = self.ctx, self.process
        process.terminating = process.preempted = True
        budget = ctx.cfg.grace_budget
        cause = self._ending_cause()
        start = time.monotonic()
        prestop = self._prestop_at is not None and start - self._prestop_at <= PRESTOP_WINDOW_S
        ctx.event("preemption", signal="SIGTERM", cause=cause, grace_budget_s=budget, after_prestop=prestop)

        def pass_on() -> None:  # once the bundle is written: its analysis and upload go on while the job ends
            if ctx.first("sigterm:passed-on"):
                process.forward(signal.SIGTERM)
                taken = (f"evidence taken {start - self._prestop_at:.0f} s before by the preStop hook, passed on at "
                         "once" if prestop and self._prestop_at is not None else
                         f"evidence taken in {time.monotonic() - start:.1f} s (--grace-budget {budget:g}), then passed "
                         "on")  # fmt: skip
                ctx.say(f"SIGTERM: {cause}; {taken} to the job; recorded as a preemption, not an incident")

        if ctx.watching and not prestop:
            self.episodes.collect(Trigger("signal"), None, job_ends=True, budget=budget, written_then=pass_on,
                                  preemption=cause)  # fmt: skip
        pass_on()

    def _ending_cause(self) -> str:
        return ("the pod is being deleted, preempted or drained (Kubernetes)" if "KUBERNETES_SERVICE_HOST" in
                self.ctx.env else "the job is being ended from outside")  # fmt: skip

    def _prestop(self) -> None:
        """`blackbox collect --preemption`, a Kubernetes preStop hook: the pod gets its SIGTERM once the hook
        returns. The ranks' evidence is taken now, within --grace-budget, as the preemption's (no incident, no
        alarm); the SIGTERM that follows goes to the job at once, its own SIGTERM handling first."""
        ctx = self.ctx
        if self.process.terminating or not ctx.watching:
            return
        budget = ctx.cfg.grace_budget
        ctx.event("preemption", signal="preStop", cause=self._ending_cause(), grace_budget_s=budget)
        self._prestop_at = start = time.monotonic()
        self.episodes.collect(Trigger("signal", "prestop"), None, job_ends=True, budget=budget,
                              preemption=self._ending_cause())  # fmt: skip
        ctx.say(f"preStop hook: {self._ending_cause()}; evidence taken in {time.monotonic() - start:.1f} s "
                f"(--grace-budget {budget:g}); the SIGTERM that follows goes to the job at once; recorded as a "
                "preemption, not an incident")  # fmt: skip

    def _slurm_signal(self, sig: int) -> None:
        """A signal Slurm sent the job: passed on unchanged at once and recorded (by the node's supervisor) as a
        preemption, not an incident. SIGTERM: the job is being ended (scancel, time limit, preemption); SIGUSR1:
        the job's own warning (`--signal=USR1@90`), for its checkpoint handler — never torchrun's (it dies of it):
        under torchrun it goes to the ranks themselves."""
        from ..adapters import slurm, torchelastic

        ctx, process, task = self.ctx, self.process, self.task
        assert task is not None and process.launched is not None
        name = signal.Signals(sig).name
        if sig == signal.SIGUSR1:
            launcher = process.launched.pid
            targets = procfs.children(launcher) if torchelastic.is_launcher(ctx.argv) else [launcher]
            for pid in targets:
                st = procfs.proc_stat(pid)
                if st is not None:
                    procfs.signal_if_same(pid, st.start_ticks, sig)
            to = f"the ranks (pids {', '.join(map(str, targets))})" if targets != [launcher] else "the job"
        else:
            process.terminating = process.preempted = True
            process.forward(sig)
            to = "the job"
        if not ctx.watching:
            return

        def record() -> None:  # asked at once: Slurm sets why before it signals (the state stays COMPLETING)
            deadline = time.monotonic() + RECORD_S
            facts, how = slurm.ask_job(task.job_id, deadline, ctx.env)  # again while a busy controller refuses
            cause: Optional[str] = None
            why: Optional[str] = None
            if sig == signal.SIGUSR1:
                what = f"Slurm sent {name} to job {task.job_id} (its --signal warning, or scancel --signal)"
            else:
                cause, why = slurm.ending(facts, task.restarts) if facts is not None else (slurm.UNKNOWN, how)
                if cause == slurm.UNKNOWN and facts is not None and facts.get("state") == "COMPLETING":
                    states = slurm.ask_job_states(task.job_id, deadline, ctx.env)
                    if states:  # Slurm 23.11 and later say the state underneath
                        facts["states"] = states
                        cause, why = slurm.ending(facts, task.restarts)
                what = (f"Slurm is ending job {task.job_id} ({cause})" if cause != slurm.UNKNOWN else
                        f"Slurm sent {name} to job {task.job_id} (why, it does not say: {why})")  # fmt: skip
            ctx.event("preemption", signal=name, job_id=task.job_id, step_id=task.step_id, cause=cause,
                      cause_source=why, passed_to=to, slurm=facts, slurm_source=how)  # fmt: skip
            ctx.say(f"{what}: {name} passed on to {to}; recorded as a preemption, not an incident")

        self._recording = threading.Thread(target=record, name="blackbox-preemption", daemon=True)
        self._recording.start()

    def _relay_to_leader(self, sig: int) -> None:
        """ "Collect now" on a task that does not watch the node: the node's supervisor collects."""
        assert self.node is not None
        pid = self.node.holder().get("pid")
        if isinstance(pid, int) and pid > 0 and pid != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def _poll_guarded(self) -> None:
        """One poll; a bug stops the watch (a broken watch must never end a job), said once. A process or file of
        the job that went away while the poll read it (ESRCH, ENOENT: a rank exiting) skips this poll only, with
        an event: the next reads again; RACES_TOLERATED in a row are a bug like any other."""
        if not self.ctx.watching:
            return
        try:
            self._poll()
            self._raced = 0
        except (ProcessLookupError, FileNotFoundError) as exc:
            self._raced += 1
            if self._raced < RACES_TOLERATED:
                self.ctx.event("poll_skipped", error=repr(exc), traceback=traceback.format_exc())
                return
            self.ctx.watching = False
            self.ctx.internal_error("watch", exc)
        except Exception as exc:
            self.ctx.watching = False
            self.ctx.internal_error("watch", exc)

    def _poll(self) -> None:
        now = time.monotonic()
        views = self.watch.read_views()
        metrics = self.metrics
        if metrics is not None:  # a failure here is the metrics', never the watch's
            self._guarded("metrics", lambda: metrics.update(views, now))
        self.episodes.evaluate(views, now)
        self.episodes.publish(views, now)
        self.watch.launcher_waits(views, now)
        idle = self.watch.watch_gpus(views, now)
        if idle is not None:
            self.episodes.act(idle)
        self.watch.watch_stragglers(views, now)
        self.watch.status_due(views, now)

    # --- the end ---------------------------------------------------------------------------------------
    def _launcher_failed(self, code: int) -> None:
        """The launcher exited non-zero before it started any process (a bad option, a missing script): one line
        that quotes the last line it printed, and no bundle (there is no rank to read)."""
        console = self.ctx.console
        tail = console.tail(LAUNCHER_TAIL_BYTES).decode("utf-8", "replace") if console is not None else ""
        last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
        self.ctx.event("launcher_failed", exit_code=code, last_line=last[:500])
        said = f", its last line: {last[:300]}" if last else ", printing nothing"
        self.ctx.say(f"the launcher exited with code {code} before any rank started{said} (no bundle: there is no "
                     "rank to read)")  # fmt: skip

    def _finish(self) -> int:
        ctx, process = self.ctx, self.process
        assert process.launched is not None and process.launcher_status is not None
        status = process.launcher_status
        code = exit_code_of(status)
        died_of_signal = os.waitstatus_to_exitcode(status) < 0
        if died_of_signal and process.ending_since is None:
            process.end_survivors(f"the launcher (pid {process.launched.pid}) {describe_status(status)}", False)
        elif process.ending_since is not None:
            process.end_survivors("the job is being ended")
        # the last words of the job reach console.log before any bundle (unless something of the job still holds
        # its output open: the tee and console.log's process then go on carrying it after we are gone)
        self._output_ended = process.launched.join_output(2.0)
        if ctx.console is not None:
            ctx.console.flush_pending()
        if ctx.watching:
            with contextlib.suppress(Exception):
                self._poll_guarded()  # deaths at the very end still get their record
        asked = process.interrupted or process.preempted or process.ending_since is not None  # an end asked for
        if code != 0 and not ctx.bundles and ctx.watching and not asked:
            if self.watch.known or self.watch.spawned:
                self.episodes.collect(Trigger("exit"), None)
            else:  # it started no process (a bad option, say): nothing to collect, its own words say why
                self._launcher_failed(code)
        self.evidence.finish()
        if self._recording is not None:
            self._recording.join(RECORD_S + 1.0)
        stall_ended = self.node is not None and code != 0 and self.node.stall_ended()  # by the node's supervisor
        ended = EXIT_ENDED_AFTER_TRAINING if self.episodes.after_training else EXIT_STALL_ENDED
        final = ended if self.episodes.ended_after_stall or stall_ended else code
        event = "end"
        if self.node is not None:  # the watch passes to another task of the node; the last one out ends the run
            self.episodes.close()
            self.node.release()
            if not self.node.leave():
                event = "task_end"
            if ctx.events is None:  # a task that never watched: its end is in the run's log too
                ctx.events = EventLog(os.path.join(ctx.run_dir, P.EVENTS_LOG))
        ctx.event(event, launcher_status=describe_status(status), job_exit_code=code, exit_code=final,
                  bundles=ctx.bundles, **({"task": self.task.rank} if self.task is not None else {}))  # fmt: skip
        return final
