"""`blackbox incidents list|show|link`: the local incident index — what happened before, and what fixed it.
Parses, calls the index (blackbox.incidents), renders tables or JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import click

from ..errors import BlackboxError

FROM = click.option("--from", "source", default=None, metavar="URL",
                    help="Read the incident records under this shared-storage prefix (`blackbox run --upload`: "
                         "s3://, gs://, az:// or a directory) instead of the local index.")  # fmt: skip
FORMAT = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                      help="`table` for people, `json` for scripts.")  # fmt: skip


def _printable(text: str) -> str:
    """What came from bundles (untrusted) reaches the terminal without its control characters (escape
    sequences that would move the cursor or retitle the window)."""
    return "".join(c if c in "\n\t" or (ord(c) >= 32 and ord(c) != 127) else "?" for c in text)


def _list_shared(source: str, category: Optional[str], since: Optional[str], limit: int, fmt: str) -> int:
    from ..storage.shared_incidents import listed

    where, rows = listed(source, category, since, limit)
    if fmt == "json":
        json.dump({"from": where, "incidents": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        click.echo(f"no incidents under {where}" + (" that match" if category or since else ""))
        return 0
    cells = [(r.get("id"), r.get("time"), r.get("category"), r.get("phase"),
              ",".join(map(str, r.get("suspects") or [])), r.get("host"), r.get("top_frame"), _fixed(r.get("fix")))
             for r in rows]  # fmt: skip
    _table(f"incidents ({where})", ("id", "when (UTC)", "category", "phase", "suspects", "host", "where", "fix"), cells)
    return 0


def _show_shared(source: str, ident: str, fmt: str) -> int:
    from ..storage.shared_incidents import shown

    row = shown(source, ident)
    if fmt == "json":
        json.dump(row, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    fix = row.get("fix")
    lines = [
        f"incident {row['id']}: {row.get('category')} (phase {row.get('phase') or '?'}), suspect rank(s) "
        f"{', '.join(map(str, row.get('suspects') or [])) or 'none named'}",
        f"  {row.get('summary') or ''}",
        f"  when: {row.get('time')}   run: {row.get('run')}   node: {row.get('node')}   host: {row.get('host')}   "
        f"trigger: {row.get('trigger')}",
        f"  bundle: {row.get('bundle')}",
        f"  record: {row.get('record')}",
        f"  exception: {row.get('exception_type') or '-'}: {row.get('message') or '-'}",
        f"  top frame: {row.get('top_frame') or '-'}" + (f" in {row['top_path']}" if row.get("top_path") else ""),
        f"  fingerprint: {row.get('fingerprint')}",
    ]  # fmt: skip
    if isinstance(fix, dict):
        lines.append(f"  fix ({fix.get('created')}): {fix.get('status')}"
                     + (f", commit {fix['fix_commit']}" if fix.get("fix_commit") else "")
                     + (f" — {fix['note']}" if fix.get("note") else ""))  # fmt: skip
    else:
        lines.append(f"  no fix linked yet: blackbox incidents link {row['id']} --from URL --fix-commit SHA")
    lines.append(f"  report: blackbox report {row.get('bundle')}")
    click.echo(_printable("\n".join(lines)))
    return 0


def _link_shared(source: str, ident: str, fix_commit: Optional[str], status: Optional[str], note: Optional[str],
                 fmt: str) -> int:  # fmt: skip
    from ..storage.shared_incidents import linked

    row, url, status = linked(source, ident, fix_commit, status, note)
    if fmt == "json":
        json.dump({"incident": row["id"], "fix": url, "status": status}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    click.echo(f"incident {row['id']}: fix recorded as {status}" + (f" (commit {fix_commit})" if fix_commit else "")
               + f" at {url}")  # fmt: skip
    return 0


@click.group()
def incidents() -> None:
    """The local incident index: every bundle blackbox wrote or reported, and the fixes linked to them.

    The index is $BLACKBOX_HOME/incidents.sqlite (default ~/.local/share/blackbox/).
    """


@incidents.command("list")
@click.option("--category", default=None, metavar="CATEGORY", help="Only this category (`hang` matches hang.*).")
@click.option("--since", default=None, metavar="WHEN", help="Only bundles made since: 7d, 12h, 30m or a date.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many, newest first.")
@FROM
@FORMAT
def list_(category: Optional[str], since: Optional[str], limit: int, source: Optional[str], fmt: str) -> int:
    """List the incidents, newest first."""
    from ..incidents import commands as core

    if source is not None:
        return _list_shared(source, category, core.since(since), limit, fmt)
    path, rows = core.listed(category, core.since(since), limit)
    if fmt == "json":
        keep = ("id", "created", "run_id", "node", "incident_id", "category", "phase", "suspects", "top_frame",
                "exception_type", "message", "fingerprint", "bundle", "bundle_url", "fix")  # fmt: skip
        json.dump({"index": path, "incidents": [{k: r.get(k) for k in keep} for r in rows]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        click.echo(f"no incidents in {path}" + (" that match" if category or since else ""))
        return 0
    cells = [(r["id"], r.get("created"), r.get("category"), r.get("phase"), ",".join(map(str, r.get("suspects") or [])),
              r.get("top_frame"), _fixed(r["fix"])) for r in rows]  # fmt: skip
    _table(f"incidents ({path})", ("#", "when (UTC)", "category", "phase", "suspects", "where", "fix"), cells)
    return 0


def _fixed(fix: Optional[dict[str, Any]]) -> str:
    return "" if not fix else f"{fix['status']} {str(fix.get('fix_commit') or '')[:10]}".strip()


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Rows of incidents as a table; the second cell is a time. Bundle text is never read as rich markup. Piped or
    redirected (stdout not a terminal): one row a line, at full width, so that no id is ever cut in two."""
    texts = [[_printable(str(c if c is not None else "")).replace("\n", " ") for c in
              (row[0], str(row[1] or "")[:19].replace("T", " "), *row[2:])] for row in rows]  # fmt: skip
    if not sys.stdout.isatty():
        widths = [max(len(c) for c in col) for col in zip(columns, *texts)]
        click.echo(title)
        for line in (columns, *texts):
            click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for cells in texts:
        table.add_row(*(Text(c) for c in cells))
    Console(soft_wrap=False).print(table)


