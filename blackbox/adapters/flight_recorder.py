"""PyTorch's flight recorder: reads raw per-rank dumps without executing anything (adapters.plainpickle),
normalises Gloo dumps so torch's own analyzer can read them, and reads `pg_status` directly. Imports the stdlib,
adapters.plainpickle and adapters.stacks; torch's analyzer is run as a separate process."""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .plainpickle import PlainPickleError, load_plain_dict
from .stacks import first_user_frame

MAX_DUMP_BYTES = 256 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"(\d+)$")


class FlightRecorderError(Exception):
    pass


def load_dump(data: bytes) -> dict[str, Any]:
    try:
        return load_plain_dict(data, MAX_DUMP_BYTES, "dump", "entries", "flight-recorder trace")
    except PlainPickleError as exc:
        raise FlightRecorderError(str(exc)) from None


def normalise(dump: dict[str, Any]) -> dict[str, Any]:
    """Gloo dumps key `pg_config` by '' while entries name their group ('0', 'default_pg'); torch's analyzer
    (2.13) then fails with KeyError. Key each group's config by the id its entries use."""
    out = dict(dump)
    config = dict(dump.get("pg_config") or {})
    groups = {}
    for entry in dump.get("entries") or []:
        pg = entry.get("process_group") if isinstance(entry, dict) else None
        if isinstance(pg, (tuple, list)) and len(pg) == 2:
            groups[str(pg[0])] = str(pg[1])
    if "" in config and groups:
        blank = config.pop("")
        for pg_id, name in groups.items():
            if pg_id not in config:
                fixed = dict(blank) if isinstance(blank, dict) else {}
                fixed["name"] = fixed.get("name") or name
                fixed["desc"] = fixed.get("desc") or name
                config[pg_id] = fixed
    out["pg_config"] = config
    return out


@dataclass(frozen=True)
class GroupStatus:
    rank: int
    group: str
    last_enqueued: int
    last_started: int
    last_completed: int


def rank_of(filename: str) -> Optional[int]:
    m = _RANK_SUFFIX.search(os.path.basename(filename))
    return int(m.group(1)) if m else None


def _seq(status: dict[Any, Any], key: str) -> int:
    """A sequence number of `pg_status` (an int, or a string of digits in some releases); -1 when absent or odd."""
    value = status.get(key, -1)
    if isinstance(value, str) and value.lstrip("-").isascii() and value.lstrip("-").isdigit() and len(value) < 19:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _gloo_retired(dump: dict[str, Any]) -> dict[str, int]:
    """Per group id, the highest gloo collective the dump marks retired: gloo's `last_completed_collective` lags
    (it is updated lazily), while a retired gloo entry is one whose work has finished on this rank."""
    out: dict[str, int] = {}
    for e in dump.get("entries") or []:
        if not (isinstance(e, dict) and e.get("retired") is True and not e.get("is_p2p")
                and str(e.get("profiling_name", "")).startswith("gloo:")):  # fmt: skip
            continue
        seq = _seq(e, "collective_seq_id")
        gid = str(e.get("pg_id"))
        if seq > out.get(gid, -1):
            out[gid] = seq
    return out


def pg_status(rank: int, dump: dict[str, Any]) -> list[GroupStatus]:
    """Each group's last enqueued / started / completed collective, as the dump says (untrusted: what is not a
    table of numbers is left out), gloo's lagging completed count raised to its retired entries."""
    groups = dump.get("pg_status")
    retired = _gloo_retired(dump)
    out = []
    for group, status in sorted(groups.items(), key=lambda kv: str(kv[0])) if isinstance(groups, dict) else []:
        if isinstance(status, dict):
            enqueued = _seq(status, "last_enqueued_collective")
            completed = max(_seq(status, "last_completed_collective"), min(retired.get(str(group), -1), enqueued))
            out.append(GroupStatus(rank, str(group), enqueued, _seq(status, "last_started_collective"), completed))
    return out


def newer_than(dump: dict[str, Any], t_ns: int) -> int:
    """How many collectives the dump shows after `t_ns` (blackbox's collection began then): the rank moved on once
    collected — its dump signal ends a native sleep early — and its dump was written later than that. Its entries
    created later, and, in a group whose count of enqueued collectives runs ahead of its newest entry (the dump was
    taken as the rank entered its next collective, counted before recorded), those too."""
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    return sum(1 for e in entries if _created(e) > t_ns) + sum(_ahead(dump, entries).values())


