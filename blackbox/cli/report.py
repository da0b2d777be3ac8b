"""`blackbox report PATH`: read a bundle (untrusted), analyze it, render it."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Optional, TextIO

import click

from ..errors import EXIT_CANT_CREATE, BlackboxError


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--format", "fmt", type=click.Choice(["terminal", "json", "markdown", "html"]), default="terminal",
              show_default=True, help="How to render the report: `terminal` (one screen first, details below), "
              "`json` (the versioned schema), `markdown` (for an issue tracker), `html` (one self-contained "
              "file).")  # fmt: skip
@click.option("--out", "out_path", default=None, metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option("--fr-analyzer/--no-fr-analyzer", default=True, show_default=True,
              help="Also run PyTorch's flight-recorder analyzer (when torch is importable here) on normalised copies "
                   "of the bundle's traces; blackbox reads `pg_status` itself either way.")  # fmt: skip
@click.option("--index/--no-index", "use_index", default=True, show_default=True,
              help="Show earlier incidents like this one from the local incident index "
                   "($BLACKBOX_HOME/incidents.sqlite): `seen before`.")  # fmt: skip
@click.option("--record", is_flag=True, default=False,
              help="Also add the bundle(s) to the local incident index (`blackbox run` and `collect` add their own; "
                   "a bundle from elsewhere is not added unless asked).")  # fmt: skip
def report(paths: tuple[str, ...], fmt: str, out_path: Optional[str], fr_analyzer: bool, use_index: bool,
           record: bool) -> int:  # fmt: skip
    """Say what happened in a bundle: category, suspect ranks, phase, evidence, next steps.

    PATH is a bundle (.tar.gz), an extracted bundle directory, a run directory (its newest bundle), or a
    directory holding the node bundles of one incident. Several node bundles of one job are merged into one
    view (by job id: a multi-node job's, else the run id); bundles of different jobs are refused.

    PATH may also be in shared storage (`blackbox run --upload`, docs/storage.md): a bundle's URL, a run's
    prefix (every node's bundle, merged), or the upload prefix (its newest run).

        blackbox report blackbox-runs/20261129-120000-ab12cd
        blackbox report s3://team-bucket/blackbox/20261129-120000-ab12cd
    """
    from .._recorder.protocol import FR_PREFIX
    from ..adapters import flight_recorder as fr
    from ..analyze.sources import flight_recorder_dumps
    from ..bundle.reader import expand_paths, merge_bundles, read_bundle
    from ..intake import Intake

    read = [_read_remote(p) if _remote(p) else [read_bundle(b) for b in expand_paths([p])] for p in paths]
    bundle = merge_bundles([b for bundles in read for b in bundles])
    torch_fr = None
    if fr_analyzer:
        dumps, _, _ = flight_recorder_dumps(bundle)
        if len(dumps) > 1:
            torch_fr = fr.torch_analyzer({f"{FR_PREFIX}{rank}": d for rank, d in dumps.items()})
    model = Intake(bundle, lambda m: click.echo(f"blackbox: warning: {m}", err=True), index=use_index or record,
                   record=record, torch_fr=torch_fr).report  # fmt: skip
    _write(model, _renderer(fmt), out_path)
    return 0


def _write(model: Any, render: Callable[[Any, TextIO], None], out_path: Optional[str]) -> None:
    """The rendered report to stdout, or to `out_path`."""
    if out_path is None:
        render(model, sys.stdout)
        return
    try:
        with open(out_path, "w", encoding="utf-8") as out:
            render(model, out)
    except OSError as exc:
        raise BlackboxError(
            f"Cannot write the report to `{out_path}`: {exc.strerror}.", exit_code=EXIT_CANT_CREATE
        ) from None


def _remote(path: str) -> bool:
    """A storage URL or an upload prefix on a shared filesystem (a plain bundle file needs no storage code)."""
    if os.path.isfile(path):
        return False
    from ..storage.remote import is_remote

    return is_remote(path)


def _read_remote(path: str) -> list[Any]:
    from ..storage.remote import read_remote

    return list(read_remote(path))


def _renderer(fmt: str) -> Callable[[Any, TextIO], None]:
    """The one renderer the report needs, imported alone (the terminal one loads rich)."""
    module, name = {"json": ("json_render", "render_json"), "markdown": ("markdown", "render_markdown"),
                    "html": ("html", "render_html")}.get(fmt, ("terminal", "render_terminal"))  # fmt: skip
    render: Callable[[Any, TextIO], None] = getattr(importlib.import_module(f"..render.{module}", __package__), name)
    return render
