"""Two nodes on one machine: two `blackbox run` supervisors, each wrapping `torchrun --nnodes 2 --node-rank i
--nproc-per-node 2` over 127.0.0.1 with gloo (4 ranks), coordinated through node 0's TCPStore. The failure
comes when the test touches a file (the gallery's BB_FAIL_WHEN), so it can come after the test has arranged
what it needs (both nodes joined, a supervisor killed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox.coord.topology import topology
from tests.conftest import BIN, BLACKBOX, ROOT, job_env, wait_for
from tests.ports import free_port

pytestmark = pytest.mark.long  # two nodes' jobs, up to a minute each
TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
STALL_S = 6.0
POLL_S = 0.5


def start_node(tmp: Path, node: int, port: int, rank_at: int, *extra: str) -> subprocess.Popen[str]:
    cmd = [*BLACKBOX, "run", "--run-dir", str(tmp / f"node{node}"), "--stall-timeout", str(STALL_S),
           "--startup-timeout", "120", "--poll-interval", str(POLL_S), "--kill-grace", "5", *extra, "--",
           str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), str(TRAIN), "data-hang", str(rank_at)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=tmp, env=job_env(BB_FAIL_WHEN=str(tmp / "fail-now")), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def has_event(run_dir: Path, name: str, **fields: Any) -> bool:
    return any(e["event"] == name and all(e.get(k) == v for k, v in fields.items()) for e in events(run_dir))


def stepping(run_dir: Path) -> bool:
    return any(e["event"] == "first_step" for e in events(run_dir))


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


def report(*paths: Path) -> dict[str, Any]:
    res = subprocess.run([*BLACKBOX, "report", *map(str, paths), "--format", "json", "--no-fr-analyzer"],
                         capture_output=True, text=True, env=job_env(), timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def manifest(bundle: Path) -> dict[str, Any]:
    import tarfile

    with tarfile.open(bundle) as tar:
        f = tar.extractfile("manifest.json")
        assert f is not None
        data: dict[str, Any] = json.load(f)
        return data


def test_a_stall_on_one_node_is_collected_on_both(tmp_path: Path) -> None:
    port = free_port(also=1000)
    alerts = tmp_path / "alerts.txt"
    on_incident = ["--on-incident", f"echo $BLACKBOX_NODE $BLACKBOX_TRIGGER >> {alerts}"]
    nodes = [start_node(tmp_path, i, port, 3, *on_incident) for i in (0, 1)]
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in dirs:
        wait_for(lambda d=d: has_event(d, "coordination", status="connected") and stepping(d), 90, f"{d} to step")
    (tmp_path / "fail-now").touch()
    results = [finish(p) for p in nodes]
    for code, err in results:
        assert code == 86, err[-3000:]
        assert f"the coordination store at 127.0.0.1:{port + 1000} is unauthenticated" in err, err[-3000:]
    bundles = [sorted((d / "bundles").glob("*.tar.gz")) for d in dirs]
    assert [len(b) for b in bundles] == [1, 1], results[0][1][-2000:] + results[1][1][-2000:]
    m0, m1 = manifest(bundles[0][0]), manifest(bundles[1][0])
    assert m0["incident"]["id"] == m1["incident"]["id"]
    # whichever node saw the stall first posted it (all four ranks stop at once); the other joined it
    origin = int(m0["incident"]["origin"])
    assert [m0, m1][origin]["trigger"] == "stall", (m0["trigger"], m1["trigger"])
    assert [m0, m1][1 - origin]["trigger"] in ("remote-stall", "stall"), (m0["trigger"], m1["trigger"])
    assert m0["multinode"]["job_id"] == m1["multinode"]["job_id"]
    # both nodes collected within one stall timeout and two polls of each other
    started = [next(e["t"] for e in events(d) if e["event"] in ("stall", "remote_incident")) for d in dirs]
    assert abs(started[0] - started[1]) <= STALL_S + 2 * POLL_S, started
    merged = report(bundles[0][0], bundles[1][0])
    assert merged["verdict"]["suspect_ranks"] == [3], merged["verdict"]
    assert merged["verdict"]["category"] == "hang.data_loading", merged["verdict"]
    rows = {r["rank"]: r for r in merged["ranks"]}
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[3]["node"].endswith("node1") and rows[0]["node"].endswith("node0"), rows
    # each node waited for the other's evidence before ending its part: no rank raised the teardown's "connection
    # closed" into either bundle
    assert all("waiting 8 s for the other 1 node(s) to take their evidence" in err for _, err in results), results
    assert not [r for r in merged["ranks"] if r["state"] == "exception"], merged["ranks"]
    # one node's bundle alone names the node that is missing
    alone = " ".join(f["text"] for f in report(bundles[0][0])["findings"])
    assert "node(s) 1 of 2 have no bundle among those given" in alone and "ranks 2-3 of 4" in alone, alone
    # a directory holding both nodes' bundles reads the same
    gathered = tmp_path / "gathered"
    gathered.mkdir()
    for b in (bundles[0][0], bundles[1][0]):
        os.link(b, gathered / b.name)
    assert report(gathered)["verdict"]["suspect_ranks"] == [3]
    # one alarm per incident, from the node that posted it
    lines = alerts.read_text().splitlines()  # the supervisors wait for their commands before they exit
    assert len(lines) == 1 and lines[0].endswith(" stall"), lines


def test_a_node_whose_supervisor_dies_is_recorded_and_the_other_still_collects(tmp_path: Path) -> None:
    port = free_port(also=1000)
    nodes = [start_node(tmp_path, i, port, 0) for i in (0, 1)]
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in dirs:
        wait_for(lambda d=d: has_event(d, "coordination", status="connected") and stepping(d), 90, f"{d} to step")
    os.kill(nodes[1].pid, signal.SIGKILL)  # node 1's supervisor only: its torchrun and ranks go on
    wait_for(lambda: has_event(dirs[0], "node_silent", node="1"), 30, "node 0 to notice node 1's silence")
    (tmp_path / "fail-now").touch()  # now rank 0, on node 0, stalls in its data loader
    code, err = finish(nodes[0])
    assert code == 86, err[-3000:]
    assert "the blackbox supervisor of node 1 has been silent" in err
    bundles = sorted((dirs[0] / "bundles").glob("*.tar.gz"))
    assert len(bundles) == 1, err[-3000:]
    rep = report(bundles[0])
    assert rep["verdict"]["suspect_ranks"] == [0], rep["verdict"]
    texts = " ".join(f["text"] for f in rep["findings"])
    assert "node 1's blackbox supervisor fell silent" in texts, texts
    nodes[1].communicate(timeout=30)


def test_a_taken_coordinator_port_leaves_each_node_on_its_own(tmp_path: Path) -> None:
    port = free_port(also=1000)
    squatter = socket.socket()
    squatter.bind(("0.0.0.0", port + 1000))
    squatter.listen(8)
    try:
        nodes = [start_node(tmp_path, i, port, 3) for i in (0, 1)]
        dirs = [tmp_path / "node0", tmp_path / "node1"]
        for d in dirs:
            wait_for(lambda d=d: stepping(d), 90, f"{d} to step")
        wait_for(lambda: has_event(dirs[0], "coordination", status="alone"), 30, "node 0 to give up serving")
        (tmp_path / "fail-now").touch()
        results = [finish(p) for p in nodes]
    finally:
        squatter.close()
    assert f"cannot serve the coordinator: port {port + 1000} is already taken on this node" in results[0][1]
    assert "this node watches and collects on its own" in results[0][1]
    for code, err in results:
        assert code == 86, err[-3000:]
    # node 1 saw its own rank 3 stall and collected it alone; node 0 its waiting ranks
    bundles = [sorted((d / "bundles").glob("*.tar.gz")) for d in dirs]
    assert all(bundles), results[1][1][-3000:]
    assert report(bundles[1][0])["verdict"]["suspect_ranks"] == [3]
    assert manifest(bundles[0][0])["incident"]["id"] != manifest(bundles[1][0])["incident"]["id"]


def test_ranks_waiting_for_a_working_rank_of_another_node_are_not_stalled(tmp_path: Path) -> None:
    # GIVEN a healthy 4-rank job on two nodes: rank 0 (node 0) computes metrics alone for 20 s, longer than the
    # 6 s stall timeout, while rank 1 (node 0) and ranks 2-3 (node 1) wait for it at a barrier: nothing moves on
    # node 1 the whole time
    port = free_port(also=1000)
    nodes = []
    for node in (0, 1):
        cmd = [*BLACKBOX, "run", "--run-dir", str(tmp_path / f"node{node}"), "--stall-timeout", str(STALL_S),
               "--poll-interval", str(POLL_S), "--kill-grace", "5", "--", str(BIN / "torchrun"), "--nnodes", "2",
               "--node-rank", str(node), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
               str(port), str(ROOT / "tests" / "programs" / "quiet_job.py"), "metrics"]  # fmt: skip
        env = job_env(BB_PAUSE_S="20")
        nodes.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True))  # fmt: skip
    results = [finish(p, 180) for p in nodes]
    # THEN both nodes end by themselves, exit 0: node 1 knew from the coordination that node 0 still worked
    for node, (code, err) in enumerate(results):
        assert code == 0, (node, err[-3000:])
        assert not [e for e in events(tmp_path / f"node{node}") if e["event"] in ("stall", "frozen", "bundle")], err
    (note,) = [e for e in events(tmp_path / "node1") if e["event"] == "slow_phase"]
    assert note["reason"].startswith("no rank here has taken a step for") and "node 0 still works" in note["reason"]
    assert "ranks 2-3 wait for it" in note["reason"], note


def forge(port: int, job_key: str, key: str, value: dict[str, Any]) -> None:
    """Write to a job's coordination store as anyone who reaches its port could: no secret."""
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore

    base = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    PrefixStore(f"blackbox/{job_key}/", base).set(key, json.dumps(value))