def _ahead(dump: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, int]:
    """Per group that has entries, how far its `last_enqueued_collective` runs ahead of its newest entry."""
    newest: dict[str, int] = {}  # group -> its newest entry's sequence number: one pass over the entries
    for e in entries:
        if not e.get("is_p2p"):
            group = _group_of(e)
            newest[group] = max(newest.get(group, -1), _seq(e, "collective_seq_id"))
    status = dump.get("pg_status")
    out: dict[str, int] = {}
    for group, st in status.items() if isinstance(status, dict) else []:
        last = newest.get(str(group))
        if last is not None and isinstance(st, dict) and _seq(st, "last_enqueued_collective") > last:
            out[str(group)] = _seq(st, "last_enqueued_collective") - last
    return out


def _created(e: dict[str, Any]) -> int:
    t = e.get("time_created_ns")
    return t if isinstance(t, int) and not isinstance(t, bool) else -1


def as_of(dump: dict[str, Any], t_ns: int, waiting: bool) -> dict[str, Any]:
    """The dump as it stood at `t_ns`: the entries created later left out, and each group they belonged to (or whose
    enqueued count ran ahead of its entries) counted again from the entries kept — its last collective enqueued,
    still pending when the rank was `waiting` in a collective then (gloo records no completion time: another source
    says whether the rank was inside it); its point-to-point counters, which entries cannot restore, dropped."""
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    later = [e for e in entries if _created(e) > t_ns]
    groups = {_group_of(e) for e in later} | set(_ahead(dump, entries))
    if not groups:
        return dump
    kept = [e for e in entries if _created(e) <= t_ns]
    status = dict(dump["pg_status"]) if isinstance(dump.get("pg_status"), dict) else {}
    pending: set[int] = set()  # ids of the entries still pending then
    for group in groups:
        own = [e for e in kept if in_group(e, group) and not e.get("is_p2p")]
        last = max((_seq(e, "collective_seq_id") for e in own), default=-1)
        old = status.get(group)
        started = _seq(old, "last_started_collective") if isinstance(old, dict) else -1
        status[group] = {"last_enqueued_collective": last, "last_started_collective": min(started, last),
                         "last_completed_collective": last - 1 if waiting and last >= 0 else last}  # fmt: skip
        if waiting:
            pending.update(id(e) for e in own if _seq(e, "collective_seq_id") == last)
    kept = [{**e, "retired": False, "state": "scheduled"} if id(e) in pending else e for e in kept]
    return {**dump, "entries": kept, "pg_status": status}


def _group_of(e: dict[str, Any]) -> str:
    """The `pg_status` key of an entry's group: its `pg_id` where it has one, else its group's name."""
    if e.get("pg_id") is not None:
        return str(e.get("pg_id"))
    pg = e.get("process_group")
    return str(pg[0]) if isinstance(pg, (tuple, list)) and pg else ""


P2P = "/p2p"  # the suffix of a pair's point-to-point stream, counted apart from its collectives


def p2p_status(rank: int, dump: dict[str, Any], pairs: set[str]) -> list[GroupStatus]:
    """Each 2-rank group's last enqueued / started / completed send or recv (`pg_status`'s p2p counters, torch >=
    2.5), as the group id + P2P: within a pair both ranks count the same sends and recvs, so the lower completed
    count is the one a peer never posted."""
    groups = dump.get("pg_status")
    out = []
    for group, status in sorted(groups.items(), key=lambda kv: str(kv[0])) if isinstance(groups, dict) else []:
        if isinstance(status, dict) and str(group) in pairs and "last_enqueued_p2p" in status:
            out.append(GroupStatus(rank, str(group) + P2P, _seq(status, "last_enqueued_p2p"),
                                   _seq(status, "last_started_p2p"), _seq(status, "last_completed_p2p")))  # fmt: skip
    return out


