"""Bundles from a real network partition: two hosts in network namespaces, one rank each, training DDP over gloo; the
link between them taken down mid-training (tests/integration/test_network_setup.py, 2026-12-04). Node 0 (hosting the
coordination) found node 1's supervisor silent; node 1's coordination store stopped answering. Each side's bundle
alone names the other host's rank and the network; both together, a partition with every rank its victim. A host lost
long before the job stopped is not the cause (its supervisor alone died: the job went on). Suspects on two hosts are
each named on their own host, and no pid is given for a host it does not live on."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle, read_bundles

DATA = Path(__file__).resolve().parent.parent / "data" / "partition"
NODE0, NODE1 = str(DATA / "node0.tar.gz"), str(DATA / "node1.tar.gz")


def test_the_hosting_node_names_the_rank_on_the_host_whose_supervisor_fell_silent() -> None:
    r = analyze(read_bundle(NODE0))
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("hang.network", [1])
    assert r.verdict.summary.startswith("The job stalled: rank 1 on `bbhost1` never entered all_reduce #"), r.verdict
    assert ("this host has heard nothing from `bbhost1` since 14:36:34 UTC (blackbox's supervisor there fell silent): "
            "the host is down or the network between the hosts is cut") in r.verdict.summary  # fmt: skip
    assert r.next_actions[0].startswith("From bbhost0, check that bbhost1 answers: `ping bbhost1`")
    assert not any("--on-stall keep" in a or "py-spy dump" in a for a in r.next_actions), r.next_actions


def test_the_other_node_names_the_ranks_beyond_the_coordinator_that_stopped_answering() -> None:
    r = analyze(read_bundle(NODE1))
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("hang.network", [0])
    assert "rank 0 on `bbhost0` never entered all_reduce #" in r.verdict.summary
    assert "(the coordinator there stopped answering)" in r.verdict.summary
    said = [f.text for f in r.findings]
    assert any(t.startswith("node 1's coordinator at 10.") and "stopped answering at 14:36:34 UTC" in t for t in said)


def test_both_sides_together_are_a_partition_with_no_rank_to_blame() -> None:
    r = analyze(read_bundles([NODE0, NODE1]))
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("hang.network", [])
    assert "every rank waits in a collective, alive, and the hosts lost each other" in r.verdict.summary
    assert "(`bbhost0`, `bbhost1`): the network between the hosts is cut (a partition)" in r.verdict.summary
    assert r.next_actions[0].startswith("Check the network between the job's hosts"), r.next_actions


def test_a_host_lost_long_before_the_job_stopped_is_not_why_it_stopped(tmp_path: Path) -> None:
    # node 1's supervisor fell silent ten minutes before the ranks stopped: the job went on without it, so the host
    # and its network were fine; the rank that never arrived is the suspect, in the plain collective hang
    def earlier(state: dict[str, Any]) -> None:
        for info in state["silent"].values():
            info["since"] -= 600

    r = analyze(read_bundle(_edited(NODE0, earlier, tmp_path)))
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("hang.collective", [1]), r.verdict


def test_coordination_values_of_the_wrong_type_are_ignored(tmp_path: Path) -> None:
    def hostile(state: dict[str, Any]) -> None:
        state["unanswered_since"], state["host"] = "yesterday", ["bbhost1"]

    r = analyze(read_bundle(_edited(NODE1, hostile, tmp_path)))
    assert (r.verdict.category, r.verdict.suspect_ranks) == ("hang.collective", [0]), r.verdict


def _edited(bundle: str, edit: Any, tmp: Path) -> str:
    """A copy of `bundle` whose node/coordination.json went through `edit`."""
    out = tmp / Path(bundle).name
    with tarfile.open(bundle) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            f = src.extractfile(member) if member.isfile() else None
            data = f.read() if f is not None else None
            if member.name == "node/coordination.json" and data is not None:
                state = json.loads(data)
                edit(state)
                data = json.dumps(state).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return str(out)


def test_suspects_on_two_hosts_are_each_named_on_their_own_and_no_pid_crosses_hosts() -> None:
    from blackbox.analyze.actions import Facts, next_actions
    from blackbox.analyze.model import RankRow, Verdict

    rows = {r: RankRow(r, host, 4000 + r, "running", 9, "compute", None, 70.0, True)
            for r, host in ((0, "gpu-a"), (1, "gpu-b"))}  # fmt: skip
    v = Verdict("hang.compute", "compute", [0, 1], "low", "both compute")
    said = next_actions(v, Facts("gpu-a, gpu-b", rows))
    assert said[0].startswith("Find the loop or native call rank 0 on gpu-a and rank 1 on gpu-b is in"), said
    assert "`py-spy dump --native --pid 4000` on gpu-a." in " ".join(said), said
