"""`blackbox collect PID` / `--slurm-job JOBID`: bundle the evidence of a running job, started with blackbox or not,
and leave it running — one node (the process tree of PID), or every node of a Slurm job (one bundle each, one merged
report). Parses, calls the core (discovery, collector, the Slurm fan-out), renders progress and the outcome."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import click

from .._recorder import protocol as P
from ..errors import EXIT_CANT_CREATE, BlackboxError


def _disk_full(exc: OSError, out_dir: str) -> Optional[str]:
    from ..collect.collector import disk_full

    full = disk_full(exc, out_dir)
    return None if full is None else f"{full}, and the job runs on."


def _out_target(out: Optional[str], run_dir: Optional[str]) -> tuple[str, Optional[str]]:
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


@click.command()
@click.argument("pid", type=int, required=False)
@click.option("--slurm-job", "slurm_job", default=None, metavar="JOBID",
              help="Collect every node of this running Slurm job (through `srun --overlap`): one bundle per node "
                   "into one directory (--out), then one merged report.")  # fmt: skip
@click.option(
    "--slurm-node",
    "slurm_node",
    default=None,
    hidden=True,
    metavar="JOBID",
    help="(internal: what --slurm-job runs on each node) collect this node's ranks of the job.",
)
@click.option(
    "--out",
    default=None,
    metavar="PATH",
    help="Where the bundle goes: a directory, or a file name ending in .tar.gz "
    "[default: the job's run directory under `blackbox run`, else the current directory].",
)
@click.option("--native", is_flag=True, help="Native (C/C++) frames in the py-spy stacks (about 1 s a process).")
@click.option(
    "--locals",
    "with_locals",
    is_flag=True,
    help="Local variables in the py-spy stacks (values redacted; they may still hold data).",
)
@click.option(
    "--dump-timeout",
    type=float,
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds per process for py-spy, and for the ranks' own dumps.",
)
@click.option(
    "--budget",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds the whole collection may take.",
)
@click.option("--format", "fmt", type=click.Choice(["terminal", "json"]), default="terminal", show_default=True,
              help="`json`: print the outcome (bundle path, steps) as JSON on stdout.")  # fmt: skip
def collect(pid: Optional[int], slurm_job: Optional[str], slurm_node: Optional[str], out: Optional[str],
            native: bool, with_locals: bool, dump_timeout: float, budget: float, fmt: str) -> int:  # fmt: skip
    """Collect the evidence of a running (hung) job into one bundle; the job keeps running.

    PID may be torchrun's agent, any rank, a DataLoader worker, or a `blackbox run` supervisor: the
    process tree is walked to find every rank of the job on this node. Stacks come from py-spy (from
    outside) and /proc; ranks that run the blackbox recorder also write their own dump. Nothing is
    stopped or killed, and no process without a SIGUSR1 handler is ever signalled.

        blackbox collect $(pgrep -f torchrun | head -1)
        blackbox collect --slurm-job 123456          # every node of a Slurm job, from a login node
    """
    if slurm_job is not None and slurm_node is None:
        if pid is not None:
            raise BlackboxError("Give a PID or --slurm-job, not both.")
        return _collect_slurm_job(slurm_job, out, native, with_locals, dump_timeout, budget, fmt)
    if pid is None and slurm_node is None:
        raise BlackboxError("Give the PID of a process of the job, or --slurm-job JOBID.",
                            hint="For example: blackbox collect $(pgrep -o -f torchrun)")  # fmt: skip
    from rich.console import Console

    from ..analyze.model import describe_seen
    from ..bundle.reader import Bundle
    from ..collect.collector import CollectOptions, Collector
    from ..collect.job import discover
    from ..collect.slurm_job import RESULT_MARK, discover_node
    from ..detections import Trigger
    from ..heartbeat_reader import HeartbeatTable
    from ..intake import Intake
    from ..redact import add_known_secrets
    from ..render import printable

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    job = discover_node(slurm_node) if slurm_node is not None else discover(pid or 0)
    add_known_secrets(job.env, job.argv, job.cwd)  # the job's credentials (env, stores, config files): scrubbed
    out_dir, out_name = _out_target(out, job.run_dir)
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise BlackboxError(f"Cannot create `{out_dir}`: {exc.strerror}.", exit_code=EXIT_CANT_CREATE) from None
    if not os.access(out_dir, os.W_OK):
        raise BlackboxError(f"Cannot write into `{out_dir}`.", hint="Give a writable place with --out.",
                            exit_code=EXIT_CANT_CREATE)  # fmt: skip
    ranks = ", ".join(f"{r.rank} (pid {r.pid}{', recorder' if r.hb else ''})" for r in job.ranks)
    err.print(f"blackbox: job {job.run_id} on {job.node}: rank(s) {ranks}", markup=False)
    for note in job.notes:
        err.print(f"blackbox: note: {note}", markup=False)
    table = HeartbeatTable(os.path.join(job.run_dir, P.RANKS_DIR), lambda p, m: None, job.owner) if job.run_dir \
        else None  # fmt: skip
    options = CollectOptions(dump_timeout=dump_timeout, budget=budget, native=native, locals=with_locals)
    try:
        with err.status("collecting", spinner="dots") as status:
            result = Collector(job, table, None, options, progress=lambda m: status.update(m)).collect(
                Trigger("manual"), None, None, out_dir, out_name
            )
    except OSError as exc:
        raise BlackboxError(_disk_full(exc, out_dir) or f"Cannot write the bundle into `{out_dir}`: {exc.strerror}.",
                            exit_code=EXIT_CANT_CREATE) from None  # fmt: skip
    finally:
        if table is not None:
            table.close()
    if slurm_node is not None:  # for the fan-out that started this node's collection: one line
        sys.stdout.write(RESULT_MARK + json.dumps({
            "bundle": result.path, "run_id": job.run_id, "node": job.node, "duration_s": result.duration_s,
            "ranks": [r.rank for r in job.ranks], "notes": job.notes,
            "failed": [f"{s.name}: {s.status}: {s.detail}" for s in result.steps if s.status != "ok"],
        }) + "\n")  # fmt: skip
        sys.stdout.flush()
        return 0
    if fmt == "json":
        sys.stdout.write(json.dumps({
            "bundle": result.path, "run_id": job.run_id, "node": job.node, "duration_s": result.duration_s,
            "ranks": [{"rank": r.rank, "pid": r.pid, "recorder": r.hb is not None} for r in job.ranks],
            "notes": job.notes, "steps": [s.__dict__ for s in result.steps],
        }, indent=2) + "\n")  # fmt: skip
    for step in result.steps:
        if step.status != "ok":
            err.print(f"blackbox: {step.name}: {step.status}: {step.detail}", markup=False)
    err.print(f"blackbox: evidence bundle ({result.duration_s:.1f} s): {result.path}", markup=False)

    def say(message: str) -> None:
        err.print(f"blackbox: {message}", markup=False)

    try:  # the new bundle, in memory, indexed; when this failure has been seen before, say so
        seen = Intake(Bundle.of(result.written), lambda m: say(f"warning: {m}")).report.similar_incidents
    except Exception as exc:  # never fails the collection: the bundle is written
        say(f"warning: the new bundle could not be analysed for the incident index ({exc})")
        seen = []
    for entry in seen[:3]:
        say(f"seen before: {printable(describe_seen(entry))}")
    err.print(f"blackbox: next: blackbox report {result.path}", markup=False)
    return 0


def _collect_slurm_job(job_id: str, out: Optional[str], native: bool, with_locals: bool, dump_timeout: float,
                       budget: float, fmt: str) -> int:  # fmt: skip
    """Every node of a Slurm job: a bundle each into one directory, then the merged report."""
    from datetime import datetime, timezone

    from ..bundle.reader import read_bundles
    from ..collect.slurm_job import fan_out
    from ..intake import Intake
    from ..render.json_render import render_json
    from ..render.terminal import render_terminal

    if not job_id.isdigit():
        raise BlackboxError(f"`{job_id}` is not a Slurm job id (a number, as `squeue` shows it).")
    if out is not None and out.endswith((".tar.gz", ".tgz")):
        raise BlackboxError("With --slurm-job, --out is a directory: each node writes its own bundle into it.")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = os.path.abspath(out or f"blackbox-slurm-{job_id}-{stamp}")
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise BlackboxError(f"Cannot create `{out_dir}`: {exc.strerror}.", exit_code=EXIT_CANT_CREATE) from None

    def say(message: str) -> None:
        click.echo(f"blackbox: {message}", err=True)

    options = ["--dump-timeout", str(dump_timeout), "--budget", str(budget)] + (["--native"] if native else []) + (
        ["--locals"] if with_locals else [])  # fmt: skip
    say(f"collecting every node of Slurm job {job_id} (srun --overlap; {budget:g} s a node) into {out_dir}")
    fan = fan_out(job_id, out_dir, budget, options, os.environ)
    facts = fan.facts or {}
    say(
        f"job {job_id}: {facts.get('name')} on {facts.get('node_list')} (partition {facts.get('partition')}, "
        f"time limit {facts.get('time_limit')}, requeued {facts.get('requeue_count', 0)} time(s))"
    )
    for n in fan.nodes:
        if n.result is not None:
            r = n.result
            failed = "; ".join(r.get("failed") or [])
            say(
                f"node {n.node}: {os.path.basename(str(r.get('bundle')))} (rank(s) {r.get('ranks')}, "
                f"{r.get('duration_s')} s)" + (f"; partial: {failed}" if failed else "")
            )
            for note in r.get("notes") or []:
                say(f"node {n.node}: note: {note}")
        else:
            say(f"node {n.node}: no bundle: {n.error}")
    if fan.srun_error:
        say(f"srun: {fan.srun_error}")
    here = [b for b in fan.bundles if os.path.exists(b)]
    for b in fan.bundles:
        if b not in here:
            say(f"the bundle `{b}` is not visible here: give --out a directory every node shares")
    if not here:
        raise BlackboxError(f"No node of Slurm job `{job_id}` gave a bundle.", exit_code=1)
    model = Intake(read_bundles(here), lambda m: say(f"warning: {m}")).report
    if fmt == "json":
        import io

        buf = io.StringIO()
        render_json(model, buf)
        sys.stdout.write(json.dumps({
            "job_id": job_id, "directory": out_dir, "duration_s": fan.duration_s, "slurm": facts,
            "nodes": [{"node": n.node, "bundle": (n.result or {}).get("bundle"), "error": n.error} for n in fan.nodes],
            "report": json.loads(buf.getvalue()),
        }, indent=2) + "\n")  # fmt: skip
    else:
        render_terminal(model, sys.stdout)
    say(
        f"{len(here)} of {len(fan.nodes)} node bundle(s) in {out_dir} ({fan.duration_s:g} s); "
        f"next: blackbox report {out_dir}"
    )
    return 0
