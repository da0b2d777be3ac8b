"""The job a collection is about: its ranks (pid, identity, recorder heartbeat where there is one) and where it
runs; and, for `blackbox collect PID`, finding all of that from any one pid by walking the process tree.
Imports the stdlib, blackbox's adapters, the heartbeat decoder and errors. Never signals anything."""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from .._recorder import protocol as P
from ..adapters import host, procfs, torchelastic
from ..errors import EXIT_NO_PERMISSION, BlackboxError
from ..heartbeat_reader import HeartbeatFormatError, HeartbeatState, decode
from ..safeopen import RunDir

PERMISSION_HINT = (
    "Run `blackbox collect` as the job's user, or as root (sudo); in a container the collector needs the "
    "same PID namespace as the job and --cap-add SYS_PTRACE."
)


@dataclass(frozen=True)
class RankTarget:
    """One rank to collect from. `hb` is its recorder heartbeat, None when the recorder is not in it."""

    rank: int
    pid: int
    start_ticks: int
    alive: bool
    hb: Optional[HeartbeatState] = None
    exit_status: Optional[str] = None
    local_rank: Optional[int] = None


@dataclass
class Job:
    run_id: str
    node: str
    argv: list[str]  # the launcher's command line (what the user typed), unredacted: redact before writing
    cwd: str
    env: dict[str, str]  # a rank's environment (or blackbox's own), unredacted: redact before writing
    python: Optional[str]  # the job's interpreter, to list the packages the job sees
    run_dir: Optional[str]  # the run directory when the job runs under `blackbox run`
    ranks: list[RankTarget]
    world_size: int
    agent_pid: Optional[int] = None
    mode: str = "run"  # run | collect
    notes: list[str] = field(default_factory=list)  # what discovery could not do, in sentences
    history: dict[int, list[dict[str, object]]] = field(default_factory=dict)  # rank -> heartbeat changes
    gpu_history: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # GPU index -> readings
    rank_gpus: tuple[dict[int, list[int]], str] = ({}, "not mapped")  # rank -> GPU indices, and how it was found
    owner: Optional[int] = None  # the job's user: only its files are read from the run directory (None: any)
    incident: Optional[dict[str, object]] = None  # the incident this collection is for (every node's bundle has it)
    coordination: Optional[dict[str, object]] = None  # multi-node: the coordination's state and the other nodes

    def identity(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "node": self.node, "world_size": self.world_size, "agent_pid": self.agent_pid,
            "mode": self.mode, "local_ranks": [
                {"rank": r.rank, "pid": r.pid, "local_rank": r.local_rank, "recorder": r.hb is not None,
                 "alive": r.alive} for r in self.ranks],
        }  # fmt: skip


def job_python(pid: int) -> Optional[str]:
    """The interpreter a process runs, as it was started (a venv's `bin/python`, not the resolved binary)."""
    argv = procfs.cmdline(pid)
    if argv and os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK):
        return argv[0]
    return procfs.exe(pid)


def _is_python(pid: int) -> bool:
    names = [os.path.basename(procfs.exe(pid) or ""), os.path.basename((procfs.cmdline(pid) or [""])[0])]
    return any(n.startswith("python") or n in ("pt_elastic", "torchrun") for n in names)


def _is_rank(pid: int, env: Optional[Mapping[str, str]]) -> bool:
    """A Python process with RANK and LOCAL_RANK that is not torchrun itself (an outer launcher or a job
    template may leave RANK in torchrun's own environment)."""
    return (env is not None and torchelastic.rank_of(env) is not None and _is_python(pid)
            and not torchelastic.is_launcher(procfs.cmdline(pid)))  # fmt: skip


def _heartbeat(run_dir: str, rank: int, pid: int) -> Optional[HeartbeatState]:
    """The recorder's heartbeat of this rank, if the file there belongs to this very process (and is a regular
    file of the process's user: the run directory is named by the job's environment)."""
    try:
        fd = RunDir(run_dir, procfs.uid(pid)).open_fd(f"{P.RANKS_DIR}/{rank}/{P.RANK_HEARTBEAT}")
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        with mm:
            hb = decode(mm)
    except (OSError, ValueError, HeartbeatFormatError):
        return None
    return hb if hb.pid == pid else None


def _env(pid: int) -> Optional[dict[str, str]]:
    try:
        return procfs.environ(pid)
    except (OSError, procfs.ProcAccessError):
        return None


def ancestors(pid: int, through_init: bool = False) -> list[int]:
    """The processes above `pid`, nearest first; PID 1 too with `through_init` (a container's first process)."""
    out = []
    st = procfs.proc_stat(pid)
    while st is not None and st.ppid > (0 if through_init else 1) and st.ppid not in out:
        out.append(st.ppid)
        st = procfs.proc_stat(st.ppid)
    return out