@incidents.command()
@click.argument("ident", metavar="ID")
@FROM
@FORMAT
def show(ident: str, source: Optional[str], fmt: str) -> int:
    """One incident in full, with every fix linked to it."""
    from ..incidents import commands as core

    if source is not None:
        return _show_shared(source, ident, fmt)
    number = core.number(ident)
    row = core.shown(number)
    if fmt == "json":
        json.dump(row, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    click.echo(_printable("\n".join(_shown_lines(row, number))))
    return 0


def _shown_lines(row: dict[str, Any], number: int) -> list[str]:
    lines = [
        f"incident #{row['id']}: {row.get('category')} (phase {row.get('phase') or '?'}), suspect rank(s) "
        f"{', '.join(map(str, row.get('suspects') or [])) or 'none named'}",
        f"  {row.get('summary') or ''}",
        f"  when: {row.get('created')}   run: {row.get('run_id')}   node: {row.get('node')}   trigger: "
        f"{row.get('trigger')}" + (f"   incident: {row['incident_id']}" if row.get("incident_id") else ""),
        f"  bundle: {row.get('bundle')}" + (f"   shared: {row['bundle_url']}" if row.get("bundle_url") else ""),
        f"  command: {' '.join(row.get('command') or []) or '?'}",
        f"  git commit: {row.get('git_commit') or 'unknown'}",
        f"  exception: {row.get('exception_type') or '-'}: {row.get('message') or '-'}",
        f"  top frame: {row.get('top_frame') or '-'}" + (f" in {row['top_path']}" if row.get("top_path") else ""),
        f"  fingerprint: {row.get('fingerprint')}"
        + (f" (also #{', #'.join(map(str, row['same_fingerprint']))})" if row["same_fingerprint"] else ""),
        f"  config: {row.get('config_name') or 'none in the bundle'}",
    ]  # fmt: skip
    for link in row["links"]:
        lines.append(f"  fix #{link['id']} ({link['created']}): {link['status']}"
                     + (f", commit {link['fix_commit']}" if link.get("fix_commit") else "")
                     + (f", config {link['fix_config_name']}" if link.get("fix_config_name") else "")
                     + (f"; rerun {link['rerun']}: {link['rerun_outcome']}" if link.get("rerun") else "")
                     + (f" — {link['note']}" if link.get("note") else ""))  # fmt: skip
        if link.get("config_diff"):
            lines += ["    " + d for d in str(link["config_diff"]).splitlines()]
    if not row["links"]:
        lines.append(f"  no fix linked yet: blackbox incidents link {number} --fix-commit SHA [--rerun RUN_DIR]")
    return lines


@incidents.command()
@click.argument("ident", metavar="ID")
@click.option("--fix-commit", default=None, metavar="SHA", help="The commit that fixes it.")
@click.option(
    "--fix-config",
    default=None,
    metavar="FILE",
    help="The config file of the fixed run: stored redacted, with a diff against the incident's config.",
)
@click.option(
    "--rerun",
    default=None,
    metavar="BUNDLE_OR_RUN_DIR",
    help="The rerun: a run directory (a clean exit verifies the fix) or a bundle (it failed again).",
)
@click.option("--status", type=click.Choice(["hypothesis", "fixed", "verified"]), default=None,
              help="Default: `verified` after a clean rerun, `hypothesis` when the rerun failed the same way, "
                   "else `fixed`.")  # fmt: skip
@click.option("--note", default=None, metavar="TEXT", help="Anything the next person should know (redacted).")
@FROM
@FORMAT
def link(ident: str, fix_commit: Optional[str], fix_config: Optional[str], rerun: Optional[str],
         status: Optional[str], note: Optional[str], source: Optional[str], fmt: str) -> int:  # fmt: skip
    """Record what fixed incident ID, and whether a rerun confirmed it.

    blackbox incidents link 12 --fix-commit 3f2a9c1 --fix-config train.yaml --rerun blackbox-runs/RUN

    With --from URL, ID is an incident under that prefix and the fix is written beside its record, for everyone
    whose `blackbox run --upload URL` meets the same failure (--fix-commit, --status and --note only).
    """
    from ..incidents import commands as core
    from ..redact import redact_text

    if not (fix_commit or fix_config or rerun or note or status):
        raise BlackboxError("Nothing to link: give --fix-commit, --fix-config, --rerun, --status or --note.")
    if source is not None:
        if fix_config or rerun:
            raise BlackboxError("--fix-config and --rerun are for the local index: with --from, give --fix-commit, "
                                "--status and --note.")  # fmt: skip
        return _link_shared(source, ident, fix_commit, status, redact_text(note) if note else None, fmt)
    done = core.link_local(core.number(ident), fix_commit, fix_config, rerun, status, note)
    if fmt == "json":
        json.dump({"incident": done.number, "link": done.saved}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    click.echo(f"incident #{done.number}: fix #{done.link_id} recorded as {done.status}"
               + (f" (commit {fix_commit})" if fix_commit else "")
               + (f"; rerun: {done.saved['rerun_outcome']}" if rerun else ""))  # fmt: skip
    if done.verdict == "same" and done.status == "verified":
        click.echo("blackbox: warning: the rerun failed the same way, yet the fix is marked verified", err=True)
    if fix_config is not None and done.incident.get("config") is None:
        click.echo(f"the incident's bundle held no config file: {fix_config} is stored without a diff")
    elif done.saved.get("config_diff"):
        click.echo(_printable(done.saved["config_diff"]))
    return 0
