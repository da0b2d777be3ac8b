"""When to act (DESIGN.md §3): the stall, busy, frozen, exception and rank-death rules over heartbeat readings, the
slow-phase note, and which console lines mean the job is dying. Progress is anything that moves: a step, a batch, a
forward call, the main thread's Python stack changing, I/O — never CPU time. A stall is a job in which nothing
moves; a rank that moves but never steps is the busy rule's; a long pause while something moves is a note. Which
ranks cause an incident is not decided here: the analysis blames, on the bundle's evidence (blackbox.analyze.blame).
Pure: no I/O, no clock of its own. Imports the stdlib, blackbox.config, the shared words, the heartbeat model and the
table of leaves (supervisor.leaf)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Optional

from ..config import AUTO, RunConfig
from ..detections import Detection, RankFinding, human_bytes, plural_ranks
from ..heartbeat_reader import HeartbeatState
from .leaf import BY_NAME, DEFINITE_FLOOR_S

AUTO_FLOOR_S = 60.0  # `auto` never goes below this
AUTO_FACTOR = 5.0  # ... and is this many times the slowest step seen
AUTO_MIN_STEPS = 5  # before this many steps, `auto` uses the start-up timeout
PHASE_TIMEOUTS = {"checkpoint": "checkpoint_timeout", "eval": "eval_timeout"}
LIVE_STATES = ("starting", "running")
MOVING_S = 10.0  # a rank that moved within this long (a quarter of a short timeout) is "moving", else "waiting"


@dataclass(frozen=True)
class RankView:
    """One rank as the supervisor sees it at one poll: its heartbeat, whether its process lives, and its I/O as read
    from /proc (supervisor.iowatch)."""

    hb: HeartbeatState
    alive: bool
    exit_status: Optional[str] = None  # "exit code 3" / "signal 9 (SIGKILL)" where the supervisor reaped it
    io_at: float = 0.0  # the last poll at which its I/O moved (CLOCK_MONOTONIC); 0: never
    io_read_1m: int = 0  # bytes it read and wrote over about the last minute
    io_written_1m: int = 0
    io_in_call: bool = False  # its main thread is inside a read or write system call
    waits_for: str = ""  # what its main thread waits for that moved at this poll: "waits for its child `gzip` …"
    thread_words: str = ""  # the thread of its own its waiting main thread is as alive as (supervisor.movers)
    leaf: str = ""  # the definite leaf a still rank waits at (supervisor.leaf: stopped, fifo, poll); "" for another

    @property
    def rank(self) -> int:
        return self.hb.rank

    @property
    def died(self) -> bool:
        return not self.alive and self.hb.state in (*LIVE_STATES, "exception")

    @property
    def moved_at(self) -> float:
        """The last time this rank made progress of any kind: step, batch, forward call, stack change, I/O."""
        return max(self.hb.last_motion, self.io_at)

    def doing(self, now: float, recent: float = MOVING_S) -> str:
        """What it is doing, in a few words: how it moves (what moved within `recent`), or that it waits (where)."""
        hb = self.hb
        where = f"collective {hb.collective}" if hb.phase == "collective" and hb.collective != "none" else hb.phase
        if now - self.moved_at > recent:
            return f"waits ({where}, still for {now - self.moved_at:.0f} s)"
        how = []
        if now - self.io_at <= recent and self.waits_for:
            how.append(self.waits_for)
        elif now - self.io_at <= recent:
            amounts = (("writing", self.io_written_1m), ("reading", self.io_read_1m))
            io = [f"{verb} {human_bytes(n)}" for verb, n in amounts if n >= 1_000_000]
            if io:
                how.append(" and ".join(io) + " in the last minute")
            if self.io_in_call:
                how.append("in a long read or write system call, the kernel moving its bytes")
            if not io and not self.io_in_call:
                how.append("doing I/O")
        if now - hb.forwards_time <= recent:
            how.append("running its model (forward calls)")
        if now - hb.last_progress <= recent and hb.batches:
            how.append("taking batches")
        if now - hb.stack_time <= recent:
            how.append(self.thread_words or "running Python code")
        return f"{where}: " + (", ".join(how) or "moving")


def _recent(timeout: float) -> float:
    """How recently a rank must have moved to be moving now: MOVING_S, or a quarter of a short timeout."""
    return min(MOVING_S, timeout / 4)


FIRST_BATCH_PHASES = ("data", "checkpoint")


def stall_timeout(hb: HeartbeatState, cfg: RunConfig, begun: bool = False, leaf: str = "",
                  whole_world: bool = False) -> tuple[float, str]:  # fmt: skip
    """How long nothing may move while this rank is where it is, and the name of the rule that chose it. `leaf`: the
    definite leaf it waits at (supervisor.leaf), judged on the short floor whatever its step (`whole_world`: every
    rank of the job is here, which a poll loop needs: a rendezvous polls its store too). `begun`: training has begun
    on some rank (a batch taken): a rank still before its first step, parked in data or checkpoint, is holding up
    peers that already wait for it — the first-batch timeout, not the start-up one. The checkpoint and eval timeouts
    do not stretch it: a checkpoint that writes or an evaluation that runs moves; one in which nothing moves is a
    hang like any other (the busy rule takes the phase timeouts)."""
    definite = BY_NAME.get(leaf) if leaf else None
    if definite is not None and definite.definite and (whole_world or not definite.needs_whole_world):
        floor = DEFINITE_FLOOR_S if cfg.stall_timeout == AUTO else float(cfg.stall_timeout)
        base, rule = _step_timeout(hb, cfg, begun)
        return (floor, f"leaf {leaf}") if floor < base else (base, rule)
    return _step_timeout(hb, cfg, begun)


def _step_timeout(hb: HeartbeatState, cfg: RunConfig, begun: bool) -> tuple[float, str]:
    """The timeout its step count and phase give (start-up, first batch, auto or the one given)."""
    if hb.step == 0 and begun and hb.phase in FIRST_BATCH_PHASES:
        return cfg.first_batch_timeout, "first_batch"
    if hb.step == 0 or (cfg.stall_timeout == AUTO and hb.step < AUTO_MIN_STEPS):
        return cfg.startup_timeout, "startup"
    return pause_timeout(hb, cfg)


def pause_timeout(hb: HeartbeatState, cfg: RunConfig) -> tuple[float, str]:
    """The length of a pause worth a slow-phase note: the stall timeout of a rank in its stride (auto's formula, or
    the one given), whatever its step."""
    if cfg.stall_timeout == AUTO:
        return max(AUTO_FLOOR_S, AUTO_FACTOR * hb.slowest_step_dt), "auto"
    return float(cfg.stall_timeout), "stall"


def busy_timeout(hb: HeartbeatState, cfg: RunConfig) -> tuple[float, str]:
    """How long a rank may keep moving without a step or batch: --busy-timeout, or longer where its phase (checkpoint,
    eval) or its start-up (before its first step: loading, compiling) is allowed longer."""
    timeout, rule = cfg.busy_timeout, "busy"
    if hb.step == 0 and cfg.startup_timeout > timeout:
        timeout, rule = cfg.startup_timeout, "startup"
    option = PHASE_TIMEOUTS.get(hb.phase)
    if option is not None and float(getattr(cfg, option)) > timeout:
        timeout, rule = float(getattr(cfg, option)), hb.phase
    return timeout, rule


class Rules:
    """Evaluates the rules each poll; each episode is reported once. A hang (stall, frozen) is an episode until some
    rank makes progress (a step or a batch): a rank that crosses its own timeout meanwhile, or a frozen rank after a
    stall or the stall after a frozen rank, joins it rather than making a new incident."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._stall_reported: dict[int, float] = {}  # rank -> the job's last motion when reported
        self._frozen_reported: dict[tuple[int, int], int] = {}  # (rank, pid) -> liveness counter
        self._busy_reported: dict[tuple[int, int], float] = {}  # (rank, pid) -> last progress when reported
        self._death_reported: set[tuple[int, int]] = set()  # (rank, pid)
        self._hang_mark: Optional[float] = None  # the newest progress seen when a hang was reported
        self._steps: dict[tuple[int, int], tuple[int, float]] = {}  # (rank, pid) -> (step, when it was reached)
        self._begun_at: Optional[float] = None  # when training was first seen begun (a batch or a step)
        self._pause_reported: Optional[float] = None  # the job's last step when its slow phase was noted
        self._elsewhere: Optional[tuple[float, str]] = None  # another node moved after every rank here: when, which
        self._whole_world = False  # every rank of the job is among the views (a single-node job, all started)
        self.due: Optional[float] = None  # when the next rank's stall timeout runs out if nothing moves (monotonic)

    def _timeout(self, v: RankView, begun: bool) -> tuple[float, str]:
        """stall_timeout for this rank where it is now, its leaf included."""
        return stall_timeout(v.hb, self.cfg, begun, v.leaf, self._whole_world)

    def put_off(self, d: Detection) -> None:
        """A hang acted on by no one yet (its ranks outlive a crash being torn down): fired again at a later poll."""
        for f in d.findings:
            self._stall_reported.pop(f.rank, None)
            self._frozen_reported.pop((f.rank, f.pid), None)
            self._busy_reported.pop((f.rank, f.pid), None)
        if not d.same_episode:
            self._hang_mark = None

    def forget_hang(self) -> None:
        """The hang just reported was not one (its ranks moved meanwhile): the next is an incident of its own."""
        self._hang_mark = None

    def evaluate(self, views: list[RankView], now: float, remote: Optional[tuple[float, str]] = None
                 ) -> list[Detection]:  # fmt: skip
        """`remote`: when another node's ranks last moved, and which node (multi-node coordination): a rank that
        waits for a rank of another node that works is waiting too."""
        out = self._crashes(views, now)
        live = [v for v in views if v.alive and v.hb.state in LIVE_STATES]
        self.due = None
        if not live:
            return out
        newest = max(v.hb.last_progress for v in live)
        if self._hang_mark is not None and newest > self._hang_mark:
            self._hang_mark = None  # a rank progressed: the hang episode is over
        moved = max(v.moved_at for v in live)  # the job's last motion of any kind
        self._elsewhere = remote if remote is not None and remote[0] > moved else None
        if self._elsewhere is not None:
            moved = self._elsewhere[0]
        begun = any(v.hb.batches > 0 or v.hb.step > 0 for v in views)
        self._whole_world = len({v.rank for v in views}) >= max(v.hb.world_size for v in views)
        out.extend(self._frozen(live, now, moved, newest))
        out.extend(self._stall(live, now, moved, newest, begun))
        self.due = self._due(live, moved, begun)
        out.extend(self._busy(live, now))
        still = any(now - moved > self._timeout(v, begun)[0] for v in live)
        out.extend(self._slow_phase(live, now, moved, begun, still))
        return out

    def _due(self, live: list[RankView], moved: float, begun: bool) -> Optional[float]:
        """When the first rank not yet reported stalls if nothing moves: the watch polls then, not up to a poll
        interval later (a hang is caught at its timeout, whatever the poll's phase)."""
        timeouts = [self._timeout(v, begun)[0] for v in live if v.rank not in self._stall_reported]
        return moved + min(timeouts) if timeouts else None

    def _crashes(self, views: list[RankView], now: float) -> list[Detection]:
        out: list[Detection] = []
        # A rank whose main thread raised is about to die, and the launcher will then tear the others down:
        # this is the moment to catch the survivors. Its death afterwards is the same episode.
        raised = [v for v in views if v.alive and v.hb.state == "exception" and (v.rank, v.hb.pid) not in
                  self._death_reported]  # fmt: skip
        if raised:
            self._death_reported.update((v.rank, v.hb.pid) for v in raised)
            findings = tuple(self._finding(v, now, now - v.hb.last_progress, "exception") for v in raised)
            out.append(Detection("exception", _ids(raised), f"{plural_ranks(_ids(raised))} raised an uncaught "
                                 "exception and will exit", findings))  # fmt: skip
        deaths = [v for v in views if v.died and (v.rank, v.hb.pid) not in self._death_reported]
        if deaths:
            self._death_reported.update((v.rank, v.hb.pid) for v in deaths)
            findings = tuple(self._finding(v, now, 0.0, "death") for v in deaths)
            reasons = "; ".join(
                f"rank {v.rank} " + (v.exit_status or ("raised an exception" if v.hb.state == "exception"
                                                       else "was killed or exited abruptly"))
                for v in deaths
            )  # fmt: skip
            out.append(Detection("rank_death", _ids(deaths), reasons, findings))
        return out

    def _frozen(self, live: list[RankView], now: float, moved: float, newest: float) -> list[Detection]:
        """A rank whose liveness thread is silent (the GIL held, the process stopped), that reads and writes nothing,
        in a job where nothing else moves either: a hang of its own kind. A native call that holds the GIL while it
        writes a checkpoint is working (its I/O moves); one that holds it while a peer still works is let be until
        that peer stops too."""
        limit = self.cfg.frozen_timeout
        frozen = []
        for v in live:
            key = (v.rank, v.hb.pid)
            if (now - v.hb.liveness_time > limit and now - moved > limit
                    and self._frozen_reported.get(key) != v.hb.liveness):  # fmt: skip
                self._frozen_reported[key] = v.hb.liveness
                frozen.append(v)
        if not frozen:
            return []
        findings = tuple(self._finding(v, now, now - v.hb.liveness_time, "frozen", limit) for v in frozen)
        same = self._hang_mark is not None
        if not same:
            self._hang_mark = newest
        return [Detection(
            "frozen", _ids(frozen),
            "the process exists but its recorder thread has not run, it reads and writes nothing and no other rank "
            "moves: the GIL is held or the process is stopped",
            findings, same_episode=same,
        )]  # fmt: skip

    def _stall(self, live: list[RankView], now: float, moved: float, newest: float, begun: bool) -> list[Detection]:
        """Nothing moved on any rank for a rank's timeout: that rank is stalled (a rank that waits for a peer that
        moves is waiting, not stalled)."""
        stalled = []
        for v in live:
            timeout, _ = self._timeout(v, begun)
            if now - moved > timeout:
                stalled.append(v)
            else:
                self._stall_reported.pop(v.rank, None)  # motion again: re-arm
        fresh = [v for v in stalled if self._stall_reported.get(v.rank) != moved]
        if not fresh:
            return []
        for v in stalled:
            self._stall_reported[v.rank] = moved
        # the ranks under a longer timeout (start-up) have not moved either: they belong to the facts, the
        # stalled ones may be waiting for them
        quiet = [v for v in live if v not in stalled]
        findings = tuple(self._finding(v, now, now - v.moved_at, *self._timeout(v, begun)[::-1])
                         for v in stalled + quiet)  # fmt: skip
        same = self._hang_mark is not None
        if not same:
            self._hang_mark = newest
        ranks = _ids(fresh) if same else _ids(stalled)
        return [Detection("stall", ranks, "", findings, same_episode=same)]

    def _busy(self, live: list[RankView], now: float) -> list[Detection]:
        """A rank that keeps moving but takes no step or batch for its busy timeout: an endless loop, a retry storm.
        Once per pause of that rank."""
        busy = []
        for v in live:
            limit, _ = busy_timeout(v.hb, self.cfg)
            key = (v.rank, v.hb.pid)
            if now - v.moved_at > _recent(stall_timeout(v.hb, self.cfg)[0]) or now - v.hb.last_progress <= limit:
                continue
            if self._busy_reported.get(key) != v.hb.last_progress:
                self._busy_reported[key] = v.hb.last_progress
                busy.append(v)
        if not busy:
            return []
        others = [v for v in live if v not in busy]
        recent = _recent(min(stall_timeout(v.hb, self.cfg)[0] for v in live))
        findings = tuple(self._finding(v, now, now - v.hb.last_progress, *busy_timeout(v.hb, self.cfg)[::-1],
                                       doing=v.doing(now, recent)) for v in busy)  # fmt: skip
        findings += tuple(self._finding(v, now, now - v.moved_at, "waiting", doing=v.doing(now, recent))
                          for v in others)  # fmt: skip
        head = findings[0]
        reason = (f"{plural_ranks(_ids(busy))} kept moving but took no step or batch for {head.idle_s:.0f} s "
                  f"({head.timeout_rule} timeout {head.timeout_s:g} s): an endless loop or a retry storm?")  # fmt: skip
        return [Detection("busy", _ids(busy), reason, findings)]

    def _slow_phase(self, live: list[RankView], now: float, moved: float, begun: bool, still: bool) -> list[Detection]:
        """No rank has stepped for longer than a stall timeout, but the job moves: worth a line and an event (which
        rank, doing what, for how long, who waits), never an incident. Once per pause. The pause counts from the
        job's last step, or, before the first, from when training began (a batch taken): loading a model is the
        start-up's, not a pause. `still`: the stall rule has the job."""
        if begun and self._begun_at is None:
            self._begun_at = now
        for v in live:
            key = (v.rank, v.hb.pid)
            seen = self._steps.get(key)
            if seen is None or seen[0] != v.hb.step:
                self._steps[key] = (v.hb.step, v.hb.last_progress if seen is None else now)
        stepped = [self._steps[(v.rank, v.hb.pid)][1] for v in live if v.hb.step]
        last_step = max(stepped) if stepped else (self._begun_at or now)
        if self._pause_reported is not None and last_step > self._pause_reported:
            self._pause_reported = None
        limit = max(pause_timeout(v.hb, self.cfg)[0] for v in live)
        recent = _recent(limit)
        if not begun or still or self._pause_reported is not None or now - last_step <= limit or now - moved > recent:
            return []
        self._pause_reported = last_step
        moving = [v for v in live if now - v.moved_at <= recent]
        waiting = [v for v in live if v not in moving]
        findings = tuple(self._finding(v, now, now - last_step, pause_timeout(v.hb, self.cfg)[1], limit,
                                       doing=v.doing(now, recent)) for v in moving + waiting)  # fmt: skip
        one = len(moving) == 1
        if moving:
            parts = [f"{plural_ranks(_ids(moving))} {'has' if one else 'have'} taken no step for "
                     f"{now - last_step:.0f} s and still {'works' if one else 'work'}"]  # fmt: skip
        else:  # the motion is another node's
            node = self._elsewhere[1] if self._elsewhere is not None else "another node"
            parts = [f"no rank here has taken a step for {now - last_step:.0f} s; node {node} still works"]
        parts += [f"rank {f.rank}: {f.doing}" for f in findings if f.rank in _ids(moving)]
        parts.append(f"{plural_ranks(_ids(waiting))} {'waits' if len(waiting) == 1 else 'wait'} for "
                     f"{'it' if one or not moving else 'them'}" if waiting else "no rank waits")  # fmt: skip
        return [Detection("slow_phase", _ids(moving), "; ".join(parts) + " (not a stall: blackbox does nothing)",
                          findings)]  # fmt: skip

    @staticmethod
    def _finding(v: RankView, now: float, idle: float, rule: str, timeout: float = 0.0,
                 doing: str = "") -> RankFinding:  # fmt: skip
        return RankFinding(
            rank=v.rank, pid=v.hb.pid, step=v.hb.step, phase=v.hb.phase, collective=v.hb.collective,
            idle_s=round(idle, 3), timeout_s=timeout, timeout_rule=rule, state=v.hb.state,
            exit_status=v.exit_status, doing=doing,
        )  # fmt: skip


