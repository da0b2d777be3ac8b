"""`blackbox collect`'s core: where the bundle goes, one node's collection (the process tree of a PID, or this node's
ranks of a Slurm job) and a whole Slurm job's (a bundle a node, through srun). Never prints: progress goes to a
callback, the outcome is returned. Imports the stdlib, the collector, discovery and the Slurm fan-out."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

from .._recorder import protocol as P
from ..detections import Trigger
from ..errors import EXIT_CANT_CREATE, BlackboxError
from .collector import CollectOptions, Collector, CollectResult, disk_full
from .job import Job, discover
from .slurm_job import RESULT_MARK, FanOut, discover_node, fan_out, running_job


def out_target(out: Optional[str], run_dir: Optional[str]) -> tuple[str, Optional[str]]:
    """(directory, file name or None): `--out` names a .tar.gz file or a directory; by default the job's run
    directory when it runs under `blackbox run` (and it is writable), else the current directory."""
    if out is not None:
        if out.endswith((".tar.gz", ".tgz")):
            return os.path.dirname(os.path.abspath(out)), os.path.basename(out)
        return os.path.abspath(out), None
    if run_dir:
        bundles = os.path.join(run_dir, P.BUNDLES_DIR)
        if os.access(bundles, os.W_OK):
            return bundles, None
    return os.getcwd(), None


def make_out_dir(out_dir: str, check_writable: bool = True) -> None:
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise BlackboxError(f"Cannot create `{out_dir}`: {exc.strerror}.", exit_code=EXIT_CANT_CREATE) from None
    if check_writable and not os.access(out_dir, os.W_OK):
        raise BlackboxError(f"Cannot write into `{out_dir}`.", hint="Give a writable place with --out.",
                            exit_code=EXIT_CANT_CREATE)  # fmt: skip


def find_job(pid: Optional[int], slurm_node: Optional[str]) -> Job:
    """The job to collect: this node's ranks of a Slurm job, or the process tree of `pid`; its credentials (env,
    stores, config files) are known to the redaction from here on."""
    from ..redact import add_known_secrets

    job = discover_node(slurm_node) if slurm_node is not None else discover(pid or 0)
    add_known_secrets(job.env, job.argv, job.cwd)
    return job


def collect_node(job: Job, out_dir: str, out_name: Optional[str], options: CollectOptions,
                 progress: Callable[[str], None]) -> CollectResult:  # fmt: skip
    """One bundle of `job` into `out_dir`; the job keeps running. A full disk or an unwritable place: BlackboxError."""
    from ..heartbeat_reader import HeartbeatTable

    table = HeartbeatTable(os.path.join(job.run_dir, P.RANKS_DIR), lambda p, m: None, job.owner) if job.run_dir \
        else None  # fmt: skip
    try:
        return Collector(job, table, None, options, progress=progress).collect(Trigger("manual"), None, None, out_dir,
                                                                              out_name)  # fmt: skip
    except OSError as exc:
        full = disk_full(exc, out_dir)
        raise BlackboxError(f"{full}, and the job runs on." if full is not None else
                            f"Cannot write the bundle into `{out_dir}`: {exc.strerror}.",
                            exit_code=EXIT_CANT_CREATE) from None  # fmt: skip
    finally:
        if table is not None:
            table.close()


def node_result_line(job: Job, result: CollectResult) -> str:
    """What a node's collection tells the fan-out that started it: one marked line of JSON."""
    return RESULT_MARK + json.dumps({
        "bundle": result.path, "run_id": job.run_id, "node": job.node, "duration_s": result.duration_s,
        "ranks": [r.rank for r in job.ranks], "notes": job.notes,
        "failed": [f"{s.name}: {s.status}: {s.detail}" for s in result.steps if s.status != "ok"],
    }) + "\n"  # fmt: skip


@dataclass
class SlurmCollection:
    job_id: str
    out_dir: str
    fan: FanOut
    here: list[str] = field(default_factory=list)  # the node bundles this machine sees
    unseen: list[str] = field(default_factory=list)  # written by a node, not visible here (--out not shared)


def slurm_out_dir(job_id: str, out: Optional[str]) -> str:
    """The directory every node writes its bundle into (made once the job is found running): --out, else
    blackbox-slurm-JOBID-STAMP."""
    if not job_id.isdigit():
        raise BlackboxError(f"`{job_id}` is not a Slurm job id (a number, as `squeue` shows it).")
    if out is not None and out.endswith((".tar.gz", ".tgz")):
        raise BlackboxError("With --slurm-job, --out is a directory: each node writes its own bundle into it.")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.abspath(out or f"blackbox-slurm-{job_id}-{stamp}")


def node_options(options: CollectOptions) -> list[str]:
    """The command-line options each node's collection is given."""
    return ["--dump-timeout", str(options.dump_timeout), "--budget", str(options.budget)] + (
        ["--native"] if options.native else []) + (["--locals"] if options.locals else [])  # fmt: skip


def collect_slurm_job(job_id: str, out_dir: str, options: CollectOptions, env: Mapping[str, str]) -> SlurmCollection:
    """Every node of a running Slurm job, through srun: a bundle each into `out_dir`, created once the job is found
    running (a job that is not leaves no empty directory behind)."""
    facts, nodes = running_job(job_id, env)
    make_out_dir(out_dir, check_writable=False)
    fan = fan_out(job_id, facts, nodes, out_dir, options.budget, node_options(options), env)
    here = [b for b in fan.bundles if os.path.exists(b)]
    outcome = SlurmCollection(job_id, out_dir, fan, here, [b for b in fan.bundles if b not in here])
    return outcome
