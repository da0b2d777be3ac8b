"""Two hosts on one machine: network namespaces made by the test, each with its own address (a veth pair) and its own
host name (a UTS namespace), each running `blackbox run -- torchrun --nnodes 2` of one rank, coordinated through node
0's store. When the host names do not resolve to the hosts' addresses and no GLOO_SOCKET_IFNAME is set, gloo falls
back to loopback and the full mesh cannot connect: both nodes must call it a network set-up failure and name the
fix. When they do resolve (an /etc/hosts of the hosts' own, in a private mount namespace), the job trains, and a
hang on node 1 is named on node 1's host; when the link between the hosts goes down mid-training, each side names
the other host and the network. Root only (namespaces); skipped elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from scripts.netns import available, cut, mend, on_host, two_hosts
from tests.conftest import BIN, BLACKBOX, ROOT, job_env, wait_for

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
pytestmark = [
    pytest.mark.skipif(not available(), reason="network and UTS namespaces need root, `ip` and `unshare`"),
    pytest.mark.xdist_group("netns"),  # the hosts' namespaces have fixed names: one test at a time
]


def start_node(tmp: Path, ns: str, node: int, master: str, port: int, hosts: str = "", *train: str,
               env: dict[str, str] | None = None, stall_s: int | str = 6) -> subprocess.Popen[str]:  # fmt: skip
    """Node `node`'s `blackbox run -- torchrun` in namespace `ns`, on a host named bbhost<node> (with an /etc/hosts of
    its own when `hosts` is given)."""
    run_dir = tmp / f"node{node}"
    inner = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", str(stall_s), "--startup-timeout", "120",
             "--poll-interval", "0.5", "--kill-grace", "5", "--", str(BIN / "torchrun"), "--nnodes", "2",
             "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", master, "--master-port", str(port),
             str(TRAIN), *(train or ("healthy", "9"))]  # fmt: skip
    hosts_file = None
    if hosts:
        hosts_file = tmp / f"hosts{node}"
        hosts_file.write_text(hosts)
    cmd = on_host(ns, f"bbhost{node}", inner, str(hosts_file) if hosts_file else None)
    job = job_env(**(env or {}))
    job.pop("GLOO_SOCKET_IFNAME", None)
    job.pop("NCCL_SOCKET_IFNAME", None)
    return subprocess.Popen(cmd, cwd=tmp, env=job, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The node's stderr once it ended (killed, with its whole process group, when it does not end in time)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return err


def report(bundle: Path) -> dict[str, Any]:
    res = subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json", "--no-fr-analyzer", "--no-index"],
                         capture_output=True, text=True, env=job_env(), timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def bundles(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "bundles").glob("*.tar.gz"))


def free_port() -> int:
    return random.randrange(20000, 29000)  # in namespaces of the test's own: nothing else binds there


@pytest.mark.timeout(300)
def test_hosts_whose_names_do_not_resolve_cannot_set_up_gloo_and_both_say_so(tmp_path: Path) -> None:
    # GIVEN two hosts whose names resolve to no address of theirs, and no GLOO_SOCKET_IFNAME
    with two_hosts() as (ns, addrs):
        port = free_port()
        nodes = [start_node(tmp_path, ns[i], i, addrs[0], port) for i in (0, 1)]
        try:
            # WHEN rank 0's init_process_group fails (gloo advertised loopback) and node 1 joins the incident
            wait_for(lambda: bundles(tmp_path / "node0") and bundles(tmp_path / "node1"), 180, "both nodes' bundles")
        finally:
            errs = [stop(p, timeout=20) for p in nodes]
    # THEN both nodes call it a network set-up failure and name the fix (which rank raised first is a race: the other
    # node collects for its incident, its own rank still waiting in init_process_group)
    said = ""
    for node in (0, 1):
        data = report(bundles(tmp_path / f"node{node}")[0])
        actions = " ".join(data["next_actions"])
        said += actions
        assert data["verdict"]["category"] == "crash.network_setup", (node, data["verdict"], errs[node][-3000:])
        assert "GLOO_SOCKET_IFNAME" in actions and "NCCL_SOCKET_IFNAME" in actions, actions
        assert f"`bbhost{node}` does not resolve" in actions and "GLOO_SOCKET_IFNAME is not set" in actions, actions
        assert "getent hosts $(hostname)" in actions
    assert "127.0.0.1" in said  # the loopback address a peer advertised, as the failing rank's error names it
    assert "crash.network_setup" in errs[0] + errs[1]  # the live verdict, on the supervisors' stderr


@pytest.mark.timeout(300)
def test_a_healthy_two_host_job_names_the_host_a_rank_lives_on(tmp_path: Path) -> None:
    # GIVEN two hosts whose names resolve to their own addresses: the job trains
    with two_hosts() as (ns, addrs):
        hosts = f"127.0.0.1 localhost\n{addrs[0]} bbhost0\n{addrs[1]} bbhost1\n"
        port = free_port()
        fail = tmp_path / "fail-now"
        train = ("data-hang", "1")
        nodes = [start_node(tmp_path, ns[i], i, addrs[0], port, hosts, *train, env={"BB_FAIL_WHEN": str(fail)})
                 for i in (0, 1)]  # fmt: skip
        try:
            events = tmp_path / "node0" / "events.jsonl"
            wait_for(lambda: events.exists() and '"first_step"' in events.read_text(), 180, "the job's first step")
            # WHEN rank 1, on node 1, hangs in its data
            fail.touch()
            wait_for(lambda: bundles(tmp_path / "node0"), 120, "node 0's bundle")
        finally:
            errs = [stop(p, timeout=60) for p in nodes]
    # THEN node 0's live verdict names rank 1 on the host it lives on, not on node 0
    assert "rank 1 on bbhost1" in errs[0], errs[0][-3000:]
    data = report(bundles(tmp_path / "node0")[0])
    assert data["verdict"]["suspect_ranks"] == [1]
    assert "rank 1 on bbhost1" in " ".join(data["next_actions"])


def steady(tmp: Path, ns: tuple[str, str], addrs: tuple[str, str], steps: int,
           stall_s: int | str) -> list[subprocess.Popen[str]]:  # fmt: skip
    """The gallery's steady DDP job on both hosts (whose names resolve), one rank each, under blackbox."""
    hosts = f"127.0.0.1 localhost\n{addrs[0]} bbhost0\n{addrs[1]} bbhost1\n"
    port = free_port()
    return [start_node(tmp, ns[i], i, addrs[0], port, hosts, "steady", "1", "ddp", env={"BB_STEPS": str(steps)},
                       stall_s=stall_s) for i in (0, 1)]  # fmt: skip


