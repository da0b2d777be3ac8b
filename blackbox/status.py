"""A run as it stands, read from its run directory from any terminal on the node: every rank's heartbeat page
(mapped read-only: nothing is written, nothing signalled), the run's events (the supervisor, straggler episodes,
incidents, bundles) and this node's GPUs. The model `blackbox status` renders once and `blackbox top` every second.
Never prints. Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import movers, safeopen
from ._recorder import protocol as P
from ._recorder.redact import redact_argv
from .adapters import gpu, procfs, proctree
from .config import RUNS_DIR
from .detections import life_stage, straggler_episodes
from .errors import BlackboxError
from .events import read_events
from .heartbeat_reader import HeartbeatState, HeartbeatTable

STATUS_SCHEMA_VERSION = 1
MOVING_S = 10.0  # a signal that moved within this long is listed in `moving`


@dataclass
class RankStatus:
    rank: int
    pid: int
    alive: bool
    state: str  # the heartbeat's: starting, running, exited, exception
    stage: str  # where in its life (detections.life_stage): rendezvous, startup, training, exiting, exited
    step: int
    steps_per_s: Optional[float]  # between the last two readings (top), else from the last step's duration
    phase: str
    phase_s: float  # seconds in the current phase
    idle_s: float  # seconds since the last progress (a step or a batch)
    liveness_age_s: float  # seconds since the rank's liveness thread last ran
    straggler: bool  # in a straggler episode the supervisor named (events.jsonl)
    time_share: dict[str, float]  # phase -> the fraction of the rank's time since it started (the time ledger)
    # progress that is not a step (DESIGN.md §3): what moved, and when
    moved_s: float = 0.0  # seconds since it last moved in any way seen (step, batch, forward call, stack, I/O)
    moving: list[str] = field(default_factory=list)  # what moved within MOVING_S: step, batch, forward, stack, io
    forwards: int = 0  # module forward calls counted during pauses (heartbeat layout 3)
    forward_mode: str = "idle"  # the forward counter: idle (no pause), counting, off (torch.compile in use)
    stack_changes: int = 0  # samples at which its main thread's Python stack had changed
    read_bytes: Optional[int] = None  # through read/write system calls since it started (/proc; None: unreadable)
    written_bytes: Optional[int] = None
    read_per_s: Optional[float] = None  # between two readings (top)
    written_per_s: Optional[float] = None
    moved_at: Optional[float] = None  # Unix time of that last motion
    io_unreadable: bool = False  # alive, but /proc refused its I/O counters: its I/O is not seen
    waits_for: Optional[str] = None  # still for a while, its main thread waits for other processes: which ones
    kept_by: Optional[str] = None  # in a pause, its main thread waits for a thread of its own that works (movers)
    join: str = ""  # its default process group: "" (not joined yet, or unknown), "joining", "joined" (its heartbeat)


@dataclass
class Rendezvous:
    """Ranks that wait in init_process_group for ranks that have not arrived: who waits, and who is missing."""

    world_size: int
    waiting: list[int]  # in init_process_group, waiting for the others
    not_arrived: list[int]  # alive here, with a heartbeat, and not yet in it
    elsewhere: int  # ranks of the world with no heartbeat here: another node's, or not started
    still_s: float  # how long the waiting ranks have been still (the least of them)
    # multi-node: of those, the ones another node's blackbox holds (host -> ranks), and the nodes not joined yet
    elsewhere_on: dict[str, list[int]] = field(default_factory=dict)
    nodes_not_joined: int = 0
    nnodes: int = 1
    coordination: Optional[str] = None  # the coordination's address, where the other nodes' blackbox joins


@dataclass
class RunStatus:
    run_dir: str
    run_id: Optional[str]
    live: bool  # its supervisor runs and has not ended
    why_not_live: Optional[str]  # in plain words, when not live
    supervisor_pid: Optional[int]
    command: list[str]
    started: Optional[str]
    exit_code: Optional[int]  # blackbox run's, once it ended
    ranks: list[RankStatus]
    gpus: list[dict[str, Any]]  # index, name, utilization_pct, temperature_c, memory_used_mib, memory_total_mib (now)
    stragglers: list[dict[str, Any]]  # episodes: ranks, phase, factor, started, ended (None while it lasts)
    incidents: list[dict[str, Any]]  # each bundle with its verdict: bundle, trigger, category, suspect_ranks, time
    rendezvous: Optional[Rendezvous] = None  # some ranks wait in init_process_group for others not there yet
    # no rank yet, the launcher (torchrun's agent) waits in its own rendezvous: {pid, nnodes, since} (Unix time)
    launcher_waiting: Optional[dict[str, Any]] = None
    read_at: float = field(default_factory=time.time)
    schema_version: int = STATUS_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}


def _is_live_run(run_dir: str) -> bool:
    return _supervisor(read_events(os.path.join(run_dir, P.EVENTS_LOG)))[1] is None


def find_run(path: Optional[str], cwd: Optional[str] = None) -> str:
    """The run directory to show: `path`, or the newest live run under ./blackbox-runs (else the newest run)."""
    if path is not None:
        if not os.path.isfile(os.path.join(path, P.EVENTS_LOG)):
            raise BlackboxError(f"`{path}` is not a run directory of `blackbox run` (it has no {P.EVENTS_LOG}).",
                                hint="Give the run directory (--run-dir of blackbox run).")  # fmt: skip
        return os.path.abspath(path)
    base = os.path.join(cwd or os.getcwd(), RUNS_DIR)
    try:
        runs = [os.path.join(base, n) for n in os.listdir(base) if os.path.isfile(os.path.join(base, n, P.EVENTS_LOG))]
    except OSError:
        runs = []
    if not runs:
        raise BlackboxError(f"There is no run under `{base}`.", hint="Give the run directory: blackbox status RUN_DIR.")
    runs.sort(key=lambda r: os.path.getmtime(os.path.join(r, P.EVENTS_LOG)), reverse=True)
    return next((r for r in runs if _is_live_run(r)), runs[0])


def _supervisor(events: list[dict[str, Any]]) -> tuple[dict[str, Any], Optional[str]]:
    """The start event, and why the run is not live (None: it is)."""
    start = next((e for e in events if e.get("event") == "start"), {})
    end = next((e for e in reversed(events) if e.get("event") == "end"), None)
    if end is not None:
        return start, f"the run ended (blackbox run exited with {end.get('exit_code')})"
    pid = start.get("pid")
    if not isinstance(pid, int):
        return start, "its start was not recorded"
    if not procfs.is_alive(pid) or not any("blackbox" in a for a in procfs.cmdline(pid)):
        return start, f"its supervisor (pid {pid}) is gone without recording its end (killed?)"
    return start, None


def _episodes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("rank", "phase", "factor", "started", "ended")
    return [{k: e[k] for k in keep} for e in straggler_episodes(events)]


def _launcher_waiting(events: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The supervisor's word that the launcher has started no rank and waits in its own rendezvous: since when."""
    said: dict[str, Any] = next((e for e in reversed(events) if e.get("event") == "launcher_waiting"), {})
    at: Any = said.get("t")
    waited: Any = said.get("waited_s")
    if not _number(at):
        return None
    since = float(at) - (float(waited) if _number(waited) else 0.0)
    return {"pid": said.get("pid"), "nnodes": str(said.get("nnodes") or ""), "since": round(since, 3)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _incidents(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    verdicts = {e.get("bundle"): e for e in events if e.get("event") == "verdict"}
    out = []
    for e in events:
        if e.get("event") == "bundle":
            v = verdicts.get(e.get("path"), {})
            out.append({"bundle": e.get("path"), "trigger": e.get("trigger"), "time": e.get("time"),
                        "category": v.get("category"), "suspect_ranks": v.get("suspect_ranks"),
                        "summary": v.get("summary")})  # fmt: skip
    return out


def _share(hb: HeartbeatState, now: float) -> dict[str, float]:
    """phase -> fraction of the rank's time up to `now` (for a rank that has ended, its end)."""
    spent = hb.time_spent(now)
    total = sum(spent.values())
    return {p: round(v / total, 4) for p, v in spent.items() if v > 0} if total > 0 else {}


def _motion(r: RankStatus, hb: HeartbeatState, at: float, alive: bool, prior: Optional[RankStatus],
            since: float) -> None:  # fmt: skip
    """What moved in the rank, from its heartbeat and its I/O counters (/proc, read now: the rates and I/O's own
    motion need a reading before, as `top` has)."""
    io = procfs.io_counters(hb.pid) if alive else None
    r.io_unreadable = alive and io is None and procfs.is_alive(hb.pid, hb.start_ticks)
    moved = hb.last_motion
    stamps = [("step" if hb.step else "batch", hb.last_progress), ("forward", hb.forwards_time),
              ("stack", hb.stack_time)]  # fmt: skip
    if io is not None:
        r.read_bytes, r.written_bytes = io.rchar, io.wchar
        if prior is not None and prior.read_bytes is not None and prior.written_bytes is not None and since > 0:
            r.read_per_s = round(max(0, io.rchar - prior.read_bytes) / since, 1)
            r.written_per_s = round(max(0, io.wchar - prior.written_bytes) / since, 1)
            if (io.rchar, io.wchar) != (prior.read_bytes, prior.written_bytes):
                stamps.append(("io", at))
                moved = max(moved, at)
    r.moving = [name for name, t in stamps if t and at - t <= MOVING_S]
    waited = proctree.waited_processes(hb.pid, hb.workers_since) if alive and not r.moving else []
    r.waits_for = proctree.waited_name(waited, redact_argv) if waited else None
    earlier = prior.moved_at if prior is not None and prior.moved_at is not None else 0.0
    r.moved_at = max(round(hb.wall(moved), 3) if moved else 0.0, earlier) or None
    r.moved_s = round(max(0.0, hb.wall(at) - r.moved_at), 3) if r.moved_at else round(max(0.0, at - moved), 3)


def read_status(run_dir: str, table: HeartbeatTable, previous: Optional[RunStatus] = None,
                gpus: Optional[list[gpu.GpuReading]] = None) -> RunStatus:  # fmt: skip
    """The run now. `previous`: the last reading, for steps per second between the two; `gpus`: readings taken by
    the caller (top samples at its own pace), else read now."""
    events = read_events(os.path.join(run_dir, P.EVENTS_LOG))
    start, why = _supervisor(events)
    stragglers = _episodes(events)
    straggling = {s["rank"] for s in stragglers if s["ended"] is None}  # an ended run: as it stood at its end
    now = time.monotonic()
    before = {r.rank: r for r in previous.ranks} if previous is not None else {}
    since = time.time() - previous.read_at if previous is not None else 0.0
    ranks = []
    pages = sorted(table.read(), key=lambda h: h.rank)
    for hb in pages:
        prior = before.get(hb.rank)
        if prior is not None and prior.pid == hb.pid and since > 0:
            rate: Optional[float] = round((hb.step - prior.step) / since, 3)
        else:
            rate = round(1 / hb.last_step_dt, 3) if hb.last_step_dt > 0 and hb.step > 1 else None
        alive = procfs.is_alive(hb.pid, hb.start_ticks)
        at = now if alive else max(hb.liveness_time, hb.last_progress)  # an ended rank's last state is at its end
        rank = RankStatus(
            rank=hb.rank, pid=hb.pid, alive=alive, state=hb.state, join=hb.join, step=hb.step,
            stage=life_stage(hb.step, hb.state, alive, hb.join == "joining", False),
            steps_per_s=rate, phase=hb.phase, phase_s=round(max(0.0, at - hb.phase_start), 3),
            idle_s=round(max(0.0, at - hb.last_progress), 3),
            liveness_age_s=round(max(0.0, at - hb.liveness_time), 3), straggler=hb.rank in straggling,
            time_share=_share(hb, at), forwards=hb.forwards, forward_mode=hb.forward_mode,
            stack_changes=hb.stack_changes,
        )  # fmt: skip
        _motion(rank, hb, at, alive, prior if prior is not None and prior.pid == hb.pid else None, since)
        if "stack" in rank.moving and hb.waiting in ("thread", "poll") and at - hb.last_progress > movers.PAUSE_S:
            rank.kept_by = movers.describe(run_dir, hb.rank, hb.pid, at, hb.last_progress) or None
        ranks.append(rank)
    if gpus is None:
        gpus = gpu.query_gpus(2.0)[0]
    ended: dict[str, Any] = next((e for e in reversed(events) if e.get("event") == "end"), {})
    return RunStatus(
        run_dir=run_dir, run_id=start.get("run_id"), live=why is None, why_not_live=why,
        supervisor_pid=start.get("pid") if isinstance(start.get("pid"), int) else None,
        command=[str(a) for a in start.get("command") or []], started=start.get("time"),
        exit_code=ended.get("exit_code") if isinstance(ended.get("exit_code"), int) else None,
        ranks=ranks, gpus=[{"index": g.index, "name": g.name, "utilization_pct": g.utilization_pct,
                            "temperature_c": g.temperature_c, "memory_used_mib": g.memory_used_mib,
                            "memory_total_mib": g.memory_total_mib} for g in gpus],
        stragglers=stragglers, incidents=_incidents(events),
        rendezvous=_rendezvous(ranks, max((hb.world_size for hb in pages), default=0), _nodes(run_dir)),
        launcher_waiting=_launcher_waiting(events) if not ranks and why is None else None,
    )  # fmt: skip


def _rendezvous(ranks: list[RankStatus], world_size: int, nodes: dict[str, Any]) -> Optional[Rendezvous]:
    """Who waits in init_process_group and who has not arrived there, while some rank has waited there, still, for
    MOVING_S or more and some has not arrived (a rendezvous that takes a moment is not worth a line); in a
    multi-node job, which node holds the ranks not here, and how many nodes have not joined (`nodes`)."""
    alive = [r for r in ranks if r.alive]
    waiting = [r for r in alive if r.join == "joining"]
    if not waiting:
        return None
    not_arrived = [r.rank for r in alive if r.join == ""]
    here = {r.rank for r in ranks}
    elsewhere = max(0, world_size - len(here))
    if not not_arrived and not elsewhere:
        return None
    still = min(r.moved_s for r in waiting)
    if still < MOVING_S:
        return None
    on: dict[str, list[int]] = {}
    hosts = nodes.get("hosts")
    for info in hosts.values() if isinstance(hosts, dict) else []:
        listed = info.get("ranks") if isinstance(info, dict) else None
        held = [r for r in listed if isinstance(r, int) and r not in here and 0 <= r < world_size] if isinstance(
            listed, list) else []  # fmt: skip
        if held:
            on.setdefault(str(info.get("host"))[:100], []).extend(held)
    nnodes, joined = nodes.get("nnodes"), nodes.get("joined")
    missing = nnodes - joined if isinstance(nnodes, int) and isinstance(joined, int) and nnodes > joined else 0
    address = nodes.get("address")
    return Rendezvous(world_size, [r.rank for r in waiting], not_arrived, elsewhere, still,
                      {h: sorted(set(rs)) for h, rs in on.items()}, missing, nnodes if isinstance(nnodes, int) else 1,
                      str(address)[:200] if address else None)  # fmt: skip


def _nodes(run_dir: str) -> dict[str, Any]:
    """The run dir's nodes.json (the supervisor's word on the other nodes of a multi-node job); {} when absent."""
    try:
        owner: Optional[int] = os.stat(run_dir).st_uid
        data = json.loads(safeopen.read_file(os.path.join(run_dir, P.NODES_FILE), owner, 4 << 20))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def open_table(run_dir: str) -> HeartbeatTable:
    """The run's heartbeat pages, read-only, the run directory's user's files only."""
    try:
        owner: Optional[int] = os.stat(run_dir).st_uid
    except OSError:
        owner = None
    return HeartbeatTable(os.path.join(run_dir, P.RANKS_DIR), lambda path, message: None, owner)
