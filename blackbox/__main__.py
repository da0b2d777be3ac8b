"""`python -m blackbox` is the `blackbox` command."""

from .cli.main import entry

entry()
