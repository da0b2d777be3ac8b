"""The report model every renderer takes: plain dataclasses, versioned for `--format json`.
Imports the stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from typing import Any, Optional

REPORT_SCHEMA_VERSION = 1


@dataclass
class Verdict:
    category: str  # DESIGN.md §5: hang.collective, hang.compute, ..., crash.signal, ok
    phase: Optional[str]
    suspect_ranks: list[int]
    confidence: str  # high | medium | low
    summary: str


@dataclass
class RankRow:
    rank: int
    node: str
    pid: int
    state: str
    step: Optional[int]  # None: the rank ran without the recorder (a `blackbox collect` of a plain job)
    phase: str
    top_frame: Optional[str]  # needs stacks (py-spy / faulthandler): None until they are collected
    idle_s: Optional[float] = None
    alive: Optional[bool] = None
    collective: Optional[str] = None
    last_step_s: Optional[float] = None  # how long its last step took (recorder only)
    stage: str = ""  # where in its life: rendezvous, startup, training, exiting, exited (life_stage); "" unknown
    top_path: Optional[str] = None  # top_frame's file from the job's git work tree (`scripts/train.py`), where known


@dataclass
class Finding:
    kind: str  # observed | inferred
    text: str
    source: Optional[str] = None  # the bundle file it was read from (observed) or why it is believed (inferred)


@dataclass
class Report:
    run_id: str
    node: str
    trigger: str
    bundle: str
    verdict: Verdict
    ranks: list[RankRow]
    findings: list[Finding]
    next_actions: list[str]
    console_tail: list[str] = field(default_factory=list)
    stack_groups: list[Any] = field(default_factory=list)
    collectives: list[Any] = field(default_factory=list)  # per group: the first collective not every rank joined
    # per rank: {"rank", "node", "samples": [[wall time, step, phase]], "last_progress": wall time | None}, and
    # which rank stopped progressing first; "end": when the bundle was made
    timeline: dict[str, Any] = field(default_factory=dict)
    # per GPU: {"index", "name", "samples": [[wall time, utilisation %, temperature C]]} (the supervisor's watch)
    gpus: list[Any] = field(default_factory=list)
    # the first exception that explains the verdict: {"rank", "type", "message" (one line), "frame" (the innermost
    # user frame, "function (file:line)"), "path" (its file from the job's git work tree, where known)}; None when no
    # rank raised one
    exception: Optional[dict[str, Any]] = None
    # earlier incidents of the local index with the same fingerprint ("same") or the same category and top frame
    # ("similar"), newest first, each with its linked fix (blackbox.incidents)
    similar_incidents: list[Any] = field(default_factory=list)
    # where the time went (analyze.timeshare): {"ranks": [{"rank", "node", "seconds", "shares": {phase: fraction}}],
    # "data_share": all ranks' time in data, as a fraction (None without time ledgers), "stragglers": the episodes
    # the supervisor named: [{"rank", "phase", "factor", "started", "ended", "shares", "others_shares"}]}
    time: dict[str, Any] = field(default_factory=dict)
    # what each rank's evidence is (analyze.evidence): [{"rank", "stack": [sources], "position": [sources], "memory",
    # "last_words": [what], "why": why it wrote no dump of its own (None: it did, or it was not asked), "complete"}]
    evidence: list[Any] = field(default_factory=list)
    schema_version: int = REPORT_SCHEMA_VERSION

    def headline(self) -> list[str]:
        """The verdict in three plain lines: what, why, what to do first (for `blackbox run`'s stderr)."""
        v = self.verdict
        suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
        lines = [f"verdict: {v.category}, suspect rank(s) {suspects}, phase {v.phase or '?'}, "
                 f"confidence {v.confidence}", v.summary]  # fmt: skip
        if self.next_actions:
            lines.append(f"next: {self.next_actions[0]}")
        return lines

    def after_training(self) -> bool:
        """A hang whose every suspect has finished training and cannot exit (life stage `exiting`): a job ended for
        it has done its work, and is not to be run again."""
        stages = {r.rank: r.stage for r in self.ranks}
        suspects = self.verdict.suspect_ranks
        return self.verdict.category.startswith("hang.") and bool(suspects) and all(
            stages.get(rank) == "exiting" for rank in suspects)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        data = _plain(self)
        return {"schema_version": data.pop("schema_version"), **data}


def describe_seen(entry: dict[str, Any]) -> str:
    """One line for a "seen before" entry: which incident, when, and what fixed it."""
    when = str(entry.get("created") or "?")[:10]
    what = "the same failure" if entry.get("match") == "same" else "a similar failure (same place, other message)"
    line = f"incident #{entry.get('id')} on {when} (run {entry.get('run_id')}): {what}"
    fix = entry.get("fix")
    if isinstance(fix, dict):
        line += f"; {fix.get('status')}"
        if fix.get("fix_commit"):
            line += f" in {str(fix['fix_commit'])[:12]}"
        if fix.get("fix_config_name"):
            line += f" with {fix['fix_config_name']}"
        if fix.get("rerun_outcome"):
            line += f"; rerun: {fix['rerun_outcome']}"
        if fix.get("note"):
            line += f" — {fix['note']}"
    else:
        line += "; no fix linked (blackbox incidents link " + str(entry.get("id")) + " …)"
    return line


_LEAVES = (str, int, float, bool, type(None))


def _plain(obj: Any) -> Any:
    """Dataclasses to dicts, tuples to lists — like dataclasses.asdict, without its deep copies. Leaves are kept
    without a call of their own: most of a 32,768-rank report is leaves."""
    if type(obj) in _LEAVES:
        return obj
    if isinstance(obj, dict):
        return {k: v if type(v) in _LEAVES else _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [v if type(v) in _LEAVES else _plain(v) for v in obj]
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: v if type(v) in _LEAVES else _plain(v) for k, v in obj.__dict__.items()}
    return obj
