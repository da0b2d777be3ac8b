"""Watching the job: each poll, every rank's heartbeat read into one view (alive or how it ended, its I/O from /proc),
each rank's recent history kept for the report's timeline (steps, phases, and what moved: forward calls, stack
changes, bytes read and written), the GPUs sampled (hot, throttling, idle), stragglers named (not an
incident: an event and a line) and, when asked, a status line. Reads, never decides on incidents: the rules and
the episodes do. Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Optional

from .. import movers
from .._recorder import protocol as P
from ..adapters import flight_recorder as fr
from ..adapters import gpu, procfs, torchelastic
from ..coord.topology import torchrun_args
from ..detections import Detection
from ..heartbeat_reader import HeartbeatState, HeartbeatTable
from ..safeopen import RunDir
from . import leaf, outputwait
from .context import RunContext
from .gpuwatch import GpuWatch
from .iowatch import IoWatch
from .process import JobProcess
from .rules import LIVE_STATES, RankView
from .stragglers import Stragglers, describe

HISTORY_SAMPLES = 2000  # per rank: the last changes of step, phase or state kept for the report's timeline
MOTION_SAMPLE_S = 10.0  # while a rank moves without a step, a history sample this often (its bytes, its calls)
LEAF_AFTER_S = 5.0  # a rank still for this long has its leaf read (supervisor.leaf): a definite one is judged sooner
FOLLOW_AFTER_S = 2.0  # a rank still for this long has what its main thread waits for followed (supervisor.waits)
STRAGGLER_FR_MIN = 10  # collectives every rank recorded, at least, before their arrival order is read
LAUNCHER_WAIT_S = 60.0  # a torchrun agent that started no rank this long is said to wait in its own rendezvous


class Watch:
    def __init__(self, ctx: RunContext, process: JobProcess) -> None:
        self.ctx = ctx
        self.process = process
        self.table: Optional[HeartbeatTable] = None
        self.known: dict[tuple[int, int], HeartbeatState] = {}  # (rank, pid) -> last reading
        self.stepped: set[tuple[int, int]] = set()
        self._elsewhere: set[tuple[int, int]] = set()  # (rank, pid) of ranks in another PID namespace: unwatched
        self.spawned = False  # the launcher was seen with a process of its own (a rank, a script's command)
        self.history: dict[int, deque[dict[str, object]]] = {}  # rank -> recent changes (for the report)
        self.gpus = GpuWatch()
        self.io = IoWatch(lambda: [pid for pid, _ in process.job_processes()])
        self.output = outputwait.OutputWait()
        self._sampled: dict[int, float] = {}  # rank -> when its last history sample was taken
        self._gpu_idle_said = False
        self._launched_at: Optional[float] = None  # when the watch first saw the launcher without a rank
        self._status_at: Optional[float] = None  # when the next status line is due
        self._status_steps: dict[int, tuple[float, int]] = {}  # rank -> (time, step) at the last status line
        self.stragglers = Stragglers(ctx.cfg.straggler_factor, ctx.cfg.straggler_window)

    def open(self) -> None:
        self.table = HeartbeatTable(os.path.join(self.ctx.run_dir, P.RANKS_DIR), self._heartbeat_error)

    def close(self) -> None:
        if self.table is not None:
            self.table.close()

    def _heartbeat_error(self, path: str, message: str) -> None:
        self.ctx.event("heartbeat_error", path=path, error=message)

    def rank_processes(self) -> list[tuple[int, int]]:
        """(pid, start ticks) of every rank whose heartbeat was ever read."""
        return [(pid, hb.start_ticks) for (_, pid), hb in self.known.items()]

    # --- the views ------------------------------------------------------------------------------------
    def read_views(self, now: Optional[float] = None) -> list[RankView]:
        assert self.table is not None
        now = time.monotonic() if now is None else now
        views = []
        launched = self.process.launched
        if not self.spawned and launched is not None:
            self.spawned = bool(procfs.children(launched.pid))
        stuck = self.output.tee_stuck(launched.helper_pids[0] if launched and launched.helper_pids else None, now)
        for hb in self.table.read():
            key = (hb.rank, hb.pid)
            if key in self._elsewhere or (key not in self.known and self._in_other_pid_namespace(hb)):
                continue
            if key not in self.known:
                self.ctx.event("rank_start", rank=hb.rank, pid=hb.pid, local_rank=hb.local_rank,
                               world_size=hb.world_size, mode=hb.mode)  # fmt: skip
            self.known[key] = hb
            if hb.step >= 1 and key not in self.stepped:
                self.stepped.add(key)
                self.ctx.event("first_step", rank=hb.rank, pid=hb.pid)
            status = self.process.exit_status(hb.pid)
            alive = status is None and procfs.is_alive(hb.pid, hb.start_ticks)
            follow = now - hb.last_motion > FOLLOW_AFTER_S
            io = self.io.get(hb.rank, hb.pid) if not alive else self.io.sample(hb.rank, hb.pid, now, follow,
                                                                               hb.workers_since)  # fmt: skip
            if alive and io is not None and not io.readable:
                self._io_unreadable(hb.rank, hb.pid)
            read, written = io.last_minute() if io is not None else (0, 0)
            view = RankView(hb, alive, status, io.moved_at if io is not None else 0.0, read, written,
                            io is not None and io.in_call, io.waits_for if io is not None else "")  # fmt: skip
            if alive and now - view.moved_at > LEAF_AFTER_S:  # still: the definite leaf it waits at, if any
                found = leaf.of_rank(hb.pid, hb.waiting, io.waited if io is not None else ())
                if found is not None:
                    view = replace(view, leaf=found.name)
            if alive and hb.waiting in ("thread", "poll") and now - hb.last_progress > movers.PAUSE_S:
                view = replace(
                    view, thread_words=movers.describe(self.ctx.run_dir, hb.rank, hb.pid, now, hb.last_progress)
                )
            if stuck and alive and self.output.rank_blocked(hb.pid):
                view = replace(view, io_at=now, waits_for=outputwait.WORDS)  # as alive as what reads its output
                self._output_blocked(hb.rank, hb.pid)
            self._record_history(view, now)
            views.append(view)
        if self.io.sockets.unreadable and self.ctx.first("sockets_unreadable"):
            self.ctx.event("sockets_unreadable", why="sock_diag (netlink) cannot be read here: the bytes a rank "
                           "sends or receives on a socket are not seen")  # fmt: skip
        self.io.end_poll()
        return views

    def _in_other_pid_namespace(self, hb: HeartbeatState) -> bool:
        """A new rank whose pid names no such process here but a process of a nested PID namespace (a container
        with its own PID space): said once, and left unwatched — its liveness, I/O and signals would reach the
        wrong process."""
        if procfs.is_alive(hb.pid, hb.start_ticks):
            return False
        here = procfs.in_other_pid_namespace(hb.pid, hb.start_ticks)
        if here is None:
            return False
        self._elsewhere.add((hb.rank, hb.pid))
        self.ctx.event("rank_unwatchable", rank=hb.rank, pid=hb.pid, host_pid=here, why="another PID namespace")
        self.ctx.say(f"rank {hb.rank} runs in another PID namespace (pid {hb.pid} there, {here} here): blackbox "
                     "cannot watch it — no stall, death or straggler of it is judged; run blackbox inside that "
                     "namespace (the container) to watch it")  # fmt: skip
        return True

    def _output_blocked(self, rank: int, pid: int) -> None:
        """Said once a run (an event per rank process): the job waits for whoever reads blackbox's output."""
        if not self.ctx.first(f"output_blocked:{rank}:{pid}"):
            return
        self.ctx.event("output_blocked", rank=rank, pid=pid)
        self.ctx.say_once("output_blocked", "the job is blocked on its output: nothing reads blackbox's stdout or "
                          "stderr (a pager, a log shipper that stopped, a terminal paused with Ctrl-S); blackbox "
                          "waits with it: not a stall")  # fmt: skip

    def _io_unreadable(self, rank: int, pid: int) -> None:
        """Said once per rank process: without its I/O counters, I/O is no motion blackbox can see."""
        if not self.ctx.first(f"io_unreadable:{rank}:{pid}"):
            return
        self.ctx.event("io_unreadable", rank=rank, pid=pid, path=f"/proc/{pid}/io")
        self.ctx.say(f"rank {rank}: /proc/{pid}/io cannot be read (another user's process, or no CAP_SYS_PTRACE): "
                     "its reads and writes are not seen, only its heartbeat")  # fmt: skip

    def _record_history(self, v: RankView, now: float) -> None:
        """The rank's recent history for the report's timeline: a sample when its step, phase or state changed, and
        every MOTION_SAMPLE_S while it moves otherwise (forward calls, stack changes, bytes read and written since
        it started, when it last moved), bounded per rank."""
        hb = v.hb
        sample: dict[str, object] = {
            "t": round(hb.wall(hb.last_progress if hb.step else hb.phase_start), 3), "step": hb.step,
            "phase": hb.phase, "state": hb.state, "phase_t": round(hb.wall(hb.phase_start), 3),
            "at": round(hb.wall(now), 3), "moved_t": round(hb.wall(v.moved_at), 3) if v.moved_at else None,
            "batches": hb.batches, "forwards": hb.forwards, "stack_changes": hb.stack_changes,
        }  # fmt: skip
        io = self.io.get(hb.rank, hb.pid)
        if io is not None and io.readable:
            sample.update(read_bytes=io.read, written_bytes=io.written)
        history = self.history.setdefault(hb.rank, deque(maxlen=HISTORY_SAMPLES))
        last = history[-1] if history else None
        key = ("step", "phase", "state", "phase_t")
        changed = last is None or tuple(last[k] for k in key) != tuple(sample[k] for k in key)
        moving = last is not None and v.moved_at > hb.last_progress and sample["moved_t"] != last.get("moved_t")
        if changed or (moving and now - self._sampled.get(hb.rank, 0.0) >= MOTION_SAMPLE_S):
            history.append(sample)
            self._sampled[hb.rank] = now

    # --- GPUs -------------------------------------------------------------------------------------------
    def watch_gpus(self, views: list[RankView], now: float) -> Optional[Detection]:
        """Hot, throttling or erroring GPUs are events; every GPU at 0 % for the GPU-idle timeout while no rank
        progresses is evidence of a stall — and the trigger itself (the detection returned) when no rank has a
        heartbeat."""
        for e in self.gpus.sample(now):
            name = e.pop("event")
            self.ctx.event(name, **e)
            self.ctx.say_once(f"{name}:{e['gpu']}", e["message"])
        idle = self.gpus.idle_for(now)
        if idle < self.ctx.cfg.gpu_idle_timeout or not self.gpus.seen_gpus:
            self._gpu_idle_said = False
            return None
        if self._gpu_idle_said:
            return None
        self._gpu_idle_said = True
        live = [v for v in views if v.alive]
        if any(now - v.moved_at < idle for v in live):
            return None  # a rank still moves: the GPUs are idle for another reason (CPU work, data, a checkpoint)
        reason = f"every GPU of the job has been at 0 % utilisation for {idle:.0f} s"
        if not views and self.launcher_waits(views, now):
            return None  # no rank yet: the GPUs wait with the launcher, whose rendezvous waits for the other nodes
        if views:
            self.ctx.event("gpu_idle", idle_s=round(idle, 1), supporting=True)
            self.ctx.say(f"{reason}, and no rank has progressed since")
            return None
        return Detection("gpu_idle", (), reason + " and no rank has a heartbeat (the recorder could not activate)",
                         ())  # fmt: skip

    def launcher_waits(self, views: list[RankView], now: float) -> bool:
        """Whether the launcher is torchrun's agent and has started no rank yet: a multi-node agent waits in its own
        rendezvous for the other nodes, which is no hang — no rule fires on it (the GPUs are idle: no rank runs).
        Said once, after LAUNCHER_WAIT_S (or the GPU-idle timeout, when shorter): an event and a line."""
        launched = self.process.launched
        if views or self.spawned or launched is None or not torchelastic.is_launcher(self.ctx.argv):
            self._launched_at = None
            return False
        if self._launched_at is None:
            self._launched_at = now
        waited = now - self._launched_at
        if waited >= min(LAUNCHER_WAIT_S, self.ctx.cfg.gpu_idle_timeout) and self.ctx.first("launcher_waiting"):
            nnodes = (torchrun_args(self.ctx.argv) or {}).get("--nnodes", "")
            self.ctx.event("launcher_waiting", pid=launched.pid, waited_s=round(waited, 1), nnodes=nnodes)
            nodes = f" for the job's other nodes (--nnodes {nnodes})" if nnodes not in ("", "1", "1:1") else ""
            self.ctx.say(f"the launcher (torchrun, pid {launched.pid}) has started no rank in {waited:.0f} s: it "
                         f"waits in its own rendezvous{nodes} — not a hang: no rule fires before a rank starts, "
                         "`blackbox status` says how long it has waited")  # fmt: skip
        return True

    def rank_gpus(self, views: list[RankView]) -> tuple[dict[int, list[int]], str]:
        """Which GPU each local rank uses, and how that was found (only where the job has GPUs)."""
        if not self.gpus.seen_gpus:
            return {}, "no GPU"
        ranks = {}
        for v in views:
            if v.alive:
                try:
                    ranks[v.rank] = (v.hb.pid, procfs.environ(v.hb.pid))
                except (OSError, procfs.ProcAccessError):
                    continue
        return gpu.rank_gpus(ranks)

    # --- stragglers -------------------------------------------------------------------------------------
    def watch_stragglers(self, views: list[RankView], now: float) -> None:
        """A straggler episode's start and end: an event each, and one line on stderr."""
        live = [v.hb for v in views if v.alive and v.hb.state in LIVE_STATES]
        for e in self.stragglers.feed(live, now):
            name = e.pop("event")
            self.ctx.event(name, **e)
            if name == "straggler":
                for rank in e["ranks"]:
                    self.ctx.say(f"straggler: {describe(rank, e['details'][str(rank)])}")
                threading.Thread(target=self._confirm, args=(e["ranks"],), name="blackbox-straggler",
                                 daemon=True).start()  # fmt: skip
            else:
                self.ctx.say(f"straggler: rank {e['ranks'][0]} keeps pace again")

    def _confirm(self, ranks: list[int]) -> None:
        """The flight recorder's word on a straggler, once per episode, in a thread of its own: every live rank is
        asked for its dump the quiet way (the heartbeat's dump-request word: no signal), then the collectives they
        all recorded say who came to them last — the rank the others waited for."""
        ctx = self.ctx
        try:
            table = HeartbeatTable(os.path.join(ctx.run_dir, P.RANKS_DIR), lambda path, message: None)
            try:
                live = [hb for hb in table.read() if procfs.is_alive(hb.pid, hb.start_ticks)]
                asked = {hb.rank: table.request_dump(hb.rank) for hb in live}
                deadline = time.monotonic() + ctx.cfg.dump_timeout
                while asked and time.monotonic() < deadline:
                    acks = {hb.rank: hb.dump_ack for hb in table.read()}
                    asked = {r: n for r, n in asked.items() if acks.get(r, 0) < n}
                    time.sleep(0.1)
            finally:
                table.close()
            run, dumps = RunDir(ctx.run_dir, None), {}
            for hb in live:
                try:
                    dumps[hb.rank] = fr.load_dump(run.read(f"{P.FR_DIR}/{P.FR_PREFIX}{hb.rank}", fr.MAX_DUMP_BYTES))
                except (OSError, fr.FlightRecorderError):
                    continue
            found = [a for a in fr.arrivals(dumps) if a.collectives >= STRAGGLER_FR_MIN]
            if not found:
                ctx.event("straggler_confirmed", ranks=ranks, result="no flight-recorder trace to compare",
                          dumps=sorted(dumps))  # fmt: skip
                return
            a = max(found, key=lambda a: a.collectives)
            ctx.event("straggler_confirmed", ranks=ranks, group=a.group, collectives=a.collectives,
                      last_arrivals={str(r): n for r, n in a.last.items()}, agrees=a.agrees(set(ranks)))  # fmt: skip
            ctx.say(f"straggler: {a.describe(set(ranks))}")
        except Exception as exc:
            ctx.internal_error("straggler confirmation", exc)

    # --- the status line ------------------------------------------------------------------------------
    def status_due(self, views: list[RankView], now: float) -> None:
        if self.ctx.cfg.status_interval <= 0:
            return
        if self._status_at is None:
            self._status_at = now + self.ctx.cfg.status_interval
        elif now >= self._status_at:
            self._status_at = now + self.ctx.cfg.status_interval
            self._status_line(views, now)

    def _status_line(self, views: list[RankView], now: float) -> None:
        """So that a log read weeks later says what the job was doing: step, steps/s, phase; GPUs and heat."""
        parts = []
        mapping, _ = self.rank_gpus(views)
        for v in views:
            if not v.alive:
                continue
            before = self._status_steps.get(v.rank)
            rate = (v.hb.step - before[1]) / (now - before[0]) if before and now > before[0] else None
            self._status_steps[v.rank] = (now, v.hb.step)
            on = mapping.get(v.rank)
            parts.append(f"rank {v.rank} step {v.hb.step}" + (f" ({rate:.2f}/s)" if rate is not None else "")
                         + f" {v.hb.phase}" + (f" GPU{','.join(map(str, on))}" if on else "")
                         + (" STRAGGLER" if v.rank in self.stragglers.active else ""))  # fmt: skip
        readings = self.gpus.latest() if self.gpus.seen_gpus else gpu.query_gpus(2.0)[0]
        gpus = " | ".join(g.describe() for g in readings)
        line = "status: " + ("; ".join(parts) or "no live rank") + (f" | {gpus}" if gpus else "")
        self.ctx.say(line)
        self.ctx.event("status", line=line)
