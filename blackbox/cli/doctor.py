"""`blackbox doctor`: run the checks (blackbox.doctor) and render them as a table or JSON."""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from ..config import RUNS_DIR
from ..errors import BlackboxError


@click.command()
@click.option(
    "--run-dir",
    default=RUNS_DIR,
    show_default=True,
    metavar="DIR",
    help="Where `blackbox run` will write (checked for write access and free space).",
)
@click.option(
    "--python",
    "python",
    default=None,
    metavar="PATH",
    help="The job's interpreter, for the torch and recorder checks [default: `python` on PATH].",
)
@click.option(
    "--require",
    "required",
    multiple=True,
    metavar="CHECK",
    help="Also fail (exit 1) when CHECK is not ok: py-spy, torch, gpu, kernel-messages. The recorder, "
    "run-dir and signals checks are always required.",
)
@click.option("--format", "fmt", type=click.Choice(["terminal", "json"]), default="terminal", show_default=True)
def doctor(run_dir: str, python: Optional[str], required: tuple[str, ...], fmt: str) -> int:
    """Say what this machine will let blackbox capture, with a fix for each thing that fails.

    Each check is tried for real: py-spy attaches to a child, the recorder activates in a sample rank, the
    job's torch is asked what debugging features it has, SIGUSR1 handlers are seen from /proc, the GPUs and
    the kernel log are read. Exit code 1 when a required check fails.

        blackbox doctor --python /opt/conda/envs/train/bin/python --require py-spy
    """
    from ..doctor import CHECKS, ESSENTIAL, job_python, run_checks

    unknown = sorted(set(required) - set(CHECKS))
    if unknown:
        raise BlackboxError(f"Unknown check(s) {', '.join(f'`{u}`' for u in unknown)} for --require.",
                            hint="Checks: " + ", ".join(CHECKS) + ".")  # fmt: skip
    checks = run_checks(run_dir, python or job_python())
    must = set(ESSENTIAL) | set(required)
    failed = [c for c in checks if c.name in must and c.status != "ok" and not (c.status == "warn" and
                                                                                 c.name in ESSENTIAL)]  # fmt: skip
    if fmt == "json":
        sys.stdout.write(json.dumps({"checks": [c.__dict__ for c in checks], "required": sorted(must),
                                     "ok": not failed}, indent=2) + "\n")  # fmt: skip
        return 1 if failed else 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title="blackbox doctor")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col)
    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    for c in checks:
        req = " (required)" if c.name in must else ""
        table.add_row(c.name + req, f"[{style[c.status]}]{c.status}[/]", escape(c.detail), escape(c.fix or ""))
    console.print(table)
    if failed:
        console.print(f"[bold red]cannot work here:[/] {', '.join(c.name for c in failed)}")
    return 1 if failed else 0
