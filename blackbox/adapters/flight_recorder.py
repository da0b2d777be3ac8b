"""PyTorch's flight recorder: reads raw per-rank dumps without executing anything (adapters.plainpickle),
normalises Gloo dumps so torch's own analyzer can read them, and reads `pg_status` directly. Imports the stdlib,
adapters.plainpickle and adapters.stacks; torch's analyzer is run as a separate process."""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass
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


def pg_status(rank: int, dump: dict[str, Any]) -> list[GroupStatus]:
    """Each group's last enqueued / started / completed collective, as the dump says (untrusted: what is not a
    table of numbers is left out)."""
    groups = dump.get("pg_status")
    out = []
    for group, status in sorted(groups.items(), key=lambda kv: str(kv[0])) if isinstance(groups, dict) else []:
        if isinstance(status, dict):
            out.append(GroupStatus(rank, str(group), _seq(status, "last_enqueued_collective"),
                                   _seq(status, "last_started_collective"),
                                   _seq(status, "last_completed_collective")))  # fmt: skip
    return out


def missing_ranks(statuses: list[GroupStatus]) -> dict[str, tuple[int, list[int]]]:
    """Per group: the furthest collective any rank enqueued, and the ranks that never enqueued it."""
    out: dict[str, tuple[int, list[int]]] = {}
    by_group: dict[str, list[GroupStatus]] = {}
    for s in statuses:
        by_group.setdefault(s.group, []).append(s)
    for group, members in by_group.items():
        top = max(m.last_enqueued for m in members)
        behind = sorted(m.rank for m in members if m.last_enqueued < top)
        if behind:
            out[group] = (top, behind)
    return out


def write_normalised(dumps: dict[str, dict[str, Any]], out_dir: str) -> None:
    """Write normalised dumps (file name -> dump) where torch's analyzer can read them as a set."""
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    for name, dump in dumps.items():
        with open(os.path.join(out_dir, os.path.basename(name)), "wb") as f:
            pickle.dump(normalise(dump), f)


@dataclass(frozen=True)
class Unjoined:
    """The first collective of a group that not every rank entered."""

    group: str
    group_name: str
    seq: int  # the collective's sequence number in its group
    op: str  # "all_reduce"
    missing: list[int]  # ranks that never enqueued it
    waiting: list[int]  # ranks that did, and wait in it
    where: Optional[str]  # the user frame it was called from, on a waiting rank: "train.py:88"
    last_seen: dict[int, str]  # per missing rank: the user frame of its last recorded collective


def _user_frame(entry: dict[str, Any]) -> Optional[str]:
    return first_user_frame(entry.get("frames"))


def entry(dump: dict[str, Any], group: str, seq: int) -> Optional[dict[str, Any]]:
    """The entry of collective `seq` of `group` in one rank's dump."""
    for e in reversed(dump.get("entries") or []):
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, (tuple, list)) and str(pg[0]) == group and e.get("collective_seq_id") == seq:
            return dict(e)
    return None


def _last_entry(dump: dict[str, Any], group: str) -> Optional[dict[str, Any]]:
    for e in reversed(dump.get("entries") or []):
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, (tuple, list)) and str(pg[0]) == group and not e.get("is_p2p"):
            return dict(e)
    return None


def unjoined(dumps: dict[int, dict[str, Any]]) -> list[Unjoined]:
    """From every rank's dump (rank -> dump): per group, the furthest collective any rank enqueued and the ranks
    that never did, with the op and where it was called — read from `pg_status` and the entries themselves."""
    statuses = [s for rank, d in dumps.items() for s in pg_status(rank, d)]
    out = []
    for group, (seq, behind) in sorted(missing_ranks(statuses).items()):
        waiting = sorted(s.rank for s in statuses if s.group == group and s.last_enqueued == seq)
        op, where, name = "collective", None, group
        for rank in waiting:
            e = entry(dumps[rank], group, seq)
            if e is not None:
                op = str(e.get("profiling_name") or op).split(":")[-1]
                where = _user_frame(e)
                pg = e.get("process_group")
                name = str(pg[1]) if isinstance(pg, (tuple, list)) and len(pg) == 2 else group
                break
        last_seen = {}
        for rank in behind:
            e = _last_entry(dumps.get(rank, {}), group)
            frame = _user_frame(e) if e is not None else None
            if frame:
                last_seen[rank] = frame
        out.append(Unjoined(group, name, seq, op, behind, waiting, where, last_seen))
    return out


@dataclass(frozen=True)
class Mismatch:
    """A collective number every rank entered, but not as the same operation (or not with the same sizes)."""

    group: str
    group_name: str
    seq: int
    calls: dict[str, list[int]]  # "all_reduce [[1, 8]]" -> the ranks that called it so
    where: dict[str, str]  # the same key -> the user frame it was called from


def mismatches(dumps: dict[int, dict[str, Any]]) -> list[Mismatch]:
    """Per group, the last collective all ranks enqueued, when they did not all enqueue the same one."""
    statuses = [s for rank, d in dumps.items() for s in pg_status(rank, d)]
    out = []
    for group in sorted({s.group for s in statuses}):
        members = [s for s in statuses if s.group == group]
        seq = min(s.last_enqueued for s in members)
        if seq < 0 or len(members) < 2:
            continue
        calls: dict[str, list[int]] = {}
        where: dict[str, str] = {}
        name = group
        for s in members:
            e = entry(dumps[s.rank], group, seq)
            if e is None:
                continue
            pg = e.get("process_group")
            name = str(pg[1]) if isinstance(pg, (tuple, list)) and len(pg) == 2 else group
            key = f"{str(e.get('profiling_name') or '?').split(':')[-1]} {e.get('input_sizes')}"
            calls.setdefault(key, []).append(s.rank)
            frame = _user_frame(e)
            if frame:
                where.setdefault(key, frame)
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
