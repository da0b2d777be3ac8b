"""`blackbox status [RUN_DIR]` and `blackbox top [RUN_DIR]`: a run as it stands, once or live. Parses, calls the
status core (blackbox.status), renders (blackbox.render.status). Reads the run directory read-only."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from typing import Optional

import click

RUN_DIR = click.argument("run_dir", required=False, metavar="[RUN_DIR]")


@click.command()
@RUN_DIR
@click.option("--format", "fmt", type=click.Choice(["terminal", "json"]), default="terminal", show_default=True,
              help="`json`: the status as JSON on stdout (docs/status.md has the schema).")  # fmt: skip
def status(run_dir: Optional[str], fmt: str) -> int:
    """Show a run as it stands: each rank's step, steps/s, phase, idle time, where its time goes; the GPUs;
    stragglers and incidents so far.

    RUN_DIR is a `blackbox run` run directory; without it, the newest live run under ./blackbox-runs. Nothing
    is written and no process is signalled: any terminal on the node may look.

        blackbox status blackbox-runs/20261201-120000-ab12cd --format json
    """
    from ..render.status import render_status, render_status_json
    from ..status import find_run, open_table, read_status

    path = find_run(run_dir)
    table = open_table(path)
    try:
        model = read_status(path, table)
    finally:
        table.close()
    (render_status_json if fmt == "json" else render_status)(model, sys.stdout)
    return 0


@contextlib.contextmanager
def _keys() -> Iterator[Optional[int]]:
    """stdin in cbreak mode while top runs (a key is read at once, not after Enter), when it is a terminal."""
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    old = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)
        yield fd
    finally:
        if fd is not None and old is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)


@click.command()
@RUN_DIR
@click.option("--interval", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="Seconds between two refreshes.")  # fmt: skip
def top(run_dir: Optional[str], interval: float) -> int:
    """Show a run live, refreshed every second: `blackbox status`, as it changes. `q` or Ctrl-C quits.

    blackbox top
    """
    from rich.console import Console
    from rich.live import Live

    from ..render.status import renderable
    from ..status import find_run, open_table, read_status
    from ..supervisor.gpuwatch import GpuWatch

    path = find_run(run_dir)
    table = open_table(path)
    gpus = GpuWatch()  # NVML every refresh, nvidia-smi (a process each) every 10 s
    console = Console(highlight=False, markup=False, emoji=False)
    model = None
    try:
        with _keys() as fd, Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                gpus.sample(time.monotonic())
                model = read_status(path, table, model, gpus.latest())
                live.update(renderable(model, "blackbox top (q quits)"), refresh=True)
                deadline = time.monotonic() + max(0.1, interval)
                while (left := deadline - time.monotonic()) > 0:
                    if fd is None:
                        time.sleep(left)
                    elif select.select([fd], [], [], left)[0] and os.read(fd, 32).lower().startswith(b"q"):
                        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        table.close()
