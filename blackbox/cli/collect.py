"""`blackbox collect PID`: bundle the evidence of a running job, started with blackbox or not, and leave it
running. Parses, calls the core (discovery and collector), renders progress and the outcome on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import click

from .._recorder import protocol as P
from ..errors import EXIT_CANT_CREATE, BlackboxError


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
@click.argument("pid", type=int)
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
def collect(pid: int, out: Optional[str], native: bool, with_locals: bool, dump_timeout: float, budget: float,
            fmt: str) -> int:  # fmt: skip
    """Collect the evidence of a running (hung) job into one bundle; the job keeps running.

    PID may be torchrun's agent, any rank, a DataLoader worker, or a `blackbox run` supervisor: the
    process tree is walked to find every rank of the job on this node. Stacks come from py-spy (from
    outside) and /proc; ranks that run the blackbox recorder also write their own dump. Nothing is
    stopped or killed, and no process without a SIGUSR1 handler is ever signalled.

        blackbox collect $(pgrep -f torchrun | head -1)
    """
    from rich.console import Console

    from ..analyze.model import describe_seen
    from ..bundle.reader import Bundle
    from ..collect.collector import CollectOptions, Collector
    from ..collect.job import discover
    from ..detections import Trigger
    from ..heartbeat_reader import HeartbeatTable
    from ..intake import Intake
    from ..redact import add_known_secrets
    from ..render import printable

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    job = discover(pid)
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
        raise BlackboxError(f"Cannot write the bundle into `{out_dir}`: {exc.strerror}.",
                            exit_code=EXIT_CANT_CREATE) from None  # fmt: skip
    finally:
        if table is not None:
            table.close()
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
