"""`blackbox run [OPTIONS] -- CMD [ARGS...]`: parse the options and hand over to the supervisor."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

import click

from ..config import RUN_OPTIONS, Option, load_run_config


def _options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One click option per config option; defaults stay None so env and file values can apply."""

    def help_of(opt: Option) -> str:
        default = "" if opt.default is None else f" [default: {opt.default}]"
        return f"{opt.help}{default} [env var: {opt.env}]"

    for opt in reversed(RUN_OPTIONS):
        fn = click.option(opt.flag, opt.name, default=None, metavar="VALUE", help=help_of(opt))(fn)
    return fn


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="A TOML file with a [run] table (see configs/default.toml). [env var: BLACKBOX_CONFIG]")  # fmt: skip
@_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(command: tuple[str, ...], config_path: Optional[str], **flags: Any) -> int:
    """Run a training job under the flight recorder.

    Put it in front of your launcher command line, unchanged:

        blackbox run -- torchrun --nproc-per-node 8 train.py

    The job's output, signals and exit code pass through. Every rank keeps a heartbeat; a stalled job
    is caught, its evidence bundled under the run directory, and (by default) the job is ended with
    exit code 86 so the scheduler can requeue it. Send SIGUSR1 to blackbox to collect evidence now.
    """
    from ..supervisor.supervisor import Supervisor

    cfg = load_run_config(flags, os.environ, config_path)
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]

    def say(message: str) -> None:
        sys.stderr.write(f"blackbox: {message}\n")
        sys.stderr.flush()

    return Supervisor(argv, cfg, os.environ, say).run()