def members(dumps: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    """Per group (its `pg_status` key, the group's id): its global ranks, from `pg_config` (keyed by the group's
    name, which the entries pair with the id). Untrusted: a group whose ranks cannot be read is left out."""
    out: dict[str, list[int]] = {}
    for dump in dumps.values():
        config = dump.get("pg_config")
        config = config if isinstance(config, dict) else {}
        names: dict[str, str] = {}
        for e in dump.get("entries") or []:
            pg = e.get("process_group") if isinstance(e, dict) else None
            if isinstance(pg, (tuple, list)) and pg and e.get("pg_id") is not None:
                names.setdefault(str(e.get("pg_id")), str(pg[0]))
        for gid in (dump.get("pg_status") or {}) if isinstance(dump.get("pg_status"), dict) else {}:
            gid = str(gid)
            info = config.get(names.get(gid, gid)) or config.get(gid) or (config.get("") if len(config) == 1 else None)
            ranks = info.get("ranks") if isinstance(info, dict) else None
            text = ranks if isinstance(ranks, str) else " ".join(map(str, ranks)) if isinstance(ranks, list) else ""
            found = [int(r) for r in re.findall(r"-?\d+", text[:1_000_000])]
            if found and gid not in out:
                out[gid] = sorted(set(found))
    return out


@dataclass(frozen=True)
class Stuck:
    """Per group: the collective the group is stuck at — the lowest sequence number the group has not completed —
    the ranks that enqueued it and wait, the ranks that never enqueued it, and the members with no trace of it."""

    group: str
    seq: int
    waiting: list[int]
    missing: list[int]
    untraced: list[int]  # members without a status, or whose status is older than their peers' (stale)
    late: list[int] = field(default_factory=list)  # in `waiting`: entered it after their dump was written (`entered`)


def idle(statuses: list[GroupStatus]) -> bool:
    """Whether a rank's dump has no collective pending in any group: it was between collectives when it wrote it."""
    return all(s.last_enqueued <= s.last_completed for s in statuses)


def stuck(statuses: list[GroupStatus], member_ranks: Optional[dict[str, list[int]]] = None,
          entered: Optional[dict[int, str]] = None) -> list[Stuck]:  # fmt: skip
    """Per group, the collective it is stuck at (not the furthest one any rank enqueued: a rank that ran ahead less
    is a victim too). A collective of the whole group completes on every member or on none, so the group has
    completed what its furthest member says it completed (a member's own count may lag: gloo retires work lazily);
    the stuck collective is the next one. A member that enqueued it waits in it; one that enqueued everything before
    it and not it never entered it; one that did not even enqueue what the group completed wrote its status earlier
    (a dump taken before the others'): its word on the stuck collective is unknown. Groups where nothing is pending
    are left out. `entered`: ranks another source puts inside a collective while their dump has none pending (each
    source is read at its own moment, and a rank may still arrive while a job is collected): one the dump says never
    entered the stuck collective is counted as waiting in it, a late arrival, not as the rank the others wait for."""
    by_group: dict[str, list[GroupStatus]] = {}
    for s in statuses:
        by_group.setdefault(s.group, []).append(s)
    out = []
    for group, ss in sorted(by_group.items()):
        done = max(s.last_completed for s in ss)
        seq = done + 1
        if max(s.last_enqueued for s in ss) < seq:
            continue
        late = sorted(s.rank for s in ss if s.last_enqueued == done and s.rank in (entered or {}))
        waiting = sorted([s.rank for s in ss if s.last_enqueued >= seq] + late)
        missing = sorted(s.rank for s in ss if s.last_enqueued == done and s.rank not in late)
        stale = {s.rank for s in ss if s.last_enqueued < done}
        untraced = sorted((set((member_ranks or {}).get(group, [])) - {s.rank for s in ss}) | stale)
        out.append(Stuck(group, seq, waiting, missing, untraced, late))
    return out


def write_normalised(dumps: dict[str, dict[str, Any]], out_dir: str) -> None:
    """Write normalised dumps (file name -> dump) where torch's analyzer can read them as a set."""
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    for name, dump in dumps.items():
        with open(os.path.join(out_dir, os.path.basename(name)), "wb") as f:
            pickle.dump(normalise(dump), f)


@dataclass(frozen=True)
class Unjoined:
    """The collective a group is stuck at, where not every member entered it."""

    group: str
    group_name: str
    seq: int  # the collective's sequence number in its group
    op: str  # "all_reduce"
    missing: list[int]  # ranks that never enqueued it
    waiting: list[int]  # ranks that did, and wait in it
    where: Optional[str]  # the user frame it was called from, on a waiting rank: "train.py:88"
    last_seen: dict[int, str]  # per missing rank: the user frame of its last recorded collective
    untraced: list[int] = field(default_factory=list)  # members without a trace (their dump is not in the bundle)


def _user_frame(entry: dict[str, Any]) -> Optional[str]:
    return first_user_frame(entry.get("frames"))


def in_group(e: Any, group: str) -> bool:
    """Whether an entry belongs to the group `pg_status` keys as `group`: by its `pg_id` where it has one (the key is
    the id; a subgroup's name may be a hash), else by its group's name."""
    return isinstance(e, dict) and _group_of(e) == group


def entry(dump: dict[str, Any], group: str, seq: int) -> Optional[dict[str, Any]]:
    """The entry of collective `seq` of `group` in one rank's dump."""
    for e in reversed(dump.get("entries") or []):
        if in_group(e, group) and e.get("collective_seq_id") == seq and not e.get("is_p2p"):
            return dict(e)
    return None


def op_name(e: Optional[dict[str, Any]], default: str = "collective") -> str:
    """`nccl:all_reduce` -> `all_reduce`."""
    return str(e.get("profiling_name") or default).split(":")[-1] if e else default


def group_name(e: Optional[dict[str, Any]], group: str) -> str:
    """A group's name as its entries give it (`default_pg`, `tp`), else its id."""
    pg = e.get("process_group") if e else None
    return str(pg[1] or pg[0]) if isinstance(pg, (tuple, list)) and len(pg) == 2 else group


def _last_entry(dump: dict[str, Any], group: str) -> Optional[dict[str, Any]]:
    for e in reversed(dump.get("entries") or []):
        if in_group(e, group) and not e.get("is_p2p"):
            return dict(e)
    return None


def unjoined(dumps: dict[int, dict[str, Any]], extra: Optional[list[GroupStatus]] = None,
             ops: Optional[dict[tuple[str, int], str]] = None,
             entered: Optional[dict[int, str]] = None) -> list[Unjoined]:  # fmt: skip
    """From every rank's dump (rank -> dump), and statuses read elsewhere (`extra`: the NCCL watchdog's lines, with
    their ops by (group, seq)): per group, the collective it is stuck at and the members that never entered it,
    with the op and where it was called. `entered`: as for `stuck`."""
    statuses = [s for rank, d in dumps.items() for s in pg_status(rank, d)] + list(extra or [])
    out = []
    for st in stuck(statuses, members(dumps), entered):
        if not st.missing and not st.untraced:
            continue
        op, where, name = (ops or {}).get((st.group, st.seq), "collective"), None, st.group
        for rank in st.waiting:
            e = entry(dumps[rank], st.group, st.seq) if rank in dumps else None
            if e is not None:
                op, where, name = op_name(e), _user_frame(e), group_name(e, st.group)
                break
        last_seen = {}
        for rank in st.missing:
            e = _last_entry(dumps.get(rank, {}), st.group)
            frame = _user_frame(e) if e is not None else None
            if frame:
                last_seen[rank] = frame
        out.append(Unjoined(st.group, name, st.seq, op, st.missing, st.waiting, where, last_seen, st.untraced))
    return out


@dataclass(frozen=True)
class Mismatch:
    """A collective number every rank entered, but not as the same operation (or not with the same sizes)."""

    group: str
    group_name: str
    seq: int
    calls: dict[str, list[int]]  # "all_reduce [[1, 8]]" -> the ranks that called it so
    where: dict[str, str]  # the same key -> the user frame it was called from


def mismatches(dumps: dict[int, dict[str, Any]], entered: Optional[dict[int, str]] = None) -> list[Mismatch]:
    """Per group, the collective it is stuck at, when the ranks that enqueued it did not all enqueue the same one. A
    late arrival (`entered`, as for `stuck`: no entry of its own) joins the one call of the op it is in."""
    statuses = [s for rank, d in dumps.items() for s in pg_status(rank, d)]
    out = []
    for st in stuck(statuses, entered=entered):
        group, seq = st.group, st.seq
        if len(st.waiting) < 2:
            continue
        calls: dict[str, list[int]] = {}
        where: dict[str, str] = {}
        name = group
        for rank in st.waiting:
            e = entry(dumps[rank], group, seq)
            if e is None:
                continue
            name = group_name(e, group)
            key = f"{op_name(e, '?')} {e.get('input_sizes')}"
            calls.setdefault(key, []).append(rank)
            frame = _user_frame(e)
            if frame:
                where.setdefault(key, frame)
        for rank in st.late:
            same = [key for key in calls if key.split(" ")[0] == (entered or {}).get(rank)]
            if len(same) == 1:
                calls[same[0]].append(rank)
        if len(calls) > 1:
            out.append(Mismatch(group, name, seq, {k: sorted(v) for k, v in calls.items()}, where))
    return out


def torch_analyzer(dumps: dict[str, dict[str, Any]], timeout: float = 120.0) -> tuple[Optional[str], str]:
    """Run PyTorch's own analyzer (`python -m torch.distributed.flight_recorder.fr_trace`) on normalised
    copies of the dumps — re-pickled from plain data, so nothing from the bundle is unpickled by torch.
    Returns (its output, how it went)."""
    import importlib.util
    import subprocess
    import sys
    import tempfile

    if importlib.util.find_spec("torch") is None:
        return None, "PyTorch's analyzer was not run: torch is not installed in blackbox's environment"
    with tempfile.TemporaryDirectory(prefix="blackbox-fr-") as tmp:
        write_normalised(dumps, tmp)
        try:
            res = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp],
                                 capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"PyTorch's analyzer did not finish: {exc}"
    text = (res.stdout + res.stderr).strip()
    if res.returncode != 0:
        return text or None, f"PyTorch's analyzer failed (exit code {res.returncode})"
    return text, "PyTorch's analyzer ran"


