"""A rank that never reaches init_process_group (the gallery's init-hang: rank 3 reads its config from a mount that
stopped answering, a FIFO, before it joins) while the others wait for it in the rendezvous, on a real two-node
torchrun job (two `blackbox run`s on this machine, 2 ranks each): each rank's recorder marks its heartbeat as it
enters init_process_group and as it returns, so `blackbox status`, read from another process, names who waits and
who has not arrived — on node 1, rank 3 by its pid; on node 0, which node's blackbox holds the ranks it waits for
(the coordination's word, the run dir's nodes.json) — and the still rank's definite leaf ends the job at the stall
timeout given, though no rank has taken a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from blackbox.events import read_events
from tests.conftest import BIN, BLACKBOX, ROOT, job_env
from tests.ports import free_port

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"


def status(run_dir: Path, *extra: str) -> str:
    res = subprocess.run([*BLACKBOX, "status", str(run_dir), *extra], capture_output=True, text=True, timeout=60,
                         env=job_env())  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout


def start_node(tmp: Path, node: int, port: int) -> subprocess.Popen[bytes]:
    argv = [*BLACKBOX, "run", "--run-dir", str(tmp / f"node{node}"), "--stall-timeout", "25", "--kill-grace", "3",
            "--", str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port), str(TRAIN), "init-hang", "3", "ddp"]  # fmt: skip
    return subprocess.Popen(argv, cwd=tmp, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def rendezvous_seen(run_dir: Path, procs: list[subprocess.Popen[bytes]],
                    placed: bool = False) -> dict[str, Any]:  # fmt: skip
    """`blackbox status --format json` of the node once it says who the rendezvous waits for (with `placed`, once
    it also knows where each rank of another node lives: that comes with that node's next summary)."""
    seen: Optional[dict[str, Any]] = None
    deadline = time.monotonic() + 90
    while seen is None and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        now = json.loads(status(run_dir, "--format", "json")) if (run_dir / "events.jsonl").exists() else {}
        z = now.get("rendezvous")
        seen = now if z and (not placed or sum(map(len, z["elsewhere_on"].values())) == z["elsewhere"]) else None
        time.sleep(0.5)
    assert seen is not None, f"status of {run_dir.name} never said who has not joined" + (" and where" * placed)
    return seen


@pytest.mark.timeout(240)
@pytest.mark.long
def test_status_names_the_rank_that_has_not_joined_and_its_leaf_ends_the_job(tmp_path: Path) -> None:
    # GIVEN the two nodes under `blackbox run`: rank 3 (node 1) blocks before init_process_group, ranks 0-2 wait in
    # the rendezvous
    port = free_port(also=1000)
    procs = [start_node(tmp_path, node, port) for node in (0, 1)]
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    try:
        # WHEN `blackbox status` reads each node's run while they wait
        seen = rendezvous_seen(node1, procs)
        # THEN node 1's says rank 2 waits inside init_process_group for rank 3, which has not called it: at step 0,
        # in its start-up, and its stage and join mark say so; the two ranks of node 0 are elsewhere
        assert {k: seen["rendezvous"][k] for k in ("world_size", "waiting", "not_arrived", "elsewhere")} == {
            "world_size": 4, "waiting": [2], "not_arrived": [3], "elsewhere": 2}, seen["rendezvous"]  # fmt: skip
        by_rank = {r["rank"]: r for r in seen["ranks"]}
        assert (by_rank[2]["join"], by_rank[2]["stage"]) == ("joining", "rendezvous"), by_rank[2]
        assert (by_rank[3]["join"], by_rank[3]["stage"], by_rank[3]["step"]) == ("", "startup", 0), by_rank[3]
        out = status(node1)
        assert "rendezvous: rank 2 waits in init_process_group (still for " in out, out
        assert "for 3 of 4 ranks: rank 3 (pid " in out and "has not called it — step 0, phase startup" in out, out
        # AND node 0's names the node whose blackbox holds the ranks its own wait for (the coordination's word: once
        # node 1's summary after rank 3's first heartbeat has come; before, "1 has no heartbeat here")
        far = rendezvous_seen(node0, procs, placed=True)["rendezvous"]
        assert (far["waiting"], far["not_arrived"], far["nodes_not_joined"]) == ([0, 1], [], 0), far
        assert list(far["elsewhere_on"].values()) == [[2, 3]], far
        host = next(iter(far["elsewhere_on"]))
        assert f"for 2 of 4 ranks: ranks 2-3 on {host} (`blackbox status` there says which have not called it)" in (
            status(node0)), status(node0)  # fmt: skip
        # AND the stall rule ends the job on rank 3's leaf (a FIFO) at the timeout given, no step taken by anyone
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    err = results[1][1].decode()
    assert [p.returncode for p in procs] == [86, 86], [r[1][-2000:] for r in results]
    (stall,) = [e for e in read_events(str(node1 / "events.jsonl")) if e.get("event") == "stall"]
    rules = {f["rank"]: f["timeout_rule"] for f in stall["findings"]}
    assert rules.get(3) == "leaf fifo", stall
    assert "verdict: hang.io, suspect rank(s) 3" in err, err[-3000:]
