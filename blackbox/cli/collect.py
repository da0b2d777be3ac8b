"""`blackbox collect PID` / `--slurm-job JOBID`: bundle the evidence of a running job, started with blackbox or not,
and leave it running — one node (the process tree of PID), or every node of a Slurm job (one bundle each, one merged
report). Parses, calls the core (discovery, collector, the Slurm fan-out), renders progress and the outcome."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Optional

import click

from ..errors import BlackboxError


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
@click.option("--direct", is_flag=True,
              help="Read the ranks from this process even when the job runs under `blackbox run`, whose supervisor is "
                   "otherwise asked to collect (SIGUSR1: it is the ranks' ancestor, and keeps the bundle with its "
                   "run).")  # fmt: skip
@click.option("--preemption", is_flag=True,
              help="The job is about to be ended (a Kubernetes preStop hook): its `blackbox run` collects now, as the "
                   "preemption's evidence within its --grace-budget, and passes the SIGTERM that follows on to the job "
                   "at once.")  # fmt: skip
def collect(pid: Optional[int], slurm_job: Optional[str], slurm_node: Optional[str], out: Optional[str], native: bool,
            with_locals: bool, dump_timeout: float, budget: float, fmt: str, direct: bool,
            preemption: bool) -> int:  # fmt: skip
    """Collect the evidence of a running (hung) job into one bundle; the job keeps running.

    PID may be torchrun's agent, any rank, a DataLoader worker, or a `blackbox run` supervisor: the
    process tree is walked to find every rank of the job on this node. Stacks come from py-spy (from
    outside) and /proc; ranks that run the blackbox recorder also write their own dump. Nothing is
    stopped or killed, and no process without a SIGUSR1 handler is ever signalled.

        blackbox collect $(pgrep -f torchrun | head -1)
        blackbox collect --slurm-job 123456          # every node of a Slurm job, from a login node
    """
    _refuse_mixed(pid, slurm_job, slurm_node, direct, preemption)
    if slurm_job is not None and slurm_node is None:
        return _collect_slurm_job(slurm_job, out, _options(native, with_locals, dump_timeout, budget), fmt)
    from rich.console import Console

    from ..collect import manual

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    job = manual.find_job(pid, slurm_node)
    if not direct and slurm_node is None and _via_supervisor(job, out, budget, fmt, err, preemption):
        return 0
    out_dir, out_name = manual.out_target(out, job.run_dir)
    manual.make_out_dir(out_dir)
    _said_before(job, err)
    with err.status("collecting", spinner="dots") as status:
        result = manual.collect_node(job, out_dir, out_name, _options(native, with_locals, dump_timeout, budget),
                                     lambda m: status.update(m))  # fmt: skip
    if slurm_node is not None:  # for the fan-out that started this node's collection: one line
        print(manual.node_result_line(job, result), end="", flush=True)
        return 0
    if fmt == "json":
        _outcome_json(job, result)
    _said_after(result, lambda m: err.print(f"blackbox: {m}", markup=False))
    return 0


def _refuse_mixed(pid: Optional[int], slurm_job: Optional[str], slurm_node: Optional[str], direct: bool,
                  preemption: bool) -> None:  # fmt: skip
    """One sentence for arguments that do not go together, or a job not named at all."""
    if preemption and (direct or slurm_job is not None):
        raise BlackboxError("--preemption asks the job's own `blackbox run`: not with --direct or --slurm-job.")
    if slurm_job is not None and slurm_node is None and pid is not None:
        raise BlackboxError("Give a PID or --slurm-job, not both.")
    if pid is None and slurm_node is None and slurm_job is None:
        raise BlackboxError("Give the PID of a process of the job, or --slurm-job JOBID.",
                            hint="For example: blackbox collect $(pgrep -o -f torchrun)")  # fmt: skip


def _said_before(job: Any, err: Any) -> None:
    """The job found: its ranks (which run the recorder) and what discovery could not do."""
    ranks = ", ".join(f"{r.rank} (pid {r.pid}{', recorder' if r.hb else ''})" for r in job.ranks)
    for line in [f"job {job.run_id} on {job.node}: rank(s) {ranks}", *(f"note: {n}" for n in job.notes)]:
        err.print(f"blackbox: {line}", markup=False)


def _via_supervisor(job: Any, out: Optional[str], budget: float, fmt: str, err: Any, preemption: bool) -> bool:
    """A job under `blackbox run`: its supervisor asked to collect (as a preemption's evidence with `preemption`),
    its bundle (copied to --out when given) said as a collection's is. False when there is none, or it could not be
    asked or wrote nothing in time (then this process collects, and says why)."""
    from ..collect import delegate, manual

    sup = delegate.supervisor_of(job)
    if sup is None or job.run_dir is None:
        return False

    def say(message: str) -> None:
        err.print(f"blackbox: {message}", markup=False)

    kind = delegate.PREEMPTION if preemption else delegate.MANUAL
    how = "SIGUSR1, as the preemption's evidence" if preemption else "SIGUSR1"
    say(f"job {job.run_id} runs under `blackbox run` (pid {sup.pid}): asking it to collect ({how})")
    with err.status("its supervisor collects", spinner="dots"):
        name, why = delegate.ask(job, sup, budget, kind)
    if name is None and preemption:  # the grace period is short: no second collection from here after this one
        raise BlackboxError(
            f"The job's `blackbox run` (pid {sup.pid}) was asked for the preemption's evidence and {why}.",
            hint="It collects on the SIGTERM that follows, as without the hook.",
        )
    if name is None:
        say(f"{why}: collecting from here")
        return False
    path = delegate.bundle_path(job, name)
    if out is not None:
        out_dir, out_name = manual.out_target(out, job.run_dir)
        manual.make_out_dir(out_dir)
        path = delegate.copy(job, name, os.path.join(out_dir, out_name or name))
    if fmt == "json":
        sys.stdout.write(json.dumps({"bundle": path, "run_id": job.run_id, "node": job.node, "via": "supervisor",
                                     "supervisor_pid": sup.pid, "notes": job.notes}, indent=2) + "\n")  # fmt: skip
    say(f"evidence bundle (by the job's `blackbox run`): {path}")
    say(f"next: blackbox report {path}")
    return True


def _outcome_json(job: Any, result: Any) -> None:
    sys.stdout.write(json.dumps({
        "bundle": result.path, "run_id": job.run_id, "node": job.node, "duration_s": result.duration_s,
        "ranks": [{"rank": r.rank, "pid": r.pid, "recorder": r.hb is not None} for r in job.ranks],
        "notes": job.notes, "steps": [s.__dict__ for s in result.steps],
    }, indent=2) + "\n")  # fmt: skip


def _options(native: bool, with_locals: bool, dump_timeout: float, budget: float) -> Any:
    from ..collect.collector import CollectOptions

    return CollectOptions(dump_timeout=dump_timeout, budget=budget, native=native, locals=with_locals)


def _said_after(result: Any, say: Callable[[str], None]) -> None:
    """The failed steps, the bundle, "seen before" (the new bundle, in memory, indexed), what to run next."""
    from ..analyze.model import describe_seen
    from ..bundle.reader import Bundle
    from ..intake import Intake
    from ..render import printable

    for step in result.steps:
        if step.status != "ok":
            say(f"{step.name}: {step.status}: {step.detail}")
    say(f"evidence bundle ({result.duration_s:.1f} s): {result.path}")
    try:
        seen = Intake(Bundle.of(result.written), lambda m: say(f"warning: {m}")).report.similar_incidents
    except Exception as exc:  # never fails the collection: the bundle is written
        say(f"warning: the new bundle could not be analysed for the incident index ({exc})")
        seen = []
    for entry in seen[:3]:
        say(f"seen before: {printable(describe_seen(entry))}")
    say(f"next: blackbox report {result.path}")


def _collect_slurm_job(job_id: str, out: Optional[str], options: Any, fmt: str) -> int:
    """Every node of a Slurm job: a bundle each into one directory, then the merged report."""
    from ..collect import manual

    def say(message: str) -> None:
        click.echo(f"blackbox: {message}", err=True)

    out_dir = manual.slurm_out_dir(job_id, out)
    say(f"collecting every node of Slurm job {job_id} (srun --overlap; {options.budget:g} s a node) into {out_dir}")
    got = manual.collect_slurm_job(job_id, out_dir, options, os.environ)
    _say_nodes(got, say)
    if not got.here:
        raise BlackboxError(f"No node of Slurm job `{job_id}` gave a bundle.", exit_code=1)
    _merged_report(got, fmt, say)
    say(f"{len(got.here)} of {len(got.fan.nodes)} node bundle(s) in {out_dir} ({got.fan.duration_s:g} s); "
        f"next: blackbox report {out_dir}")  # fmt: skip
    return 0


def _say_nodes(got: Any, say: Callable[[str], None]) -> None:
    facts, fan = got.fan.facts or {}, got.fan
    say(
        f"job {got.job_id}: {facts.get('name')} on {facts.get('node_list')} (partition {facts.get('partition')}, "
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
    for b in got.unseen:
        say(f"the bundle `{b}` is not visible here: give --out a directory every node shares")


def _merged_report(got: Any, fmt: str, say: Callable[[str], None]) -> None:
    from ..bundle.reader import read_bundles
    from ..intake import Intake
    from ..render.json_render import render_json
    from ..render.terminal import render_terminal

    model = Intake(read_bundles(got.here), lambda m: say(f"warning: {m}")).report
    if fmt != "json":
        render_terminal(model, sys.stdout)
        return
    import io

    buf = io.StringIO()
    render_json(model, buf)
    sys.stdout.write(json.dumps({
        "job_id": got.job_id, "directory": got.out_dir, "duration_s": got.fan.duration_s, "slurm": got.fan.facts or {},
        "nodes": [{"node": n.node, "bundle": (n.result or {}).get("bundle"), "error": n.error} for n in got.fan.nodes],
        "report": json.loads(buf.getvalue()),
    }, indent=2) + "\n")  # fmt: skip
