"""What Slurm leaves in a process and says about a job: a job step's task identity in its environment (srun's
SLURM_* variables), its node lists, `scontrol show job`'s facts, and the srun command line that reaches every node
of a running job. Nothing else parses Slurm's formats. Imports the stdlib only."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Optional, TypeVar

# How a job ended, from its state (JobState, or the base state in `scontrol --json`'s list), in the words a
# preemption event uses.
ENDINGS = {
    "CANCELLED": "cancelled (scancel)",
    "TIMEOUT": "time limit reached",
    "PREEMPTED": "preempted",
    "DEADLINE": "deadline reached",
    "NODE_FAIL": "a node failed",
    "BOOT_FAIL": "a node failed to boot",
}
# ... and from the Reason Slurm sets when it ends a job itself (the state says COMPLETING until every process of the
# job has ended: blackbox, one of them, never sees the final state).
REASONS = {
    "TimeLimit": "time limit reached",
    "DeadLine": "deadline reached",
    "NodeDown": "a node failed",
    "InactiveLimit": "inactive limit reached",
}
# ... and a job whose state underneath is an ordinary end while its steps still run: the allocation itself ended.
ALLOCATION_ENDED = ("COMPLETED", "FAILED", "OUT_OF_MEMORY")
ALLOCATION_ENDED_WORDS = "the job's allocation ended (its batch script or salloc exited)"
UNKNOWN = "unknown"
# The facts of `scontrol show job` a bundle keeps (its node facts), under our names.
FACTS = {"JobId": "job_id", "JobName": "name", "Partition": "partition", "NodeList": "node_list",
         "NumNodes": "nodes", "NumTasks": "tasks", "TimeLimit": "time_limit", "RunTime": "run_time",
         "Restarts": "requeue_count", "Requeue": "requeue", "JobState": "state", "Reason": "reason",
         "StartTime": "start_time", "EndTime": "end_time", "BatchHost": "batch_host",
         "ExitCode": "exit_code", "PreemptTime": "preempt_time"}  # fmt: skip


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


def ending(fields: Mapping[str, object], restarts: int = 0) -> tuple[str, str]:
    """(cause, why it is said) of a SIGTERM Slurm sent the job, from its facts asked at that moment (`restarts`: the
    requeue count the job started with). The cause is one of ENDINGS' and REASONS' words, "requeued", or "unknown"
    where Slurm does not say: `scontrol show job` says COMPLETING, whatever ended the job, until every process of it
    has ended, and only `--json` (Slurm 23.11 and later) carries the state underneath (`states`)."""
    state = str(fields.get("state") or "").split(" ")[0]
    listed = fields.get("states")
    states = [str(s) for s in listed] if isinstance(listed, list) else []
    for s in states:
        if s in ENDINGS or s in ALLOCATION_ENDED:
            return ENDINGS.get(s, ALLOCATION_ENDED_WORDS), f"state {'+'.join(states)}"
    if state in ENDINGS:
        return ENDINGS[state], f"state {state}"
    reason = str(fields.get("reason") or "")
    if reason in REASONS:
        return REASONS[reason], f"reason {reason}"
    preempt_time = str(fields.get("preempt_time") or "None")
    if preempt_time not in ("None", "Unknown", "N/A"):
        return "preempted", f"preempted at {preempt_time}"
    count = fields.get("requeue_count")
    if isinstance(count, int) and count > restarts:
        return "requeued", f"requeue count {restarts} -> {count}"
    if state == "RUNNING":
        return UNKNOWN, ("the job runs on: this step alone is being ended (scancel of the step, srun's "
                         "--kill-on-bad-exit after another task failed, the step's time limit) or the signal did not "
                         "come from Slurm")  # fmt: skip
    if state:
        return UNKNOWN, (f"Slurm says {state} and reason {reason or 'None'}: not the time limit, not a preemption "
                         "or requeue, so scancel or the end of the job's allocation; which one, this Slurm does not "
                         "say while the job's processes live (`scontrol --json` does from 23.11)")  # fmt: skip
    return UNKNOWN, "no state from Slurm"


def _scontrol(what: str, args: list[str], timeout: float, env: Optional[Mapping[str, str]]) -> tuple[Optional[str],
                                                                                                   str]:  # fmt: skip
    """(stdout of `scontrol ARGS`, how it went); None where scontrol is missing, slow or refuses."""
    exe = shutil.which("scontrol", path=(env or {}).get("PATH")) or shutil.which("scontrol")
    if exe is None:
        return None, "scontrol not found"
    try:
        # its own session: Slurm signals the task's process group (a preemption's SIGTERM would end scontrol too)
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                             env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"scontrol did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"scontrol could not run: {exc.strerror}"
    if res.returncode != 0:  # its last line says it (the lines before are the steps that led there)
        said = [line.strip() for line in (res.stderr or res.stdout).splitlines() if line.strip()]
        last = said[-1].removeprefix("scontrol: ")[:200] if said else f"exit {res.returncode}"
        return None, f"scontrol: {last}"
    return res.stdout, what


def show_job(job_id: str, timeout: float, env: Optional[Mapping[str, str]] = None) -> tuple[Optional[dict[str, object]],
                                                                                          str]:  # fmt: skip
    """(facts of `scontrol show job JOBID`, how it went); facts None where scontrol is missing, slow or refuses."""
    out, how = _scontrol("scontrol show job", ["show", "job", "-o", job_id], timeout, env)
    return (facts(parse_show_job(out)) if out is not None else None), how


def job_states(text: str) -> Optional[list[str]]:
    """The job's state words from `scontrol --json show job` (Slurm 23.11 and later: a list, the base state with its
    flags, `["CANCELLED", "COMPLETING"]`; 23.02: one word); None where the text is no such answer."""
    try:
        jobs = json.loads(text).get("jobs")
        value = jobs[0].get("job_state") if isinstance(jobs, list) and jobs and isinstance(jobs[0], dict) else None
    except (ValueError, AttributeError):
        return None
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in value] if isinstance(value, list) and value else None


def show_job_states(job_id: str, timeout: float, env: Optional[Mapping[str, str]] = None) -> tuple[Optional[list[str]],
                                                                                                  str]:  # fmt: skip
    """(`job_states` of a job, asked of scontrol; how it went); None where this Slurm has no `--json` (before 23.02)
    or refuses."""
    out, how = _scontrol("scontrol --json show job", ["--json", "show", "job", job_id], timeout, env)
    return (job_states(out) if out is not None else None), how


# what scontrol says when the controller did not answer in time (a controller busy ending many jobs at once): asked
# again, it may answer
BUSY = ("did not answer within", "Socket timed out", "Unable to contact slurm controller", "slurm_load_jobs error")
ASK_AGAIN_S = 0.5


def ask_job(job_id: str, deadline: float, env: Optional[Mapping[str, str]] = None) -> tuple[Optional[dict[str, object]],
                                                                                          str]:  # fmt: skip
    """`show_job`, asked again while scontrol gives no facts, whatever it said (see _asked_again)."""
    return _asked_again(lambda timeout: show_job(job_id, timeout, env), deadline, lambda how: True)


def ask_job_states(job_id: str, deadline: float, env: Optional[Mapping[str, str]] = None) -> Optional[list[str]]:
    """`show_job_states`, asked again while the controller is busy (BUSY); asked once of a Slurm without `--json`
    (it refuses the option: asking again would only wait)."""
    states, _ = _asked_again(lambda timeout: show_job_states(job_id, timeout, env), deadline,
                             lambda how: any(words in how for words in BUSY))  # fmt: skip
    return states


_A = TypeVar("_A")


def _asked_again(ask: Callable[[float], tuple[Optional[_A], str]], deadline: float,
                 again: Callable[[str], bool]) -> tuple[Optional[_A], str]:  # fmt: skip
    """`ask(timeout)`, asked again every ASK_AGAIN_S while it answers None and `again(how it went)`, until a second
    before `deadline` (time.monotonic())."""
    answer, how = ask(max(0.5, deadline - time.monotonic()))
    while answer is None and again(how) and deadline - time.monotonic() > 1.0:
        time.sleep(ASK_AGAIN_S)
        answer, how = ask(max(0.5, deadline - time.monotonic()))
    return answer, how


def srun_each_node(job_id: str, nodes: list[str], argv: list[str]) -> list[str]:
    """The srun command line that runs `argv` once on each of `nodes` of a running job, beside its own steps
    (`--overlap`: no resources taken from it), with labelled output, and nothing killed when one node fails."""
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--label",
            "--quiet", "--", *argv]  # fmt: skip