def is_blackbox(argv: list[str], *commands: str) -> bool:
    """Whether a command line is `blackbox COMMAND …` (the console script, or `python -m blackbox`) for one of
    `commands`."""
    names = [os.path.basename(a) for a in argv[:3]]
    return "blackbox" in names and any(a in commands for a in argv[1:4])


def _ranks_below(root: int, like: Optional[Mapping[str, str]]) -> list[tuple[int, dict[str, str]]]:
    """Python processes under `root` (root included) that are ranks, stopping at each rank: its own children
    (DataLoader workers inherit RANK) are its helpers, not ranks. A shell with RANK (`torchrun --no-python
    run.sh`) is looked through. `like`: keep only ranks of that job."""
    found: list[tuple[int, dict[str, str]]] = []
    todo = [root]
    seen: set[int] = set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        env = _env(pid)
        if env is not None and _is_rank(pid, env):
            if like is None or torchelastic.same_job(env, like):
                found.append((pid, env))
            continue
        todo.extend(procfs.children(pid))
    return found


def discover(pid: int) -> Job:
    """The job `pid` belongs to. `pid` may be torchrun's agent, a rank, a rank's DataLoader worker, a
    `blackbox run` supervisor, or any process above the ranks (a shell script); a process outside any torch
    job is collected alone, and says so."""
    if pid <= 0 or procfs.proc_stat(pid) is None:
        raise BlackboxError(f"No process with pid `{pid}` exists on this host.",
                            hint="Check the pid with `ps -ef | grep python`; a job on another node needs "
                                 "`blackbox collect` run on that node.")  # fmt: skip
    try:
        env = procfs.environ(pid)
    except procfs.ProcAccessError:
        raise BlackboxError(f"Permission denied reading `/proc/{pid}/environ`: the process belongs to another "
                            "user or is protected from this one.",
                            hint=PERMISSION_HINT, exit_code=EXIT_NO_PERMISSION) from None  # fmt: skip
    except OSError:
        raise BlackboxError(f"The process `{pid}` ended while it was being read.") from None
    notes: list[str] = []
    agent: Optional[int] = None
    rank_procs: list[tuple[int, dict[str, str]]]
    if _is_rank(pid, env):
        # A rank or a rank's helper: climb to the topmost Python process with a rank, then to its launcher
        # (through a shell that carries RANK too).
        top, top_env = pid, env
        for anc in ancestors(pid):
            anc_env = _env(anc)
            if (
                anc_env is None
                or torchelastic.rank_of(anc_env) is None
                or torchelastic.is_launcher(procfs.cmdline(anc))
            ):
                agent = anc
                break
            if _is_python(anc):
                top, top_env = anc, anc_env
        rank_procs = _ranks_below(agent, top_env) if agent is not None else [(top, top_env)]
    else:
        rank_procs = _ranks_below(pid, None)
        if rank_procs:
            agent = pid
    if not rank_procs:
        if not _is_python(pid):
            raise BlackboxError(
                f"The process `{pid}` is not a Python process and no rank of a torch job runs under it.",
                hint="Give the pid of torchrun, of a rank or of a DataLoader worker (`ps -ef | grep python`).",
            )
        notes.append(f"process {pid} is not part of a torch job (no RANK in its environment or below it): "
                     "collecting that one process anyway")  # fmt: skip
        rank_procs = [(pid, env)]
    # Agent: torchrun's process, if it is one; above it may sit a `blackbox run` supervisor.
    first_env = rank_procs[0][1]
    run_dir = first_env.get(P.ENV_RUN_DIR) or None
    ranks: list[RankTarget] = []
    for rpid, renv in sorted(rank_procs, key=lambda pe: torchelastic.rank_of(pe[1]) or 0):
        rank = torchelastic.rank_of(renv)
        rank = 0 if rank is None else rank
        st = procfs.proc_stat(rpid)
        rdir = renv.get(P.ENV_RUN_DIR)
        hb = _heartbeat(rdir, rank, rpid) if rdir else None
        ranks.append(RankTarget(rank, rpid, st.start_ticks if st else 0, st is not None and st.state not in "ZX",
                                hb, None, torchelastic.local_rank_of(renv)))  # fmt: skip
    if run_dir and not any(r.hb for r in ranks):
        notes.append(f"the job runs under `blackbox run` (run dir {run_dir}) but no rank's heartbeat could be "
                     "read: its recorder may be off")  # fmt: skip
    run_id = first_env.get(P.ENV_RUN_ID) or torchelastic.run_id_of(first_env) or f"pid{agent or pid}"
    top_pid = agent if agent is not None else rank_procs[0][0]
    return Job(
        run_id=run_id, node=host.hostname(), argv=procfs.cmdline(top_pid), cwd=procfs.cwd(top_pid) or "/",
        env=first_env, python=job_python(rank_procs[0][0]), run_dir=run_dir, ranks=ranks,
        world_size=torchelastic.world_size_of(first_env) or len(ranks), agent_pid=agent, mode="collect",
        notes=notes, owner=procfs.uid(rank_procs[0][0]),
    )  # fmt: skip
