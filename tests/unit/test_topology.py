"""Where a node stands in a multi-node job, read from the command line blackbox wraps or Slurm's environment."""

from __future__ import annotations

import pytest

from blackbox.coord.topology import derived_port, first_host, topology, torchrun_args
from blackbox.errors import BlackboxError

TORCHRUN = ["torchrun", "--nnodes", "4", "--node-rank", "2", "--nproc-per-node", "8", "--master-addr", "gpu001",
            "--master-port", "29600", "train.py", "--nnodes", "99"]  # fmt: skip


def test_torchrun_options_stop_at_the_script() -> None:
    args = torchrun_args(TORCHRUN)
    assert args is not None
    assert args["--nnodes"] == "4" and args["--node-rank"] == "2" and args["--master-port"] == "29600"
    assert torchrun_args(["python3", "-m", "torch.distributed.run", "--node_rank=1", "--standalone", "x.py"]) == {
        "--node-rank": "1", "--standalone": ""}  # fmt: skip
    assert torchrun_args(["python", "train.py"]) is None


def test_node_rank_count_and_address_from_torchrun() -> None:
    t = topology(TORCHRUN, {})
    assert t is not None
    assert (t.nnodes, t.node_rank, t.host, t.port, t.hosting) == (4, 2, "gpu001", 30600, False)
    t0 = topology([*TORCHRUN[:4], "0", *TORCHRUN[5:]], {})
    assert t0 is not None and t0.hosting and t0.job_key == t.job_key
    rdzv = topology(["torchrun", "--nnodes=1:8", "--rdzv-endpoint=10.0.0.5:29400", "--rdzv-id=42", "t.py"], {})
    assert rdzv is not None and (rdzv.nnodes, rdzv.node_rank, rdzv.port) == (8, None, 30400)
    assert "42" in rdzv.job_key


def test_single_node_and_off_mean_no_coordination() -> None:
    assert topology(["torchrun", "--standalone", "--nproc-per-node", "8", "t.py"], {}) is None
    assert topology(["torchrun", "--nnodes", "1", "t.py"], {}) is None
    assert topology(TORCHRUN, {}, coord="off") is None
    assert topology(["python", "train.py"], {}) is None


def test_slurm_environment_and_override() -> None:
    env = {"SLURM_NNODES": "3", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu[007-009]", "SLURM_JOB_ID": "77"}
    t = topology(["bash", "launch.sh"], env)
    assert t is not None and (t.nnodes, t.node_rank, t.host, t.port, t.hosting) == (3, 0, "gpu007", 30500, True)
    assert t.job_key.startswith("77")
    # srun starts every rank itself (8 tasks a node): the node's tasks share one supervisor, which coordinates
    t = topology(["python", "train.py"], {**env, "SLURM_NTASKS": "24", "SLURM_NODEID": "2", "SLURM_STEP_ID": "0",
                                          "SLURM_STEP_NODELIST": "gpu[008-010]"})  # fmt: skip
    assert t is not None and (t.nnodes, t.node_rank, t.host, t.hosting) == (3, 2, "gpu008", False)
    assert t.job_key.startswith("77:0")
    t = topology(["bash", "launch.sh"], env, coord="head:4000")
    assert t is not None and (t.host, t.port, t.source) == ("head", 4000, "--coord")
    t = topology(TORCHRUN, {}, coord_port=31000)
    assert t is not None and t.port == 31000
    assert first_host("node1,node2") == "node1" and first_host("a-[10-12,15]") == "a-10"
    assert derived_port(65000) == 64000


def test_unreadable_node_options_are_one_sentence() -> None:
    with pytest.raises(BlackboxError, match="node count and node rank"):
        topology(["torchrun", "--nnodes", "two", "t.py"], {})
    t = topology(["torchrun", "--nnodes", "2", "--node-rank", "1", "t.py"], {})  # torchrun's default host
    assert t is not None and (t.host, t.port) == ("127.0.0.1", 30500)
    with pytest.raises(BlackboxError, match="coordinator address"):
        topology(TORCHRUN, {}, coord="nohostport:")
