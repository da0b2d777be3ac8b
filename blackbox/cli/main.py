"""The `blackbox` entry point: the command group and the one place where BlackboxError is caught.
Imports click, rich lazily, and the core."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Optional

import click

from .. import __version__
from ..errors import EXIT_INTERNAL, EXIT_USAGE, BlackboxError

# name -> (module under blackbox.cli, attribute, short help): `--help` lists every command from this table, and
# only the command that runs is imported (a `blackbox report` does not load the supervisor or the collector).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run", "Run a training job under the flight recorder."),
    "collect": (
        "collect",
        "collect",
        "Collect the evidence of a running (hung) job into one bundle; the job keeps running.",
    ),
    "report": (
        "report",
        "report",
        "Say what happened in a bundle: category, suspect ranks, phase, evidence, next steps.",
    ),
    "doctor": (
        "doctor",
        "doctor",
        "Say what this machine will let blackbox capture, with a fix for each thing that fails.",
    ),
    "incidents": (
        "incidents",
        "incidents",
        "The local incident index: every bundle blackbox wrote or reported, and the fixes linked to them.",
    ),
    "status": (
        "status",
        "status",
        "Show a run as it stands: each rank's step, steps/s, phase, idle time, where its "
        "time goes; the GPUs; stragglers and incidents so far.",
    ),
    "top": ("status", "top", "Show a run live, refreshed every second: `blackbox status`, as it changes."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when they are asked for, listed from COMMANDS without importing."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(f"{__package__}.{entry[0]}")
        command = getattr(module, entry[1])
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists them (each help cut to the width left), from COMMANDS: nothing imported."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit)) for name in sorted(COMMANDS)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="blackbox")
def cli() -> None:
    """A flight recorder for PyTorch distributed training.

    Put `blackbox run --` in front of your launcher command; when the job stalls or dies, every rank's
    evidence lands in one bundle.
    """


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; returns the exit code. Errors are one sentence (a traceback only with BLACKBOX_DEBUG=1)."""
    debug = os.environ.get("BLACKBOX_DEBUG") == "1"
    try:
        result = cli.main(args=argv, prog_name="blackbox", standalone_mode=False)
    except BlackboxError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"blackbox: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"blackbox: hint: {exc.hint}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("blackbox: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code else EXIT_USAGE
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        click.echo(
            f"blackbox: internal error: {exc!r} (this is a bug in blackbox; "
            "run again with BLACKBOX_DEBUG=1 for the traceback)",
            err=True,
        )
        return EXIT_INTERNAL
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())
