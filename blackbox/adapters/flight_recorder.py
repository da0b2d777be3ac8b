"""PyTorch's flight recorder: reads raw per-rank dumps without executing anything (a restricted unpickler
that admits only plain containers and numbers), normalises Gloo dumps so torch's own analyzer can read them,
and reads `pg_status` directly. Imports the stdlib only; torch's analyzer is run as a separate process."""

from __future__ import annotations

import io
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Optional

MAX_DUMP_BYTES = 256 * 1024 * 1024
_RANK_SUFFIX = re.compile(r"(\d+)$")


class FlightRecorderError(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Admits dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None: any class or function
    reference (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise FlightRecorderError(f"the dump references `{module}.{name}`; only plain data is read")


def load_dump(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_DUMP_BYTES:
        raise FlightRecorderError(f"the dump is {len(data)} bytes, over the {MAX_DUMP_BYTES} byte limit")
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except FlightRecorderError:
        raise
    except Exception as exc:
        raise FlightRecorderError(f"the dump is not a readable pickle: {exc}") from None
    if not isinstance(obj, dict) or "entries" not in obj:
        raise FlightRecorderError("the dump is not a flight-recorder trace (no `entries`)")
    return obj


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


def pg_status(rank: int, dump: dict[str, Any]) -> list[GroupStatus]:
    out = []
    for group, status in sorted((dump.get("pg_status") or {}).items()):
        if isinstance(status, dict):
            out.append(GroupStatus(rank, str(group), int(status.get("last_enqueued_collective", -1)),
                                   int(status.get("last_started_collective", -1)),
                                   int(status.get("last_completed_collective", -1))))  # fmt: skip
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
