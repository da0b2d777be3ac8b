"""The words both sides of blackbox use about an incident: a detection and its per-rank findings, why a bundle was
taken (its trigger), the rule kinds (hang or crash), rank ranges ("0-2, 5") and a rank's life stage. Neither the
supervisor's nor the report's: the supervisor writes a detection, the collector records it, the analysis reads it.
Imports the stdlib only."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

# kind "hang": collected, then the job is ended by --on-stall kill (busy: by --on-busy kill)
HANG_RULES = ("stall", "frozen", "gpu_idle", "busy")
NOTE_RULES = ("slow_phase",)  # not incidents: a long pause while the job still moves is an event and a line
CRASH_RULES = ("exception", "rank_death", "console", "exit")  # kind "crash": what follows is the same episode


ON_REQUEST_RULES = ("manual", "signal")  # SIGUSR1 or `blackbox collect`; a termination signal passed on to the job


def incident_kind(rule: str) -> str:
    return "hang" if rule in HANG_RULES else "crash" if rule in CRASH_RULES else rule


@dataclass(frozen=True)
class Trigger:
    """Why a bundle was taken, as data: the rule that fired (stall, frozen, busy, exception, rank_death, console,
    gpu_idle, exit; manual or signal on request), the kind of fatal line for `console` (comm_timeout, cuda_error, oom,
    segfault, child_failed), and whether this node collected for another node's incident. `name` is how bundle file
    names, the manifest's `trigger` and `BLACKBOX_TRIGGER` spell it: `stall`, `rank-death`, `remote-console-oom`."""

    rule: str
    kind: Optional[str] = None
    remote: bool = False

    @property
    def name(self) -> str:
        base = self.rule.replace("_", "-") + (f"-{self.kind.replace('_', '-')}" if self.kind else "")
        return f"remote-{base}" if self.remote else base

    @property
    def on_request(self) -> bool:
        return self.rule in ON_REQUEST_RULES

    def joined(self) -> Trigger:
        """The same trigger, as another node collects for it."""
        return Trigger(self.rule, self.kind, remote=True)

    def to_json(self) -> dict[str, object]:
        return {"rule": self.rule, "kind": self.kind, "remote": self.remote}

    @classmethod
    def from_json(cls, value: object, name: object = None) -> Trigger:
        """From a manifest's `triggered_by` (untrusted), else from the `trigger` name alone (bundles written before
        the trigger travelled as data)."""
        if isinstance(value, dict) and isinstance(value.get("rule"), str) and value["rule"]:
            kind = value.get("kind")
            return cls(value["rule"], kind if isinstance(kind, str) and kind else None, value.get("remote") is True)
        return cls.parse(str(name or "unknown"))

    @classmethod
    def parse(cls, name: str) -> Trigger:
        """A trigger's name read back: `remote-console-oom` -> console, oom, remote."""
        remote = name.startswith("remote-")
        base = name[len("remote-") :] if remote else name
        if base.startswith("console-"):
            return cls("console", base[len("console-") :].replace("-", "_") or None, remote)
        rule = base.replace("-", "_") or "unknown"
        return cls("manual" if rule in ("collect", "sigusr1") else rule, None, remote)


@dataclass(frozen=True)
class RankFinding:
    rank: int
    pid: int
    step: int
    phase: str
    collective: str
    idle_s: float  # seconds since last progress (stall) or since the last liveness bump (frozen)
    timeout_s: float
    timeout_rule: str  # the timeout: startup, first_batch, stall, auto, leaf <name>, checkpoint, eval, busy, frozen
    state: str
    exit_status: Optional[str] = None
    doing: str = ""  # how it moves (or that it waits), for the lines of busy and slow_phase

    def describe(self) -> str:
        where = self.phase
        if self.phase == "collective" and self.collective != "none":
            where = f"collective {self.collective}"
        return f"rank {self.rank} (pid {self.pid}, step {self.step}, {where})"


_HEADS = {"busy": "busy", "slow_phase": "slow phase", "exception": "exception", "gpu_idle": "GPU idle"}