def _ids(views: list[RankView]) -> tuple[int, ...]:
    return tuple(sorted(v.rank for v in views))


# --- fatal console lines --------------------------------------------------------------------------------
# What the job prints when it is about to die: collect at once, before the launcher tears the others down.
FATAL_LINES: tuple[tuple[str, str], ...] = (
    ("comm_timeout", r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck|"
                     r"Timed out waiting \d+ ?ms for (?:recv|send) operation"),
    ("cuda_error", r"CUDA error: |CUBLAS_STATUS_[A-Z_]+|cuDNN error|NCCL error|nccl(?:UnhandledCuda|Internal|"
                   r"System|Invalid)(?:Error|Usage)|an illegal memory access was encountered"),
    ("oom", r"CUDA out of memory|OutOfMemoryError|\bout of memory\b"),
    ("segfault", r"Segmentation fault|Fatal Python error|SIGSEGV|SIGBUS|SIGABRT|core dumped"),
    ("child_failed", r"ChildFailedError"),
    ("exception", r"^Traceback \(most recent call last\):"),
)  # fmt: skip
_FATAL = re.compile("|".join(f"(?P<{kind}>{rx})" for kind, rx in FATAL_LINES), re.MULTILINE | re.IGNORECASE)
MAX_LINE = 4096
# What any fatal line contains, lower-cased (FATAL_LINES' patterns): a chunk with none of them costs no pattern.
_FATAL_CANDIDATES = (b"watchdog", b"timed out", b"cuda", b"cublas", b"cudnn", b"nccl", b"illegal memory",
                     b"out of memory", b"outofmemoryerror", b"segmentation fault", b"fatal python error", b"sigsegv",
                     b"sigbus", b"sigabrt", b"core dumped", b"childfailederror", b"traceback")  # fmt: skip


class FatalLines:
    """Finds fatal lines in the job's output as it streams (bytes cut anywhere); thread-safe. Each match is
    (kind, the line). Pure: the caller decides what to do about a match."""

    def __init__(self) -> None:
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def feed(self, data: bytes, stream: int = 0) -> list[tuple[str, str]]:
        with self._lock:
            buf = self._partial.pop(stream, b"") + data
            cut = buf.rfind(b"\n") + 1
            rest = buf[cut:]
            self._partial[stream] = rest[-MAX_LINE:]
        out: list[tuple[str, str]] = []
        lower = buf[:cut].lower()
        if not any(c in lower for c in _FATAL_CANDIDATES):  # the common case: one fast scan, no pattern at all
            return out
        for line in buf[:cut].decode("utf-8", "replace").splitlines():
            if not any(c in line.lower().encode() for c in _FATAL_CANDIDATES):
                continue
            m = _FATAL.search(line[:MAX_LINE])
            if m and m.lastgroup:
                out.append((m.lastgroup, line.strip()[:500]))
        return out