def first_step(tmp: Path) -> None:
    events = tmp / "node0" / "events.jsonl"
    wait_for(lambda: events.exists() and '"first_step"' in events.read_text(), 180, "the job's first step")


@pytest.mark.timeout(300)
def test_a_network_partition_mid_training_is_named_on_both_sides_of_the_cut(tmp_path: Path) -> None:
    # GIVEN a two-host job training (one rank a host) with a stall timeout longer than a node takes to be found
    # silent (10 s): the verdict comes after each side has lost the other
    with two_hosts() as (ns, addrs):
        nodes = steady(tmp_path, ns, addrs, steps=5000, stall_s=15)
        try:
            first_step(tmp_path)
            # WHEN the link between the hosts goes down: no error on either side, every packet lost
            cut(ns[1])
            wait_for(lambda: bundles(tmp_path / "node0") and bundles(tmp_path / "node1"), 120, "both nodes' bundles")
            codes = [p.wait(timeout=90) for p in nodes]
        finally:
            errs = [stop(p, timeout=60) for p in nodes]
    # THEN each side names the other host, why (node 0: node 1's supervisor fell silent; node 1: its coordinator
    # stopped answering, which TCPStore's own timeout never said) and what to check; the job ends as a stall
    assert codes == [86, 86], errs
    assert "the blackbox supervisor of node 1 has been silent" in errs[0], errs[0][-3000:]
    assert "has not answered for" in errs[1] and "the network between this host and it is cut" in errs[1], errs[1]
    node1_events = (tmp_path / "node1" / "events.jsonl").read_text()
    assert '"status": "unanswered"' in node1_events
    for node, other, how in ((0, 1, "blackbox's supervisor there fell silent"),
                             (1, 0, "the coordinator there stopped answering")):  # fmt: skip
        data = report(bundles(tmp_path / f"node{node}")[0])
        v = data["verdict"]
        assert (v["category"], v["suspect_ranks"]) == ("hang.network", [other]), (node, v)
        # the collective is DDP's all_reduce, or its broadcast when the cut comes in the first steps
        assert re.search(rf"rank {other} on `bbhost{other}` never entered (all_reduce|broadcast) #\d+ of group 0",
                         v["summary"]), v["summary"]  # fmt: skip
        assert f"({how}): the host is down or the network between the hosts is cut" in v["summary"], v["summary"]
        assert data["next_actions"][0].startswith(f"From bbhost{node}, check that bbhost{other} answers"), data
        assert f"verdict: hang.network, suspect rank(s) {other}" in errs[node]
    # and both sides' bundles together: every rank waits alive, the hosts lost each other — a partition
    given = [str(bundles(tmp_path / f"node{i}")[0]) for i in (0, 1)]
    both = subprocess.run([*BLACKBOX, "report", *given, "--format", "json", "--no-fr-analyzer", "--no-index"],
                          capture_output=True, text=True, env=job_env(), timeout=120)  # fmt: skip
    assert both.returncode == 0, both.stderr
    v = json.loads(both.stdout)["verdict"]
    assert (v["category"], v["suspect_ranks"]) == ("hang.network", []), v
    assert "the hosts lost each other" in v["summary"] and "(`bbhost0`, `bbhost1`)" in v["summary"], v["summary"]


@pytest.mark.timeout(300)
def test_a_network_blip_shorter_than_the_stall_timeout_ends_nothing_and_the_coordination_heals(tmp_path: Path) -> None:
    # GIVEN a two-host job training under the defaults (`auto`: 60 s once 5 steps are done)
    with two_hosts() as (ns, addrs):
        nodes = steady(tmp_path, ns, addrs, steps=400, stall_s="auto")
        try:
            first_step(tmp_path)
            time.sleep(8)  # past auto's first 5 steps
            # WHEN the link goes down for 20 s, then comes back (a switch rebooting, a flapping port)
            cut(ns[1])
            time.sleep(20)
            mend(ns[1])
            codes = [p.wait(timeout=150) for p in nodes]
        finally:
            errs = [stop(p, timeout=60) for p in nodes]
    # THEN the job trains on to its end: no stall, no bundle, the job's own exit code; each side said what it saw,
    # and node 1 joined the coordination again (the blocked store call failed when the network came back)
    assert codes == [0, 0], errs
    assert not bundles(tmp_path / "node0") and not bundles(tmp_path / "node1")
    assert "node 1 has been silent" in errs[0] and "the blackbox supervisor of node 1 is back" in errs[0], errs[0]
    assert "has not answered for" in errs[1] and "answers again" in errs[1], errs[1]
    assert "keys:" not in errs[1]