_MISSING = re.compile(r"missing ranks: \{([\d, ]+)\}")


def analyzer_missing_ranks(output: str) -> list[int]:
    """The ranks PyTorch's analyzer says never joined (its "missing ranks: {1}" lines)."""
    ranks: set[int] = set()
    for m in _MISSING.finditer(output or ""):
        ranks.update(int(r) for r in m.group(1).replace(" ", "").split(",") if r)
    return sorted(ranks)


@dataclass(frozen=True)
class Arrivals:
    """Who came last to the collectives every rank recorded: the one the others waited for."""

    group: str
    collectives: int  # collectives of the group in every rank's dump (the newest MAX_ARRIVALS)
    last: dict[int, int]  # rank -> how many of them it entered last

    def latest(self) -> tuple[int, int]:
        """(the rank that came last most often, how often)."""
        rank = max(self.last, key=lambda r: (self.last[r], -r))
        return rank, self.last[rank]

    def agrees(self, named: set[int]) -> bool:
        """Whether the rank that came last most often is one of `named`, and more often than chance would have it."""
        last, times = self.latest()
        return last in named and times > self.collectives / len(self.last)

    def describe(self, named: set[int]) -> str:
        last, times = self.latest()
        return (f"the flight recorder {'agrees' if self.agrees(named) else 'does not agree'}: rank {last} came last "
                f"to {times} of the {self.collectives} newest collectives of group {self.group}")  # fmt: skip