def test_a_forged_stall_is_rejected_and_one_nodes_prestop_is_its_own(tmp_path: Path) -> None:
    # GIVEN a two-node job whose nodes share a secret, both stepping
    port = free_port(also=1000)
    secret = tmp_path / "job-secret"
    secret.write_text("a-secret-only-the-job-has\n")
    nodes = [start_node(tmp_path, i, port, 3, "--coord-secret-file", str(secret)) for i in (0, 1)]
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in dirs:
        wait_for(lambda d=d: has_event(d, "coordination", status="connected") and stepping(d), 90, f"{d} to step")
    argv = [str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
            "--master-port", str(port), str(TRAIN)]  # fmt: skip
    found = topology(argv, {})
    assert found is not None
    job_key = found.job_key  # whoever reaches the port can read the job's command line: the key is no secret, and
    assert not [e for d in dirs for e in events(d) if "job_key" in e]  # ... the events no longer carry it
    # WHEN someone outside the job posts a stall and declares node 1 silent, as a node would without the secret
    incident = {"kind": "stall", "origin": "0", "id": "forged-i1", "n": 1, "time": 0, "message": "forged"}
    forge(port + 1000, job_key, "incident/1", incident)
    forge(port + 1000, job_key, "silent", {"1": {"silent_s": 99.0, "summary": {}}})
    # THEN every node rejects both, says so once, and the job runs on: no bundle, no incident
    for d in dirs:
        wait_for(lambda d=d: has_event(d, "coordination_rejected"), 30, f"{d} to reject the forged post")
    time.sleep(4 * POLL_S)  # what a believed post would start within a poll: nothing may come of these
    assert all(p.poll() is None for p in nodes), [p.poll() for p in nodes]
    assert not any(sorted((d / "bundles").glob("*.tar.gz")) for d in dirs)
    assert not any(has_event(d, "remote_incident") or has_event(d, "node_silent") for d in dirs)
    # WHEN node 0's pod alone is being deleted (a drain): its preStop hook, `blackbox collect --preemption`
    res = subprocess.run([*BLACKBOX, "collect", "--preemption", str(nodes[0].pid), "--format", "json"],
                         env=job_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    # THEN node 0 took its own evidence, and node 1 was not made to collect: one pod's ending is not the others'
    # incident (every node being ended gets a hook of its own)
    (prestop,) = (dirs[0] / "bundles").glob("*-signal-prestop.tar.gz")
    time.sleep(4 * POLL_S)  # a posted incident is collected within a poll
    assert not sorted((dirs[1] / "bundles").glob("*.tar.gz")) and not has_event(dirs[1], "remote_incident")
    # and a real stall afterwards is still posted, signed, and collected on both nodes as one incident
    (tmp_path / "fail-now").touch()
    results = [finish(p) for p in nodes]
    for code, err in results:
        assert code == 86, err[-3000:]
        assert "rejected a post to the coordination store" in err and "the job goes on" in err
        assert "is unauthenticated" not in err and "a-secret-only-the-job-has" not in err
    bundles = [sorted(set((d / "bundles").glob("*.tar.gz")) - {prestop}) for d in dirs]
    assert [len(b) for b in bundles] == [1, 1], results[0][1][-2000:] + results[1][1][-2000:]
    assert manifest(bundles[0][0])["incident"]["id"] == manifest(bundles[1][0])["incident"]["id"] != "forged-i1"
    assert report(bundles[0][0], bundles[1][0])["verdict"]["suspect_ranks"] == [3]


def test_a_failure_after_another_nodes_preemption_is_its_consequence_not_an_alarm(tmp_path: Path) -> None:
    # GIVEN a two-node job, both nodes stepping, with an alarm command
    port = free_port(also=1000)
    alerts = tmp_path / "alerts.txt"
    nodes = [start_node(tmp_path, i, port, 3, "--on-incident", f"echo $BLACKBOX_NODE $BLACKBOX_TRIGGER >> {alerts}")
             for i in (0, 1)]  # fmt: skip
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in dirs:
        wait_for(lambda d=d: has_event(d, "coordination", status="connected") and stepping(d), 90, f"{d} to step")
    # WHEN node 0's pod is deleted as the kubelet does it: its preStop hook, then its SIGTERM
    res = subprocess.run([*BLACKBOX, "collect", "--preemption", str(nodes[0].pid), "--format", "json"],
                         env=job_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    wait_for(lambda: has_event(dirs[1], "peer_preempted", node="0"), 30, "node 1 to hear of node 0's preemption")
    nodes[0].send_signal(signal.SIGTERM)
    results = [finish(p) for p in nodes]
    # THEN node 1's ranks, losing their peers, are collected as that preemption's consequence: no alarm anywhere
    err1 = results[1][1]
    assert "node 0 (" in err1 and "is being ended from outside" in err1, err1[-3000:]
    assert "this follows node 0's preemption: no alarm" in err1, err1[-3000:]
    (bundle,) = (dirs[1] / "bundles").glob("*.tar.gz")
    assert manifest(bundle)["incident"]["after_peer_preemption"]["node"] == "0"
    said = [f["text"] for f in report(bundle)["findings"] if "was being ended from outside" in f["text"]]
    assert said and said[0].startswith("node 0 (") and "what failed here followed it" in said[0], said
    summary = report(bundle)["verdict"]["summary"]
    assert summary.startswith("Node 0 (") and ", and what failed here followed it: " in summary, summary
    assert not alerts.exists() or not alerts.read_text().strip(), alerts.read_text()
    # AND node 0 took its own evidence once, as the preemption's
    assert [b.name.endswith("-signal-prestop.tar.gz") for b in (dirs[0] / "bundles").glob("*.tar.gz")] == [True]
