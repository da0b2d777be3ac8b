"""The `blackbox` entry point: the command group and the one place where BlackboxError is caught.
Imports click, rich lazily, and the core."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Optional

import click

from .. import __version__
from ..errors import EXIT_INTERNAL, EXIT_USAGE, BlackboxError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="blackbox")
def cli() -> None:
    """A flight recorder for PyTorch distributed training.

    Put `blackbox run --` in front of your launcher command; when the job stalls or dies, every rank's
    evidence lands in one bundle.
    """


def _register() -> None:
    from .collect import collect
    from .doctor import doctor
    from .incidents import incidents
    from .report import report
    from .run import run
    from .status import status, top

    cli.add_command(run)
    cli.add_command(collect)
    cli.add_command(report)
    cli.add_command(doctor)
    cli.add_command(incidents)
    cli.add_command(status)
    cli.add_command(top)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; returns the exit code. Errors are one sentence (a traceback only with BLACKBOX_DEBUG=1)."""
    _register()
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
