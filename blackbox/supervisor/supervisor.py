"""The supervisor of `blackbox run`: a transparent parent that starts the launcher, forwards signals, passes
the exit code through, watches heartbeats and acts on stalls. It never prints: it speaks through `say`.
Imports the stdlib, psutil (through adapters) and blackbox's host side."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Optional

from .. import __version__, alerts
from .._recorder import protocol as P
from ..adapters import gpu, host, procfs
from ..alerts import Alerts
from ..analyze.model import Report
from ..bundle.writer import Written
from ..collect.collector import CollectOptions, Collector
from ..collect.job import Job, RankTarget, job_python
from ..config import RunConfig
from ..coord.client import Coordination
from ..coord.topology import Topology, topology
from ..detections import CRASH_RULES, HANG_RULES, Detection, Trigger, incident_kind
from ..errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_STALL_ENDED, BlackboxError
from ..events import EventLog
from ..heartbeat import HeartbeatState, HeartbeatTable
from ..redact import redact_argv, redact_text, redact_url, remember_secrets, remember_value
from ..render import printable
from .gpuwatch import GpuWatch
from .launch import ConsoleLog, Launched, resize_ptys, spawn
from .rules import FatalLines, RankView, Rules
from .setup import (
    INJECT_DIR,
    become_subreaper,
    describe_status,
    exit_code_of,
    flight_recorder_env,
    new_run_id,
    prepare_run_dir,
    resolve_command,
    run_plain,
    signame,
)

if TYPE_CHECKING:
    from ..intake import Intake

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HANDLED = (*_FORWARDED, signal.SIGUSR1, signal.SIGCHLD, signal.SIGWINCH)
HISTORY_SAMPLES = 2000  # per rank: the last changes of step, phase or state kept for the report's timeline
CRASH_WINDOW_S = 60.0  # after a crash was collected, further deaths within this window are the same episode


class Supervisor:
    def __init__(self, argv: list[str], cfg: RunConfig, env: Mapping[str, str], say: Callable[[str], None]):
        self.argv = list(argv)
        self.cfg = cfg
        self.env = dict(env)
        self._say = say
        self.run_id = new_run_id()
        self.node = host.hostname()
        self.run_dir = os.path.abspath(cfg.run_dir or os.path.join("blackbox-runs", self.run_id))
        self.events: Optional[EventLog] = None
        self.console: Optional[ConsoleLog] = None
        self.launched: Optional[Launched] = None
        self.launcher_status: Optional[int] = None
        self.reaped: dict[int, str] = {}  # pid -> how it ended, for job processes we reaped as subreaper
        self.known: dict[tuple[int, int], HeartbeatState] = {}  # (rank, pid) -> last reading
        self.stepped: set[tuple[int, int]] = set()
        self.watching = True
        self.ended_after_stall = False
        self.terminating = False  # a termination signal was passed on, or blackbox is ending the job
        self.ending_since: Optional[float] = None
        self.kill_deadline: Optional[float] = None
        self.sigints = 0  # SIGINTs received (counted in the handler, which acts on the 2nd and 3rd at once)
        self._sigints_handled = 0  # ... and those the loop has said and logged
        self.interrupted = False  # the user interrupted the job (Ctrl-C): what follows is no incident
        self.bundles: list[str] = []
        self._pending: list[int] = []
        self._rules = Rules(cfg)
        self._table: Optional[HeartbeatTable] = None
        self._said_once: set[str] = set()
        self.history: dict[int, deque[dict[str, object]]] = {}  # rank -> recent changes (for the report)
        self._fatal = FatalLines()
        self._console_hits: list[tuple[str, str]] = []  # appended by the output threads, taken by the loop
        self._console_kinds: set[str] = set()  # fatal-line kinds already acted on
        self._wake_fd: Optional[int] = None
        self._last_crash: Optional[tuple[float, str]] = None  # (when, bundle) of the last crash collection
        self._alerts = Alerts(cfg.on_incident, cfg.notify_url, self.event, self.say_once)
        self._gpus = GpuWatch()
        self._gpu_idle_said = False
        self._status_at: Optional[float] = None  # when the next status line is due
        self._status_steps: dict[int, tuple[float, int]] = {}  # rank -> (time, step) at the last status line
        self._topology: Optional[Topology] = None  # this node's place in a multi-node job (None: one node)
        self._coord: Optional[Coordination] = None
        self._incidents: dict[str, str] = {}  # incident id -> the bundle this node wrote for it
        self._local_incidents = 0
        self._intakes: list[Intake] = []  # bundles taken in, whose index may still be written

    # --- speaking -------------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        with contextlib.suppress(Exception):
            self._say(message)

    def say_once(self, key: str, message: str) -> None:
        if key not in self._said_once:
            self._said_once.add(key)
            self.say(message)

    def event(self, name: str, **fields: object) -> None:
        if self.events is not None:
            self.events.write(name, **fields)

    # --- the run --------------------------------------------------------------------------------------
    def run(self) -> int:
        exe = resolve_command(self.argv, self.env)
        if not sys.platform.startswith("linux"):
            self.say(f"cannot watch on {sys.platform} (blackbox reads /proc, which only Linux has); "
                     "running the job unwatched")  # fmt: skip
            return run_plain(self.argv, exe)
        port = self.cfg.coord_port if isinstance(self.cfg.coord_port, int) else 0
        try:
            self._topology = topology(self.argv, self.env, self.cfg.coord, port)
        except BlackboxError as exc:  # the launcher will say what is wrong with its options; the job runs
            self.say(f"{exc.message[:-1] if exc.message.endswith('.') else exc.message}: no multi-node "
                     "coordination, this node watches and collects on its own")  # fmt: skip
        remember_secrets(self.env)  # the job's credentials, scrubbed from everything blackbox writes
        if self.cfg.notify_url:  # a webhook URL is a credential too: only its host is ever written
            remember_value(self.cfg.notify_url)
        self.run_dir = prepare_run_dir(self.run_dir)
        self.events = EventLog(os.path.join(self.run_dir, P.EVENTS_LOG))
        self.console = ConsoleLog(os.path.join(self.run_dir, P.CONSOLE_LOG), lambda m: self.say_once("console", m),
                                  max(1, self.cfg.console_log_max) * 1024 * 1024)  # fmt: skip
        self._table = HeartbeatTable(os.path.join(self.run_dir, P.RANKS_DIR), self._heartbeat_error)
        facts = self._header()
        self.event(
            "start", run_id=self.run_id, node=self.node, pid=os.getpid(), command=redact_argv(self.argv),
            cwd=os.getcwd(), blackbox_version=__version__, config={
                k: redact_url(v) if k == "notify_url" and v else v
                for k, v in ((k, getattr(self.cfg, k)) for k in self.cfg.sources)},
            config_sources=dict(self.cfg.sources),
            **facts,
        )  # fmt: skip
        become_subreaper()
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        self._wake_fd = wfd
        old_wakeup = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        old_handlers = {s: signal.signal(s, self._on_signal) for s in _HANDLED}
        try:
            self._start_coordination()
            try:
                self.launched = spawn(self.argv, self._job_env(), self.console, [self._watch_console])
            except OSError as exc:
                code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
                self.event("end", exit_code=code, error=str(exc))
                raise BlackboxError(f"The command `{self.argv[0]}` could not be started: {exc.strerror}.",
                                    exit_code=code) from None  # fmt: skip
            self.event("launched", pid=self.launched.pid, executable=exe)
            self._loop(rfd)
            return self._finish()
        finally:
            if self.launched is not None:
                self.launched.restore_terminal()
            for s, h in old_handlers.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_wakeup)
            self._wake_fd = None
            os.close(rfd)
            os.close(wfd)
            if self._coord is not None:
                self._coord.close()
            if self._table is not None:
                self._table.close()
            if self.console is not None:
                self.console.close()
            if self.events is not None:
                self.events.close()

    def _job_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.pop(P.ENV_RECORDER, None)  # blackbox run inside a rank: the job's ranks are ranks of their own
        pythonpath = env.get("PYTHONPATH")
        env["PYTHONPATH"] = INJECT_DIR + (os.pathsep + pythonpath if pythonpath else "")
        env[P.ENV_RUN_DIR] = self.run_dir
        env[P.ENV_RUN_ID] = self.run_id
        if self.cfg.cuda_memory_history:
            env[P.ENV_CUDA_MEMORY_HISTORY] = str(self.cfg.cuda_memory_history)
        env.update(flight_recorder_env(self.run_dir, env))
        return env

    def _header(self) -> dict[str, object]:
        """console.log's header: which host, which IP, which GPU and how hot, which code. Git and GPU
        probes run in parallel and are bounded, so a slow filesystem never delays the job by much."""
        results: dict[str, object] = {}

        def probe(name: str, fn: Callable[[], object]) -> None:
            with contextlib.suppress(Exception):
                results[name] = fn()

        threads = [
            threading.Thread(target=probe, args=("git", lambda: host.git_state(os.getcwd(), 2.0)), daemon=True),
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
            f"blackbox {__version__} run {self.run_id}",
            f"host: {self.node} ({', '.join(ips) or 'no non-loopback address'})",
            f"command: {' '.join(redact_argv(self.argv))}",
            f"cwd: {os.getcwd()}",
            f"git: {git.describe() if isinstance(git, host.GitState) else 'unknown (probe timed out)'}",
            f"torch: {torch_version or 'not installed'} (blackbox's environment)",
            f"started: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
            "gpus: " + (" | ".join(g.describe() for g in gpus) if gpus else gpu_how),
            f"run dir: {self.run_dir}",
        ]
        assert self.console is not None
        self.console.write(("".join(f"# {line}\n" for line in lines) + "# ---\n").encode())
        return {
            "ips": ips,
            "git": git.__dict__ if isinstance(git, host.GitState) else None,
            "torch_version": torch_version,
            "gpus": [g.__dict__ for g in gpus],
        }

    # --- signals ----------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            # Counted and acted on here, at once: the main loop may be inside a collection (seconds) and a user
            # pressing Ctrl-C again wants the job gone now. Only signals are sent here; the loop says and logs it.
            self.sigints += 1
            try:
                if self.sigints == 2 and self.launched is not None and self.launcher_status is None:
                    os.kill(self.launched.pid, signal.SIGTERM)
                elif self.sigints >= 3:
                    self._kill_all(signal.SIGKILL)
            except Exception:
                pass  # the loop's own handling follows
        self._pending.append(signum)

    def _handle_signals(self) -> None:
        while self._pending:
            sig = self._pending.pop(0)
            if sig == signal.SIGCHLD:
                continue
            if sig == signal.SIGWINCH:
                if self.launched is not None:
                    resize_ptys(self.launched)
                continue
            if sig == signal.SIGUSR1:  # "collect now": never passed on (torchrun dies of it)
                self.event("signal", signal="SIGUSR1", action="collect")
                self._collect(Trigger("manual"), None)
                continue
            if sig == signal.SIGINT:
                self._sigints_handled += 1
                handled = self._sigints_handled
                if handled == 2:
                    self.event("signal", signal="SIGINT", action="end job")
                    self._end_job("a second SIGINT")
                    continue
                if handled >= 3:
                    self.event("signal", signal="SIGINT", action="kill job")
                    self.say("third SIGINT: killing every job process now (SIGKILL)")
                    self._kill_all(signal.SIGKILL)
                    continue
            self._forward(sig)

    def _forward(self, sig: int) -> None:
        assert self.launched is not None
        if sig == signal.SIGINT:  # the user's own decision: pass it on, keep no bundle, file no incident
            self._say_interrupted("SIGINT, passed on to the job")
            self.terminating = True
        if not self.terminating:
            # The launcher will now tear the ranks down: keep what they were doing first (a job that hung
            # until the scheduler's time limit is a stall nobody saw).
            self.terminating = True
            self._collect(Trigger("signal"), None, job_ends=True)
        if self.launcher_status is None:
            with contextlib.suppress(OSError):
                os.kill(self.launched.pid, sig)
            self.event("signal", signal=signame(sig), action=f"forwarded to the launcher (pid {self.launched.pid})")

    # --- the loop ------------------------------------------------------------------------------------
    def _loop(self, wakeup_fd: int) -> None:
        next_poll = time.monotonic() + min(self.cfg.poll_interval, 0.5)
        while True:
            self._reap()
            if self.launcher_status is not None:
                with contextlib.suppress(Exception):  # signals acted on in the handler are still said and logged
                    self._handle_signals()
                return
            try:
                self._handle_signals()
            except Exception as exc:
                self._internal_error("signals", exc)
            if self._console_hits:
                try:
                    self._handle_console()
                except Exception as exc:
                    self._internal_error("console", exc)
            if self._coord is not None:
                try:
                    self._handle_coordination()
                except Exception as exc:
                    self._internal_error("coordination", exc)
            now = time.monotonic()
            if now >= next_poll:
                self._poll_guarded()
                next_poll = time.monotonic() + self.cfg.poll_interval
            if self.kill_deadline is not None and now >= self.kill_deadline:
                self.kill_deadline = None
                self.say(f"the job did not end within {self.cfg.kill_grace:g} s of SIGTERM: killing it (SIGKILL)")
                self.event("kill", reason="grace period over")
                self._kill_all(signal.SIGKILL)
            deadline = next_poll if self.kill_deadline is None else min(next_poll, self.kill_deadline)
            timeout = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([wakeup_fd], [], [], timeout)
                if ready:
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        os.read(wakeup_fd, 512)

    # --- fatal console lines ------------------------------------------------------------------------------
    def _watch_console(self, data: bytes, stream: int) -> None:
        """Runs in an output thread: note fatal lines and wake the loop at once."""
        hits = self._fatal.feed(data, stream)
        if hits:
            self._console_hits.extend(hits)
            self._wake()

    def _wake(self) -> None:
        """Wake the loop from another thread (a fatal console line, a message from the other nodes)."""
        fd = self._wake_fd
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, b"\0")

    def _handle_console(self) -> None:
        hits, self._console_hits[:] = list(self._console_hits), []
        for kind, line in hits:
            if kind in self._console_kinds:
                continue
            self._console_kinds.add(kind)
            self.event("fatal_line", kind=kind, line=redact_text(line))
            if kind == "exception":
                self._poll_guarded()  # the recorder marks the rank before the traceback is printed
                continue
            if not self.watching or self.ending_since is not None:
                continue
            d = Detection("console", (), f"the job printed `{redact_text(line)[:200]}`", ())
            if self._crash_collected_recently(d):
                continue
            self.say(d.message())
            self._collect(Trigger("console", kind), d)

    def _recent_crash(self) -> Optional[tuple[float, str]]:
        """(seconds ago, bundle) of a crash collected within the episode window, else None."""
        if self._last_crash is None or time.monotonic() - self._last_crash[0] > CRASH_WINDOW_S:
            return None
        return time.monotonic() - self._last_crash[0], self._last_crash[1]

    def _crash_collected_recently(self, d: Detection) -> bool:
        """A crash was just collected: what follows (the launcher tearing the other ranks down, their
        errors) is the same episode. Record it; do not bundle it again."""
        recent = self._recent_crash()
        if recent is None:
            return False
        ago, bundle = recent
        self.event("same_episode", rule=d.rule, ranks=list(d.ranks), reason=d.reason, bundle=bundle)
        if d.rule != "console":
            self.say(f"{d.message()} (same episode: evidence collected {ago:.0f} s ago)")
        return True

    def _reap(self) -> None:
        """Collect the exit of the launcher and of any orphaned job process that was handed to us. Each child
        is waited for by pid: the alert commands and the coordination helper are reaped by their own owners,
        which read their exit codes."""
        pids = set(procfs.children(os.getpid()))
        if self.launched is not None:  # whatever /proc says, the launcher is always waited for
            pids.add(self.launched.pid)
        for pid in sorted(pids):
            if self._not_the_jobs(pid):
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

    def _poll_guarded(self) -> None:
        if not self.watching:
            return
        try:
            self._poll()
        except Exception as exc:
            self.watching = False
            self._internal_error("watch", exc)

    def _internal_error(self, where: str, exc: BaseException) -> None:
        self.event("error", where=where, error=repr(exc), traceback=traceback.format_exc())
        self.say_once(
            f"internal:{where}",
            f"internal error while {'watching' if where == 'watch' else 'handling ' + where}: {exc!r}; "
            "the job goes on" + (" unwatched" if where == "watch" else "") + " (details in events.jsonl)",
        )

    def _heartbeat_error(self, path: str, message: str) -> None:
        self.event("heartbeat_error", path=path, error=message)

    def read_views(self) -> list[RankView]:
        assert self._table is not None
        views = []
        for hb in self._table.read():
            key = (hb.rank, hb.pid)
            if key not in self.known:
                self.event("rank_start", rank=hb.rank, pid=hb.pid, local_rank=hb.local_rank,
                           world_size=hb.world_size, mode=hb.mode)  # fmt: skip
            self.known[key] = hb
            self._remember(hb)
            if hb.step >= 1 and key not in self.stepped:
                self.stepped.add(key)
                self.event("first_step", rank=hb.rank, pid=hb.pid)
            status = self.reaped.get(hb.pid)
            if status is None and self.launched is not None and hb.pid == self.launched.pid:
                status = None if self.launcher_status is None else describe_status(self.launcher_status)
            alive = status is None and procfs.is_alive(hb.pid, hb.start_ticks)
            views.append(RankView(hb, alive, status))
        return views

    def _remember(self, hb: HeartbeatState) -> None:
        """The rank's recent history for the report's timeline: a sample when its step, phase or state
        changed, bounded per rank."""
        sample = {"t": round(hb.wall(hb.last_progress if hb.step else hb.phase_start), 3), "step": hb.step,
                  "phase": hb.phase, "state": hb.state, "phase_t": round(hb.wall(hb.phase_start), 3)}  # fmt: skip
        history = self.history.setdefault(hb.rank, deque(maxlen=HISTORY_SAMPLES))
        last = history[-1] if history else None
        if last is None or (last["step"], last["phase"], last["state"], last["phase_t"]) != (
            sample["step"],
            sample["phase"],
            sample["state"],
            sample["phase_t"],
        ):
            history.append(sample)

    def _poll(self) -> None:
        now = time.monotonic()
        views = self.read_views()
        for detection in self._rules.evaluate(views, now):
            self._act(detection)
        if self._coord is not None:
            self._coord.publish({"host": self.node, "ranks": {str(v.rank): {
                "step": v.hb.step, "phase": v.hb.phase, "state": v.hb.state, "alive": v.alive,
                "quiet_s": round(max(0.0, now - v.hb.last_progress), 1)} for v in views}})  # fmt: skip
        self._watch_gpus(views, now)
        if self.cfg.status_interval > 0:
            if self._status_at is None:
                self._status_at = now + self.cfg.status_interval
            elif now >= self._status_at:
                self._status_at = now + self.cfg.status_interval
                self._status_line(views, now)

    def _watch_gpus(self, views: list[RankView], now: float) -> None:
        """Hot, throttling or erroring GPUs are events; every GPU at 0 % for the GPU-idle timeout while no rank
        progresses is evidence of a stall — and the trigger itself when no rank has a heartbeat."""
        for e in self._gpus.sample(now):
            name = e.pop("event")
            self.event(name, **e)
            self.say_once(f"{name}:{e['gpu']}", e["message"])
        idle = self._gpus.idle_for(now)
        if idle < self.cfg.gpu_idle_timeout or not self._gpus.seen_gpus:
            self._gpu_idle_said = False
            return
        if self._gpu_idle_said:
            return
        self._gpu_idle_said = True
        live = [v for v in views if v.alive]
        if any(now - v.hb.last_progress < idle for v in live):
            return  # a rank still progresses: the GPUs are idle for another reason (CPU work, data)
        reason = f"every GPU of the job has been at 0 % utilisation for {idle:.0f} s"
        if views:
            self.event("gpu_idle", idle_s=round(idle, 1), supporting=True)
            self.say(f"{reason}, and no rank has progressed since")
            return
        d = Detection("gpu_idle", (), reason + " and no rank has a heartbeat (the recorder could not activate)",
                      ())  # fmt: skip
        self._act(d)

    def _rank_gpus(self, views: list[RankView]) -> tuple[dict[int, list[int]], str]:
        """Which GPU each local rank uses, and how that was found (only where the job has GPUs)."""
        if not self._gpus.seen_gpus:
            return {}, "no GPU"
        ranks = {}
        for v in views:
            if v.alive:
                try:
                    ranks[v.rank] = (v.hb.pid, procfs.environ(v.hb.pid))
                except (OSError, procfs.ProcAccessError):
                    continue
        return gpu.rank_gpus(ranks)

    def _status_line(self, views: list[RankView], now: float) -> None:
        """So that a log read weeks later says what the job was doing: step, steps/s, phase; GPUs and heat."""
        parts = []
        mapping, _ = self._rank_gpus(views)
        for v in views:
            if not v.alive:
                continue
            before = self._status_steps.get(v.rank)
            rate = (v.hb.step - before[1]) / (now - before[0]) if before and now > before[0] else None
            self._status_steps[v.rank] = (now, v.hb.step)
            on = mapping.get(v.rank)
            parts.append(f"rank {v.rank} step {v.hb.step}" + (f" ({rate:.2f}/s)" if rate is not None else "")
                         + f" {v.hb.phase}" + (f" GPU{','.join(map(str, on))}" if on else ""))  # fmt: skip
        readings = self._gpus.latest() if self._gpus.seen_gpus else gpu.query_gpus(2.0)[0]
        gpus = " | ".join(g.describe() for g in readings)
        line = "status: " + ("; ".join(parts) or "no live rank") + (f" | {gpus}" if gpus else "")
        self.say(line)
        self.event("status", line=line)

    def _act(self, d: Detection) -> None:
        if d.rule == "rank_death" and self.terminating:  # the teardown we asked for: a record, no alarm
            self.event(d.rule, ranks=list(d.ranks), expected=True)
            return
        if self.interrupted or (d.rule in ("exception", "rank_death") and self._interrupt_in(d)):
            self._say_interrupted()
            self.event(d.rule, ranks=list(d.ranks), reason=d.reason, expected=True, interrupted=True)
            return
        if self.ending_since is not None:  # blackbox is ending the job (its evidence is taken): what follows —
            # stalls, peers' "connection closed" exceptions, deaths — is that ending, not a new incident
            self.event(d.rule, ranks=list(d.ranks), reason=d.reason, expected=True)
            return
        if d.rule in CRASH_RULES and self._crash_collected_recently(d):
            return
        if d.same_episode:  # a rank crossing its own timeout in a stall already collected: the same incident
            self.event("same_episode", rule=d.rule, ranks=list(d.ranks), bundle=self.bundles[-1] if self.bundles
                       else None)  # fmt: skip
            self.say_once(f"same-episode:{d.rule}", f"{d.message()} (the stall already collected: same incident)")
            return
        self.event(d.rule, ranks=list(d.ranks), reason=d.reason, findings=[f.__dict__ for f in d.findings])
        self.say(d.message())
        for f in d.findings:
            self.say(f"  {f.describe()}: idle {f.idle_s:.0f} s" if d.rule != "rank_death"
                     else f"  {f.describe()}: {f.exit_status or f.state}")  # fmt: skip
        hang = d.rule in HANG_RULES
        ending = hang and self.cfg.on_stall == "kill"
        report = self._collect(Trigger(d.rule), d, job_ends=ending)
        if hang:
            if ending:
                self._end_after_stall("stall")
            else:
                suspects = report.verdict.suspect_ranks if report is not None else list(d.ranks)
                pids = ", ".join(str(r.pid) for r in report.ranks if r.rank in suspects) if report else ", ".join(
                    str(f.pid) for f in d.findings)  # fmt: skip
                self.say(f"leaving the job running (--on-stall keep); inspect it with: py-spy dump --pid {pids}")

    def _interrupt_in(self, d: Detection) -> bool:
        """Whether the ranks of a detection ended by an interrupt (Ctrl-C at the terminal reaches every process
        of the job): their last exception is a KeyboardInterrupt, or they died of SIGINT."""
        if not d.ranks:
            return False
        for f in d.findings:
            if f.exit_status and "SIGINT" in f.exit_status:
                continue
            path = os.path.join(self.run_dir, P.RANKS_DIR, str(f.rank), P.RANK_EXCEPTIONS)
            try:
                with open(path, "rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - 65536))
                    last = fh.read().splitlines()[-1:]
                record = json.loads(last[0]) if last else {}
            except (OSError, ValueError):
                return False
            if not (isinstance(record, dict) and str(record.get("type", "")).endswith("KeyboardInterrupt")):
                return False
        return bool(d.findings)

    def _say_interrupted(self, how: str = "Ctrl-C") -> None:
        if not self.interrupted:
            self.interrupted = True
            self.event("interrupted", how=how)
            self.say(
                f"interrupted ({how}): your decision, so no bundle and no incident (send SIGUSR1 to blackbox "
                "first to keep one)"
            )

    def _end_after_stall(self, what: str) -> None:
        self.ended_after_stall = True
        self._end_job(f"{what}, --on-stall kill; exit code will be {EXIT_STALL_ENDED}")

    def _collect(
        self, trigger: Trigger, detection: Optional[Detection], job_ends: bool = False,
        incident: Optional[dict[str, object]] = None,
    ) -> Optional[Report]:  # fmt: skip
        """Bundle this node's evidence. `job_ends`: the job is about to be ended anyway, so the ranks may be
        signalled freely; otherwise the non-invasive ways go first (DESIGN.md §7). `incident`: another node's,
        which this node collects for; otherwise this node's trigger is posted to every node first."""
        own = incident is None
        if incident is None:
            incident, own = self._post_incident(trigger, detection)
        iid = str(incident.get("id"))
        if iid in self._incidents:  # joined an incident this node has already collected for
            self.event("same_episode", rule=trigger.name, incident=iid, bundle=self._incidents[iid])
            return None
        written = self._write_bundle(trigger, detection, job_ends, incident)
        if incident.get("kind") == "crash":  # what follows within the window is this crash's episode
            self._last_crash = (time.monotonic(), written.path if written else "")
        if written is None:
            return None
        path = written.path
        self.bundles.append(path)
        self._incidents[iid] = path
        self.event("bundle", path=path, trigger=trigger.name, incident=iid)
        self.say(f"evidence bundle: {path}")
        return self._take_in(written, trigger, alert=own)

    def _write_bundle(
        self, trigger: Trigger, detection: Optional[Detection], job_ends: bool, incident: dict[str, object]
    ) -> Optional[Written]:
        """The bundle's path; None when the collection failed (blackbox's own error, said once)."""
        try:
            views = self.read_views() if self.watching else []
            live = [v for v in views if v.alive]
            self.say(f"collecting evidence ({trigger.name}) from {len(live)} live rank(s) of {len(views)}")
            job = Job(
                run_id=self.run_id,
                node=self.node,
                argv=self.argv,
                cwd=os.getcwd(),
                env=self._job_env(),
                python=job_python(live[0].hb.pid) if live else None,
                run_dir=self.run_dir,
                ranks=[
                    RankTarget(v.rank, v.hb.pid, v.hb.start_ticks, v.alive, v.hb, v.exit_status, v.hb.local_rank)
                    for v in views
                ],
                world_size=max((v.hb.world_size for v in views), default=0),
                agent_pid=self.launched.pid if self.launched else None,
                history={rank: list(samples) for rank, samples in self.history.items()},
                gpu_history=self._gpus.samples(),
                rank_gpus=self._rank_gpus(views),
                incident=incident,
                coordination=self._coord.state() if self._coord is not None else None,
            )
            options = CollectOptions(
                dump_timeout=self.cfg.dump_timeout,
                budget=self.cfg.collect_budget,
                native=self.cfg.pyspy_native,
                locals=self.cfg.pyspy_locals,
                job_ends=job_ends,
            )
            return (
                Collector(job, self._table, self.console, options)
                .collect(trigger, detection, self.events, os.path.join(self.run_dir, P.BUNDLES_DIR))
                .written
            )
        except Exception as exc:
            self._internal_error("collect", exc)
            return None

    # --- other nodes -----------------------------------------------------------------------------------
    def _start_coordination(self) -> None:
        if self._topology is None:
            return
        coord = Coordination(self._topology, self.run_id, self.node, self.run_dir, self.cfg.poll_interval,
                             self.event, self.say_once, self._wake)  # fmt: skip
        try:
            coord.start()
        except Exception as exc:
            self._internal_error("coordination", exc)
            return
        self._coord = coord

    def _post_incident(self, trigger: Trigger, detection: Optional[Detection]) -> tuple[dict[str, object], bool]:
        """Tell every node (each collects its own evidence under the same incident id); or, alone, an id of
        this node's own. (incident, whether this node is the one that posted it)."""
        rule = detection.rule if detection is not None else trigger.rule
        body: dict[str, object] = {
            "trigger": trigger.name, "triggered_by": trigger.to_json(), "rule": rule, "kind": incident_kind(rule),
            "node": self.node,
            "node_rank": self._topology.node_rank if self._topology else None,
            "reason": detection.reason if detection is not None else trigger.name,
            "ranks": list(detection.ranks) if detection is not None else [],
        }  # fmt: skip
        if self._coord is not None:
            posted = self._coord.post(body)
            if posted is not None:
                return posted[0], posted[1]
        self._local_incidents += 1
        return {**body, "id": f"{self.run_id}-i{self._local_incidents}", "time": time.time()}, True

    def _handle_coordination(self) -> None:
        assert self._coord is not None
        for msg in self._coord.take():
            node = msg.get("node")
            if msg["ev"] == "silent":
                self.event("node_silent", node=node, silent_s=msg.get("silent_s"), last_summary=msg.get("summary"))
                self.say(f"the blackbox supervisor of node {node} has been silent for {msg.get('silent_s')} s "
                         "(killed, or its host is down): that node is no longer watched; this one goes on")  # fmt: skip
            elif msg["ev"] == "back":
                self.event("node_back", node=node)
                self.say(f"the blackbox supervisor of node {node} is back")
            elif msg["ev"] == "incident":
                self._remote_incident(msg["incident"])

    def _remote_incident(self, incident: dict[str, object]) -> None:
        """Another node posted an incident: collect this node's side of it at once (its ranks may be the
        victims waiting on the suspect, or the suspect itself)."""
        iid, origin = str(incident.get("id")), incident.get("origin")
        fields = {"incident": iid, "origin": origin, "trigger": incident.get("trigger"),
                  "reason": incident.get("reason")}  # fmt: skip
        if iid in self._incidents:
            return
        if self.launcher_status is not None or self.ending_since is not None:
            self.event("remote_incident", **fields, action="none: this node's job is ending")
            return
        recent = self._recent_crash()
        if incident.get("kind") == "crash" and recent is not None:
            self.event("same_episode", rule="remote", incident=iid, bundle=recent[1])
            return
        self.event("remote_incident", **fields, action="collect")
        self.say(f"node {origin} reports an incident ({incident.get('trigger')}: {str(incident.get('reason'))[:200]}); "
                 f"collecting this node's evidence for incident {iid}")  # fmt: skip
        hang = incident.get("kind") == "hang"
        ending = hang and self.cfg.on_stall == "kill"
        trigger = Trigger.from_json(incident.get("triggered_by"), incident.get("trigger")).joined()
        self._collect(trigger, None, job_ends=ending, incident=incident)
        if ending:
            self._end_after_stall(f"node {origin}'s stall")

    def _take_in(self, written: Written, trigger: Trigger, alert: bool) -> Optional[Report]:
        """What follows a bundle (blackbox.intake), on the bundle in memory: the report's one-screen verdict under
        the bundle path, the alarms (`alert`: this node posted the incident, and raises it once for the whole job),
        the index in the background (a file other nodes and jobs write too: never in the loop's way), "seen
        before". A failure here is blackbox's, said once."""
        from .. import intake
        from ..bundle.reader import Bundle

        path = written.path

        def said(report: Report) -> None:
            v = report.verdict
            self.event("verdict", bundle=path, category=v.category, suspect_ranks=v.suspect_ranks, phase=v.phase,
                       confidence=v.confidence, summary=v.summary)  # fmt: skip
            for line in report.headline():
                self.say(f"  {printable(line)}")  # it quotes the job's exception: shown, never acted on
            if alert:
                self._alert(path, report, trigger)

        def seen(entries: list[dict[str, object]]) -> None:
            try:
                from ..analyze.model import describe_seen

                for entry in entries[:1]:
                    self.say(f"  seen before: {describe_seen(entry)}")
                if entries:
                    self.event("seen_before", incidents=[e.get("id") for e in entries])
            except Exception as exc:
                self._internal_error("index", exc)

        try:
            taken = intake.Intake(Bundle.of(written), lambda m: self.say_once("index", m), env=self.env,
                                  on_report=said, on_seen=seen, background=True)  # fmt: skip
        except Exception as exc:
            self._internal_error("report", exc)
            if alert:
                self._alert(path, None, trigger)
            return None
        self._intakes.append(taken)
        return taken.report

    def _alert(self, path: str, report: Optional[Report], trigger: Trigger) -> None:
        try:
            self._alerts.incident(path, report, self.run_id, self.node, trigger.name)
        except Exception as exc:
            self._internal_error("alerts", exc)

    # --- ending ------------------------------------------------------------------------------------
    def _job_processes(self) -> list[tuple[int, int]]:
        """(pid, start ticks) of every live process of the job: our descendants (orphans are handed
        to us, a subreaper) and the ranks whose heartbeats we read. Nothing else is ever signalled."""
        procs: dict[int, int] = {}
        for pid in procfs.descendants(os.getpid()):
            if self._not_the_jobs(pid):
                continue
            st = procfs.proc_stat(pid)
            if st is not None:
                procs[pid] = st.start_ticks
        for (_, pid), hb in self.known.items():
            if procfs.is_alive(pid, hb.start_ticks):
                procs[pid] = hb.start_ticks
        return sorted(procs.items())

    def _not_the_jobs(self, pid: int) -> bool:
        """blackbox's own helpers: the coordination helper, and the --on-incident commands with what they
        started (each runs in a session of its own)."""
        if self._coord is not None and pid == self._coord.pid:
            return True
        with alerts.SESSIONS_LOCK:
            sessions = set(alerts.SESSIONS)
        if not sessions:
            return False
        try:
            return pid in sessions or os.getsid(pid) in sessions
        except OSError:
            return False

    def _end_job(self, reason: str) -> None:
        if self.ending_since is not None:
            return
        assert self.launched is not None
        self.ending_since = time.monotonic()
        self.terminating = True
        self.kill_deadline = self.ending_since + self.cfg.kill_grace
        self.say(f"ending the job ({reason}): SIGTERM to the launcher (pid {self.launched.pid}), "
                 f"SIGKILL to every job process after {self.cfg.kill_grace:g} s")  # fmt: skip
        self.event("end_job", reason=reason)
        if self.launcher_status is None:
            with contextlib.suppress(OSError):
                os.kill(self.launched.pid, signal.SIGTERM)

    def _kill_all(self, sig: int) -> None:
        for pid, ticks in self._job_processes():
            procfs.signal_if_same(pid, ticks, sig)

    def _end_survivors(self, why: str) -> None:
        survivors = self._job_processes()
        if not survivors:
            return
        self.say(f"{why}; ending {len(survivors)} job process(es) left behind: pids "
                 + ", ".join(str(p) for p, _ in survivors))  # fmt: skip
        self.event("end_survivors", reason=why, pids=[p for p, _ in survivors])
        for pid, ticks in survivors:
            procfs.signal_if_same(pid, ticks, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.kill_grace
        while time.monotonic() < deadline:
            self._reap()
            if not any(procfs.is_alive(p, t) for p, t in survivors):
                return
            time.sleep(0.05)
        for pid, ticks in survivors:
            procfs.signal_if_same(pid, ticks, signal.SIGKILL)
        self._reap()

    def _finish(self) -> int:
        assert self.launched is not None and self.launcher_status is not None
        status = self.launcher_status
        code = exit_code_of(status)
        died_of_signal = os.waitstatus_to_exitcode(status) < 0
        if died_of_signal and self.ending_since is None:
            self._end_survivors(f"the launcher (pid {self.launched.pid}) {describe_status(status)}")
        elif self.ending_since is not None:
            self._end_survivors("the job is being ended")
        self.launched.join_output(2.0)  # the last words of the job reach console.log before any bundle
        if self.console is not None:
            self.console.flush_pending()
        if self.watching:
            with contextlib.suppress(Exception):
                self._poll_guarded()  # deaths at the very end still get their record
        if code != 0 and not self.bundles and self.watching and not self.interrupted:
            self._collect(Trigger("exit"), None)
        for taken in self._intakes:
            taken.join(5.0)
        self._alerts.join(10.0)  # a slow command or webhook is left behind rather than holding the job's exit
        final = EXIT_STALL_ENDED if self.ended_after_stall else code
        self.event("end", launcher_status=describe_status(status), job_exit_code=code, exit_code=final,
                   bundles=self.bundles)  # fmt: skip
        return final
