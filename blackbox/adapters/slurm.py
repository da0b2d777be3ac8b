"""What Slurm leaves in a process and says about a job: a job step's task identity in its environment (srun's
SLURM_* variables), its node lists, `scontrol show job`'s facts, and the srun command line that reaches every node
of a running job. Nothing else parses Slurm's formats. Imports the stdlib only."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

# How a job ended, from `scontrol show job`'s JobState, in the words a preemption event uses.
ENDINGS = {
    "CANCELLED": "cancelled (scancel)",
    "TIMEOUT": "time limit reached",
    "PREEMPTED": "preempted",
    "DEADLINE": "deadline reached",
    "NODE_FAIL": "a node failed",
    "BOOT_FAIL": "a node failed to boot",
}
# The facts of `scontrol show job` a bundle keeps (its node facts), under our names.
FACTS = {"JobId": "job_id", "JobName": "name", "Partition": "partition", "NodeList": "node_list",
         "NumNodes": "nodes", "NumTasks": "tasks", "TimeLimit": "time_limit", "RunTime": "run_time",
         "Restarts": "requeue_count", "Requeue": "requeue", "JobState": "state", "Reason": "reason",
         "StartTime": "start_time", "EndTime": "end_time", "BatchHost": "batch_host",
         "ExitCode": "exit_code"}  # fmt: skip


def _int(env: Mapping[str, str], *keys: str) -> Optional[int]:
    for key in keys:
        value = env.get(key, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def job_id_of(env: Mapping[str, str]) -> Optional[str]:
    """The Slurm job a process belongs to (any process of the job: batch script, srun task, its children)."""
    value = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    return value if value.isdigit() else None


@dataclass(frozen=True)
class Task:
    """A task of a job step that srun started (a batch script is no step task: it has no SLURM_STEP_ID)."""

    job_id: str
    step_id: str
    rank: int  # SLURM_PROCID: the task's rank in the step
    local_rank: int  # SLURM_LOCALID: its rank on its node
    tasks: int  # the step's tasks
    node_index: int  # SLURM_NODEID: the node's index in the step
    nodes: int  # the step's nodes
    tasks_here: int  # the step's tasks on this node
    node: str  # the node's name as Slurm knows it (SLURMD_NODENAME; several slurmd may share one host)
    node_list: str  # the step's (else the job's) nodes, in Slurm's compressed form
    restarts: int  # SLURM_RESTART_COUNT: how often the job was requeued

    @property
    def key(self) -> str:
        """What the tasks of one step agree on, and no other step or restart of the job shares."""
        return f"{self.job_id}.{self.step_id}" + (f"-r{self.restarts}" if self.restarts else "")


def task_of(env: Mapping[str, str], hostname: str = "") -> Optional[Task]:
    job, step = job_id_of(env), env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    rank, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID")
    if job is None or not step.isdigit() or rank is None or local is None:
        return None
    node_index = _int(env, "SLURM_NODEID") or 0
    tasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") or rank + 1
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "",
                              node_index)  # fmt: skip
    return Task(job, step, rank, local, tasks, node_index, _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES") or 1,
                per_node or 1, env.get("SLURMD_NODENAME") or hostname, env.get("SLURM_STEP_NODELIST") or
                env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "",
                _int(env, "SLURM_RESTART_COUNT") or 0)  # fmt: skip


def tasks_per_node(text: str, index: int) -> Optional[int]:
    """The count for node `index` in Slurm's tasks-per-node form: `2(x3),1` is 2, 2, 2, 1."""
    seen = 0
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        seen += int(m.group(2) or 1)
        if index < seen:
            return int(m.group(1))
    return None


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded: `gpu[003-005,012],cpu1` -> gpu003, gpu004, gpu005, gpu012, cpu1."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[\]]+)(?:\[([^\]]*)\])?([^,\[\]]*)", text):
        prefix, ranges, suffix = m.group(1).strip(), m.group(2), m.group(3).strip()
        if not prefix and ranges is None:
            continue
        if ranges is None:
            out.append(prefix + suffix)
            continue
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                out.append(f"{prefix}[{r}]{suffix}")
                continue
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{str(n).zfill(len(lo))}{suffix}")
    return out


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job` output (one job, `-o` or not) as key -> value. Values may hold spaces and `=`
    (`TRES=cpu=1,node=1`); a key starts after whitespace."""
    fields: dict[str, str] = {}
    keys = list(re.finditer(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9/:_.]*)=", text))
    for m, nxt in zip(keys, [*keys[1:], None]):
        fields.setdefault(m.group(1), text[m.end() : nxt.start() if nxt else len(text)].strip())
    return fields


def facts(fields: Mapping[str, str]) -> dict[str, object]:
    """The facts a bundle keeps, numbers as numbers."""
    out: dict[str, object] = {}
    for key, name in FACTS.items():
        value = fields.get(key)
        if value is None:
            continue
        out[name] = int(value) if value.isdigit() and name in ("nodes", "tasks", "requeue_count") else value
    return out


def ending(fields: Mapping[str, object]) -> Optional[str]:
    """How the job is ending, in words, when Slurm ends it (cancel, time limit, preemption); None while it runs."""
    state = str(fields.get("state") or "").split()[0] if fields.get("state") else ""
    return ENDINGS.get(state)


def show_job(job_id: str, timeout: float, env: Optional[Mapping[str, str]] = None) -> tuple[Optional[dict[str, object]],
                                                                                          str]:  # fmt: skip
    """(facts of `scontrol show job JOBID`, how it went); facts None where scontrol is missing, slow or refuses."""
    exe = shutil.which("scontrol", path=(env or {}).get("PATH")) or shutil.which("scontrol")
    if exe is None:
        return None, "scontrol not found"
    try:
        # its own session: Slurm signals the task's process group (a preemption's SIGTERM would end scontrol too)
        res = subprocess.run([exe, "show", "job", "-o", job_id], capture_output=True, text=True, timeout=timeout,
                             env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"scontrol did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"scontrol could not run: {exc.strerror}"
    if res.returncode != 0:
        return None, f"scontrol: {(res.stderr or res.stdout).strip()[:200] or f'exit {res.returncode}'}"
    return facts(parse_show_job(res.stdout)), "scontrol show job"


def srun_each_node(job_id: str, nodes: list[str], argv: list[str]) -> list[str]:
    """The srun command line that runs `argv` once on each of `nodes` of a running job, beside its own steps
    (`--overlap`: no resources taken from it), with labelled output, and nothing killed when one node fails."""
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--label",
            "--quiet", "--", *argv]  # fmt: skip
