"""Where a rank's evidence lives in a bundle, below the rest of analyze/: its newest dump of a kind, its main thread
from the recorder's own dumps, every rank's flight-recorder dump, the hosts the job spans and the host each rank
lives on. Pure; imports the stdlib, the rank protocol, the stack and
flight-recorder adapters and the reader."""

from __future__ import annotations

from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import flight_recorder as fr
from ..adapters import stacks
from ..bundle import layout as L
from ..bundle.reader import Bundle, integer, number


def newest(bundle: Bundle, rank: int, pattern: str) -> Optional[str]:
    """The bundle member ranks/<rank>/<pattern, %d the highest n>."""
    best: tuple[int, str] | None = None
    for name in bundle.rank_files(rank):
        n = L.numbered(rank, pattern, name)
        if n is not None and (best is None or n > best[0]):
            best = (n, name)
    return best[1] if best else None


def main_stack(bundle: Bundle, rank: int) -> tuple[Optional[stacks.ThreadStack], Optional[str]]:
    """The rank's main thread from its newest dump: the recorder's JSON dump, else faulthandler's."""
    name = newest(bundle, rank, P.RANK_PYDUMP)
    if name is not None:
        thread = stacks.main_thread(stacks.from_pydump(bundle.json(name)))
        if thread is not None:
            return thread, name
    names = bundle.json(L.rank_member(rank, P.RANK_THREADS))
    for candidate in (newest(bundle, rank, P.RANK_STACKS), L.rank_member(rank, P.RANK_SIGTERM)):
        if candidate is None or candidate not in bundle.files:
            continue
        dumps = stacks.parse_faulthandler(bundle.text(candidate), names if isinstance(names, dict) else None)
        if dumps:
            thread = stacks.main_thread(dumps[-1])
            if thread is not None:
                return thread, candidate
    return None, None


def flight_recorder_dumps(bundle: Bundle) -> tuple[dict[int, dict[str, Any]], list[str], dict[int, int]]:
    """Every rank's flight-recorder dump, read with the restricted loader; what could not be read; and the ranks of a
    detected hang whose dump was written after they moved on (a rank that blackbox's dump signal woke from a native
    sleep trains on for a moment, and its peers with it: its dump, written then, would put it collectives ahead of
    the hang): rank -> how many entries were newer than the collection's start. Those dumps are read as they stood
    then, the rank inside a collective or not as the detection saw it. A collection on request (no detection) reads
    every dump as written: the job may be running, and its order of arrival is what it is read for."""
    dumps: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    for name in sorted(bundle.files):
        if not L.is_flight_recorder_dump(name):
            continue
        rank = fr.rank_of(name)
        try:
            if rank is not None:
                dumps[rank] = fr.load_dump(bundle.files[name])
        except fr.FlightRecorderError as exc:
            errors.append(f"{name}: {exc}")
    moved: dict[int, int] = {}
    inside = detected(bundle)
    for rank, dump in sorted(dumps.items()):
        started = collection_started(bundle, rank) if rank in inside else None
        newer = fr.newer_than(dump, int(started * 1e9)) if started is not None else 0
        if started is not None and newer:
            moved[rank] = newer
            dumps[rank] = fr.as_of(dump, int(started * 1e9), inside[rank])
    return dumps, errors, moved


def collection_started(bundle: Bundle, rank: int) -> Optional[float]:
    """When the collection of the rank's node began, on that node's clock (a merged bundle keeps each node's)."""
    nodes = bundle.manifest.get("nodes")
    if not isinstance(nodes, list):
        return number(bundle.section("collection").get("started"))
    where = bundle.manifest.get("rank_nodes")
    node = where.get(str(rank)) if isinstance(where, dict) else None
    return next((number(n.get("collection_started")) for n in nodes if isinstance(n, dict) and n.get("node") == node
                 and node is not None), None)  # fmt: skip


def detected(bundle: Bundle) -> dict[int, bool]:
    """Per rank the detection names, whether it was inside a collective when the hang was detected."""
    detection = bundle.json(L.DETECTION)
    findings = detection.get("findings") if isinstance(detection, dict) else None
    out: dict[int, bool] = {}
    for f in findings if isinstance(findings, list) else []:
        rank = integer(f.get("rank")) if isinstance(f, dict) else None
        if rank is not None:
            out[rank] = f.get("phase") == "collective"
    return out


def hosts(bundle: Bundle) -> int:
    """How many hosts the job spans, as far as the bundle knows (its multi-node section, else 1)."""
    nnodes = bundle.section("multinode").get("nnodes")
    return nnodes if isinstance(nnodes, int) and not isinstance(nnodes, bool) else 1


def rank_hosts(bundle: Bundle) -> dict[int, str]:
    """Which host each rank of the job lives on, as the coordination learned it from every node's supervisor (and
    a merged view from its node bundles): so a suspect on another node is named on its own host."""
    out: dict[int, str] = {}
    for name in [n for n in bundle.files if n.endswith(L.COORDINATION)]:
        state = bundle.json(name)
        hosts = state.get("rank_hosts") if isinstance(state, dict) else None
        for rank, host in hosts.items() if isinstance(hosts, dict) else ():
            if integer(rank) is not None and isinstance(host, str):
                out.setdefault(int(rank), host)
    nodes = bundle.manifest.get("rank_nodes")
    for rank, host in nodes.items() if isinstance(nodes, dict) else ():
        if integer(rank) is not None and isinstance(host, str):
            out[int(rank)] = host
    return out
