"""`blackbox collect --slurm-job JOBID`: a Slurm job's rank processes on this node, found by the job id in their
environment (started under `blackbox run` or not), as a Job to collect; and the fan-out that runs that on every
node of the job through `srun --overlap` and gathers what each node said. Imports the stdlib, blackbox's adapters,
the collection's job model and errors; never prints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import host, procfs, slurm, torchelastic
from ..errors import BlackboxError
from .job import Job, RankTarget, _heartbeat, _is_python, is_blackbox, job_python

RESULT_MARK = "blackbox-node-result: "  # the line each node prints for the fan-out, then one JSON object


def _env(pid: int) -> Optional[dict[str, str]]:
    try:
        return procfs.environ(pid)
    except (OSError, procfs.ProcAccessError):
        return None


def identity(env: Mapping[str, str]) -> Optional[tuple[int, Optional[int], Optional[int]]]:
    """(rank, local rank, world size) of a rank: torchrun's variables, else the Slurm task's."""
    rank = torchelastic.rank_of(env)
    if rank is not None:
        return rank, torchelastic.local_rank_of(env), torchelastic.world_size_of(env)
    task = slurm.task_of(env)
    return (task.rank, task.local_rank, task.tasks) if task is not None else None


def _is_supervisor(argv: list[str]) -> bool:
    """A `blackbox run` (or collect) process: it carries the job's Slurm variables but is no rank."""
    return is_blackbox(argv, "run", "collect")


def _all_pids() -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    except OSError:
        return []


def discover_node(job_id: str) -> Job:
    """The ranks of Slurm job `job_id` on this node: Python processes of the job with a rank (RANK, or srun's
    SLURM_PROCID in a step task), not a launcher (torchrun's agent), not a `blackbox` supervisor, and not a
    child of a rank (its DataLoader workers inherit its variables)."""
    mine = {os.getpid(), os.getppid()}
    here = os.environ.get("SLURMD_NODENAME")  # several slurmd may share a host: only this node's processes
    found: dict[int, tuple[dict[str, str], list[str]]] = {}
    for pid in _all_pids():
        if pid in mine:
            continue
        env = _env(pid)
        if env is None or slurm.job_id_of(env) != job_id or env.get("BLACKBOX_SLURM_COLLECT") == "1":
            continue
        if here and env.get("SLURMD_NODENAME", here) != here:
            continue
        found[pid] = (env, procfs.cmdline(pid))
    if not found:
        raise BlackboxError(f"No process of Slurm job `{job_id}` runs on this node that this user can read.",
                            hint="Run as the job's user (or root), on a node of the job.")  # fmt: skip
    parents = {pid: (procfs.proc_stat(pid).ppid if procfs.proc_stat(pid) else 0) for pid in found}  # type: ignore[union-attr]
    candidates = {
        pid for pid, (env, argv) in found.items()
        if identity(env) is not None and _is_python(pid) and not _is_supervisor(argv)
        and not torchelastic.is_launcher(argv) and not (torchelastic.rank_of(env) is None and any(
            parents.get(c) == pid and torchelastic.rank_of(found[c][0]) is not None for c in found))
    }  # fmt: skip

    def under_a_rank(pid: int) -> bool:
        seen, p = set(), parents.get(pid, 0)
        while p in found and p not in seen:
            if p in candidates:
                return True
            seen.add(p)
            p = parents.get(p, 0)
        return False

    rank_pids = sorted((p for p in candidates if not under_a_rank(p)), key=lambda p: identity(found[p][0]) or (0,))
    notes: list[str] = []
    ranks: list[RankTarget] = []
    taken: set[int] = set()
    world = 0
    for pid in rank_pids:
        env = found[pid][0]
        rank, local, size = identity(env) or (0, None, None)
        if rank in taken:
            notes.append(f"process {pid} also says it is rank {rank}: not collected as a rank")
            continue
        taken.add(rank)
        world = max(world, size or 0)
        st = procfs.proc_stat(pid)
        rdir = env.get(P.ENV_RUN_DIR)
        ranks.append(RankTarget(rank, pid, st.start_ticks if st else 0, st is not None and st.state not in "ZX",
                                _heartbeat(rdir, rank, pid) if rdir else None, None, local))  # fmt: skip
    if not ranks:
        top = min(found)
        notes.append(f"no process of job {job_id} on this node has a rank (RANK or a Slurm task's SLURM_PROCID): "
                     f"collecting process {top} alone")  # fmt: skip
        st = procfs.proc_stat(top)
        ranks.append(RankTarget(0, top, st.start_ticks if st else 0, True, None, None, 0))
    first = ranks[0].pid
    env = found.get(first, (_env(first) or {}, []))[0]
    agent = parents.get(first) if torchelastic.is_launcher(found.get(parents.get(first, 0), ({}, []))[1]) else None
    task = slurm.task_of(env)
    run_id = env.get(P.ENV_RUN_ID) or (f"slurm-{task.key}" if task else f"slurm-{job_id}")
    top = agent or first
    return Job(
        run_id=run_id, node=(task.node if task else "") or env.get("SLURMD_NODENAME") or host.hostname(),
        argv=procfs.cmdline(top), cwd=procfs.cwd(top) or "/", env=env, python=job_python(first),
        run_dir=env.get(P.ENV_RUN_DIR) or None, ranks=ranks, world_size=world or len(ranks), agent_pid=agent,
        mode="collect", notes=notes, owner=procfs.uid(first),
    )  # fmt: skip


