"""The command group imports a command only when it runs, and its `--help` lists every command as click would."""

from __future__ import annotations

import subprocess
import sys

import click

from blackbox.cli.main import COMMANDS, cli


def test_help_lists_every_command_with_its_own_short_help() -> None:
    ctx = click.Context(cli)
    for name, (_, _, short) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(200) == click.Command(name, help=short).get_short_help_str(200), name


def test_report_imports_no_other_command() -> None:
    code = ("import sys; from blackbox.cli.main import main; main(['report', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('blackbox.')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    for other in ("blackbox.cli.collect", "blackbox.cli.run", "blackbox.cli.incidents", "blackbox.cli.status",
                  "blackbox.cli.doctor", "blackbox.supervisor", "blackbox.collect"):  # fmt: skip
        assert f"'{other}" not in loaded, other
    assert "'blackbox.cli.report'" in loaded