@dataclass(frozen=True)
class Detection:
    """What a rule saw: the ranks it fired on and why. Which ranks *cause* the incident is not the rule's to
    say: that is the analysis's blame (blackbox.analyze.blame), made on the bundle's evidence."""

    rule: str  # stall | frozen | busy | exception | rank_death | console | gpu_idle; slow_phase (a note)
    ranks: tuple[int, ...]
    reason: str  # what the rule saw, one sentence
    findings: tuple[RankFinding, ...]
    same_episode: bool = False  # part of an incident already reported (a stall's waiting ranks, a moment later)

    def message(self) -> str:
        ranks = rank_ranges(self.ranks)
        if self.rule == "stall":
            f = self.findings[0] if self.findings else None
            still = min(x.idle_s for x in self.findings) if self.findings else 0.0  # the job's stillness
            head = f"stall: {plural_ranks(self.ranks)} made no progress" + (
                f" of any kind for {still:.0f} s ({f.timeout_rule} timeout {f.timeout_s:g} s)" if f else ""
            )  # fmt: skip
            return f"{head}; {self.reason}" if self.reason else head
        if self.rule in _HEADS:  # the reason says it all
            return f"{_HEADS[self.rule]}: {self.reason}"
        if self.rule == "console":
            return f"fatal output: {self.reason}; collecting before the launcher tears the ranks down"
        if self.rule == "frozen":
            return f"frozen: {plural_ranks(self.ranks)} stopped answering (liveness thread silent); {self.reason}"
        return f"rank death: {'rank' if len(self.ranks) == 1 else 'ranks'} {ranks} exited without finishing; " + (
            self.reason)  # fmt: skip


def human_bytes(n: float) -> str:
    """Bytes as people read them in a line: `412 MB`, `1.5 GB`, `8.9 kB`, `700 B` (decimal units, as `df -H`)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.0f} {unit}" if n >= 10 * size else f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def rank_ranges(ranks: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2, 5'."""
    parts: list[str] = []
    items = sorted(ranks)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(parts)


def plural_ranks(ranks: Sequence[int]) -> str:
    """'rank 3' / 'ranks 0-2, 5'."""
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def straggler_episodes(events: Iterable[object]) -> list[dict[str, Any]]:
    """Each straggler episode the supervisor named, from its events (`straggler`, `straggler_end`; untrusted where
    they come from a bundle): rank, phase, factor, started, ended (None while it lasts), and the rank's per-phase
    shares and the others' as the event said them."""
    out: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("event") not in ("straggler", "straggler_end"):
            continue
        for r in e["ranks"] if isinstance(e.get("ranks"), list) else []:
            if not isinstance(r, int) or isinstance(r, bool):
                continue
            if e["event"] == "straggler_end":
                if r in open_:
                    open_.pop(r)["ended"] = e.get("time")
                continue
            details = e["details"] if isinstance(e.get("details"), dict) else {}
            d = details[str(r)] if isinstance(details.get(str(r)), dict) else {}
            factor = d.get("factor", e.get("factor"))
            good = isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor)
            episode = {"rank": r, "phase": str(d.get("phase", e.get("phase"))), "factor": factor if good else None,
                       "started": e.get("time"), "ended": None, "shares": d.get("shares"),
                       "others_shares": d.get("others_shares")}  # fmt: skip
            out.append(episode)
            open_[r] = episode
    return out


def life_stage(step: Optional[int], state: str, alive: Optional[bool], setup: bool, exiting: bool) -> str:
    """Where in its life a rank is: `exiting` (its interpreter is exiting: it ran its exit handlers, or joins its
    threads at exit — training is over), `exited` (it has, cleanly), `rendezvous` (waiting in process-group set-up),
    `startup` (no step yet), `training`; "" without the recorder's step count and no other sign. A rank that died
    keeps the stage it died in."""
    if state == "exited" and alive is False:
        return "exited"
    if exiting or state == "exited":
        return "exiting"
    if setup:
        return "rendezvous"
    if step is None:
        return ""
    return "startup" if step == 0 else "training"
