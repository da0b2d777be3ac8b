"""What a bundle says about the job's other nodes: those whose supervisor fell silent, a coordinator that stopped
answering, nodes with no bundle among those given, a node being ended from outside (preempted) before the incident,
and the ranks on hosts a node lost when the job stopped. Pure;
imports the stdlib, the bundle's layout and reader, the report model and analyze.sources."""

from __future__ import annotations

from dataclasses import dataclass
from time import gmtime, strftime
from typing import Any, Optional

from ..bundle import layout as L
from ..bundle.reader import Bundle, integer, number
from .model import Finding
from .sources import rank_hosts


@dataclass(frozen=True)
class Cut:
    """A rank on a host a node lost: its host, since when (wall time), how it was lost."""

    host: str
    since: Optional[float]
    how: str  # "silent": its node's supervisor fell silent; "unanswered": the coordinator stopped answering this node


NEAR_S = 60.0  # a host lost this long before the job stopped is not why it stopped (its supervisor alone died)


def unreachable(bundle: Bundle, stopped_at: Optional[float]) -> dict[int, Cut]:
    """The ranks on hosts a node of the bundle could no longer hear from when the job stopped (`stopped_at`, wall
    time; None: not known): those of a node whose supervisor fell silent (the hosting node's word), and, on a node
    the coordinator stopped answering (its host down, the network cut), every rank on another host. A host lost more
    than NEAR_S before the job stopped is not counted: the job went on without it, so what was lost then was
    blackbox's supervisor, not the host."""
    hosts = rank_hosts(bundle)
    out: dict[int, Cut] = {}
    for name in [n for n in bundle.files if n.endswith(L.COORDINATION)]:
        state = bundle.json(name)
        if not isinstance(state, dict):
            continue
        silent = state.get("silent")
        for info in silent.values() if isinstance(silent, dict) else ():
            summary = info.get("summary") if isinstance(info, dict) else None
            ranks = summary.get("ranks") if isinstance(summary, dict) else None
            for rank in ranks if isinstance(ranks, dict) else ():
                r = integer(rank)
                if r is not None:
                    host = summary.get("host") if isinstance(summary, dict) else None
                    out[r] = Cut(str(host or hosts.get(r, "?")), number(info.get("since")), "silent")
        since, mine = number(state.get("unanswered_since")), state.get("host")
        if since is not None and isinstance(mine, str):
            for r, host in hosts.items():
                if host != mine:
                    out.setdefault(r, Cut(host, since, "unanswered"))
    return {r: c for r, c in out.items() if c.since is None or stopped_at is None or c.since >= stopped_at - NEAR_S}


def node_findings(bundle: Bundle) -> list[Finding]:
    """Multi-node: nodes whose bundle is not among those given, and nodes whose supervisor had fallen silent."""
    m = bundle.manifest
    mn = bundle.section("multinode")
    states = {name: bundle.json(name) for name in bundle.files if name.endswith(L.COORDINATION)}
    silent: dict[str, Any] = {}
    out: list[Finding] = []
    for name, state in states.items():
        if not isinstance(state, dict):
            continue
        since = state.get("unanswered_since")
        if isinstance(since, (int, float)) and not isinstance(since, bool) and 0 < since < 1e11:
            out.append(Finding("observed", f"node {state.get('node')}'s coordinator at {state.get('address')} stopped "
                               f"answering at {strftime('%H:%M:%S', gmtime(since))} UTC (its host down, or "
                               "the network to it cut): this node watched and collected on its own", name))  # fmt: skip
        if state.get("status") == "alone" and state.get("why_alone"):
            out.append(Finding("observed", f"node {state.get('node')} was not coordinated with the others "
                               f"({state['why_alone']}): they did not collect at the same moment", name))  # fmt: skip
        gone = state.get("silent")
        for node, info in gone.items() if isinstance(gone, dict) else ():
            silent.setdefault(str(node), (info, name))
    nodes: list[Any] = m["nodes"] if isinstance(m.get("nodes"), list) else [{"node_rank": mn.get("node_rank")}]
    present = {str(n.get("node_rank")) for n in nodes if isinstance(n, dict)}
    nnodes = mn.get("nnodes")
    missing = [str(i) for i in range(nnodes) if str(i) not in present] if isinstance(nnodes, int) else []
    for node, (info, source) in silent.items():
        last = info.get("summary") if isinstance(info, dict) else None
        ranks: dict[str, Any] = last["ranks"] if isinstance(last, dict) and isinstance(last.get("ranks"), dict) else {}
        seen = ", ".join(f"rank {r} step {v.get('step')} {v.get('phase')}" for r, v in sorted(
            ranks.items(), key=lambda kv: integer(kv[0]) or 0) if isinstance(v, dict))  # fmt: skip
        quiet = info.get("silent_s") if isinstance(info, dict) else None
        out.append(Finding("observed", f"node {node}'s blackbox supervisor fell silent (no liveness for {quiet} s: "
                           "killed, its host down, or the network to it cut); that node was not watched from here and "
                           "wrote no bundle for this incident (any of its own is on that host)"
                           + (f"; last seen: {seen}" if seen else ""), source))  # fmt: skip
    out.extend(_after_preemption(bundle))
    lost = [n for n in missing if n not in silent]
    if lost:
        out.append(Finding("observed", f"node(s) {', '.join(lost)} of {nnodes} have no bundle among those given: "
                           "each node writes its own under its run directory's bundles/ — give them all",
                           "manifest.json: multinode"))  # fmt: skip
    return out


@dataclass(frozen=True)
class Ending:
    """Another node being ended from outside before this incident: `who` ("node 0 (pod-a)") and the whole clause."""

    who: str
    words: str


def preempted_before(bundle: Bundle) -> Optional[Ending]:
    """The node that was being ended from outside (its pod deleted or drained) just before this incident, as this
    node's supervisor was told (manifest.json: incident.after_peer_preemption); None where none was."""
    peer = bundle.section("incident").get("after_peer_preemption")
    if not isinstance(peer, dict):
        return None
    when = number(peer.get("time"))
    at = f" at {strftime('%H:%M:%S', gmtime(when))} UTC" if when is not None and 0 < when < 1e11 else ""
    who = f"node {str(peer.get('node'))[:40]} ({str(peer.get('host'))[:80]})"
    return Ending(who, f"{who} was being ended from outside{at} ({str(peer.get('why'))[:200]})")


def _after_preemption(bundle: Bundle) -> list[Finding]:
    """What failed here followed another node's preemption (preempted_before)."""
    peer = preempted_before(bundle)
    return [Finding("observed", f"{peer.words}, before this: what failed here followed it (its ranks lost their "
                    "peers; no alarm was raised)", "manifest.json: incident")] if peer else []  # fmt: skip