# --- the fan-out ---------------------------------------------------------------------------------------------
@dataclass
class NodeOutcome:
    node: str
    result: Optional[dict[str, Any]] = None  # what the node's collect said (bundle, ranks, notes, steps)
    error: Optional[str] = None  # why there is none: it did not answer, it failed


@dataclass
class FanOut:
    job_id: str
    nodes: list[NodeOutcome] = field(default_factory=list)
    facts: Optional[dict[str, Any]] = None  # scontrol show job
    duration_s: float = 0.0
    srun_error: str = ""

    @property
    def bundles(self) -> list[str]:
        return [n.result["bundle"] for n in self.nodes if n.result and isinstance(n.result.get("bundle"), str)]


def running_job(job_id: str, env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """A running Slurm job's facts (`scontrol show job`) and its nodes; BlackboxError, in one sentence, for a job that
    cannot be read, is not running or has no node."""
    facts, how = slurm.show_job(job_id, 15.0, env)
    if facts is None:
        raise BlackboxError(f"Cannot read Slurm job `{job_id}`: {how}.",
                            hint="Check the job id with `squeue -u $USER`; run this where `scontrol` and `srun` "
                                 "reach the cluster (a login node, or inside the allocation).")  # fmt: skip
    state = str(facts.get("state") or "")
    if not state.startswith(("RUNNING", "SUSPENDED", "COMPLETING")):
        raise BlackboxError(f"Slurm job `{job_id}` is not running (state `{state or 'unknown'}`): there is nothing "
                            "to collect.", hint="`blackbox report` reads the bundles it left, if any.")  # fmt: skip
    nodes = slurm.expand_nodelist(str(facts.get("node_list") or ""))
    if not nodes:
        raise BlackboxError(f"Slurm job `{job_id}` has no node list (`scontrol show job {job_id}`).")
    return facts, nodes


def fan_out(job_id: str, facts: dict[str, Any], nodes: list[str], out_dir: str, per_node: float, options: list[str],
            env: Mapping[str, str]) -> FanOut:  # fmt: skip
    """Run `blackbox collect --slurm-node JOBID` on every node of the running job (`running_job`) through srun, within
    `per_node` seconds (then srun is ended); every node writes its bundle into `out_dir` (a directory the nodes
    share)."""
    argv = [sys.executable, "-m", "blackbox", "collect", "--slurm-node", job_id, "--out", out_dir, *options]
    cmd = slurm.srun_each_node(job_id, nodes, argv)
    run_env = {**env, "BLACKBOX_SLURM_COLLECT": "1"}
    result = FanOut(job_id, [NodeOutcome(n) for n in nodes], facts)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=run_env, text=True, start_new_session=True)  # fmt: skip
    except OSError as exc:
        raise BlackboxError(f"Cannot run `srun`: {exc.strerror}.", hint="Run this where Slurm's commands are on PATH.",
                            exit_code=127) from None  # fmt: skip
    timed_out = False
    try:
        out, err = proc.communicate(timeout=per_node + 30.0)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGINT)  # srun ends its step on SIGINT (twice within a second)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    result.duration_s = round(time.monotonic() - start, 1)
    by_task: dict[int, dict[str, Any]] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+):\s?(.*)", line)
        if m and m.group(2).startswith(RESULT_MARK):
            try:
                by_task[int(m.group(1))] = json.loads(m.group(2)[len(RESULT_MARK) :])
            except ValueError:
                continue
    errors: dict[int, list[str]] = {}
    for line in err.splitlines():
        m = re.match(r"\s*(\d+):\s?blackbox: (?:error: )?(.*)", line)
        if m:
            errors.setdefault(int(m.group(1)), []).append(m.group(2))
    by_node = {r.get("node"): r for r in by_task.values()}
    for i, outcome in enumerate(result.nodes):  # srun numbers the tasks in node order, one a node
        outcome.result = by_node.get(outcome.node) or by_task.get(i)
        if outcome.result is None:
            said = "; ".join(errors.get(i, []))[:300]
            outcome.error = said or (f"did not answer within {per_node + 30.0:g} s" if timed_out else "did not answer")
    if proc.returncode not in (0, None) and not by_task:
        result.srun_error = "; ".join(line for line in err.splitlines() if line.strip())[:500]
    return result
