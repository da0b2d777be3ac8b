"""Two hosts on one machine: network namespaces made by the test, each with its own address (a veth pair) and its own
host name (a UTS namespace), each running `blackbox run -- torchrun --nnodes 2` of one rank, coordinated through node
0's store. When the host names do not resolve to the hosts' addresses and no GLOO_SOCKET_IFNAME is set, gloo falls
back to loopback and the full mesh cannot connect: both nodes must call it a network set-up failure and name the
fix. When they do resolve (an /etc/hosts of the hosts' own, in a private mount namespace), the job trains, and a
hang on node 1 is named on node 1's host. Root only (namespaces); skipped elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, BLACKBOX, ROOT, job_env, wait_for

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("unshare")),
    reason="network and UTS namespaces need root, `ip` and `unshare`",
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """Two network namespaces joined by a veth pair: (namespace names, their addresses). Removed on the way out."""
    tag = f"bb{os.getpid() % 100000}{random.randrange(1000)}"
    ns = (f"{tag}a", f"{tag}b")
    net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    addrs = (f"{net}.1", f"{net}.2")
    try:
        for n in ns:
            _ip("netns", "add", n)
        _ip("link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        for n, dev, addr in ((ns[0], f"{tag}x", addrs[0]), (ns[1], f"{tag}y", addrs[1])):
            _ip("link", "set", dev, "netns", n)
            _ip("-n", n, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", n, "link", "set", dev, "up")
            _ip("-n", n, "link", "set", "lo", "up")
        yield ns, addrs
    finally:
        for n in ns:  # a namespace's devices go with it
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=20)


def start_node(tmp: Path, ns: str, node: int, master: str, port: int, hosts: str = "", *train: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[str]:  # fmt: skip
    """Node `node`'s `blackbox run -- torchrun` in namespace `ns`, on a host named bbhost<node> (with an /etc/hosts of
    its own when `hosts` is given)."""
    run_dir = tmp / f"node{node}"
    inner = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", "6", "--startup-timeout", "120",
             "--poll-interval", "0.5", "--kill-grace", "5", "--", str(BIN / "torchrun"), "--nnodes", "2",
             "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", master, "--master-port", str(port),
             str(TRAIN), *(train or ("healthy", "9"))]  # fmt: skip
    script = f"hostname bbhost{node}"
    if hosts:
        hosts_file = tmp / f"hosts{node}"
        hosts_file.write_text(hosts)
        script += f" && mount --bind {hosts_file} /etc/hosts"
    script += ' && exec "$@"'
    cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script,
           "node", *inner]  # fmt: skip
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