MAX_ARRIVALS = 500  # the newest collectives compared per group


def arrivals(dumps: dict[int, dict[str, Any]]) -> list[Arrivals]:
    """Per group: for each collective (by sequence number) every rank's dump holds, the rank whose entry was created
    last (`time_created_ns`: when the rank enqueued it). On one node the clocks are one; across nodes they differ by
    the hosts' skew. Untrusted input: entries without a group, sequence number or time are left out."""
    created: dict[str, dict[int, dict[int, int]]] = {}  # group -> seq -> rank -> time
    for rank, dump in dumps.items():
        for e in dump.get("entries") or []:
            if not isinstance(e, dict) or e.get("is_p2p"):
                continue
            pg, seq, t = e.get("process_group"), e.get("collective_seq_id"), e.get("time_created_ns")
            if isinstance(pg, (tuple, list)) and pg and isinstance(seq, int) and isinstance(t, int):
                created.setdefault(str(pg[0]), {}).setdefault(seq, {})[rank] = t
    out = []
    for group, by_seq in sorted(created.items()):
        common = sorted(seq for seq, times in by_seq.items() if len(times) == len(dumps))[-MAX_ARRIVALS:]
        if len(dumps) < 2 or not common:
            continue
        last: dict[int, int] = dict.fromkeys(sorted(dumps), 0)
        for seq in common:
            times = by_seq[seq]
            last[max(times, key=lambda r: (times[r], r))] += 1
        out.append(Arrivals(group, len(common), last))
    return out
