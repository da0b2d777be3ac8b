"""`blackbox incidents list|show|link`: the local incident index — what happened before, and what fixed it.
Parses, calls the index (blackbox.incidents), renders tables or JSON."""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import click

from ..errors import EXIT_CANT_CREATE, BlackboxError

FROM = click.option("--from", "source", default=None, metavar="URL",
                    help="Read the incident records under this shared-storage prefix (`blackbox run --upload`: "
                         "s3://, gs://, az:// or a directory) instead of the local index.")  # fmt: skip
FORMAT = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                      help="`table` for people, `json` for scripts.")  # fmt: skip


def _open() -> Any:
    from ..incidents.store import IncidentIndex, IndexUnavailable, default_path

    path = default_path(os.environ)
    try:
        return IncidentIndex(path)
    except IndexUnavailable as exc:
        raise BlackboxError(f"{str(exc)[0].upper()}{str(exc)[1:]}.", exit_code=EXIT_CANT_CREATE,
                            hint="BLACKBOX_HOME chooses where the index lives.") from None  # fmt: skip


def _since(text: Optional[str]) -> Optional[str]:
    """`7d`, `12h`, `30m` ago, or an ISO date/time: the UTC ISO 8601 lower bound."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([dhm])\s*", text)
    if m:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
        return (datetime.now(timezone.utc) - timedelta(**{unit: int(m.group(1))})).isoformat(timespec="seconds")
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BlackboxError(f"`--since {text}` is neither a duration (7d, 12h, 30m) nor a date (2026-11-29).") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _printable(text: str) -> str:
    """What came from bundles (untrusted) reaches the terminal without its control characters (escape
    sequences that would move the cursor or retitle the window)."""
    return "".join(c if c in "\n\t" or (ord(c) >= 32 and ord(c) != 127) else "?" for c in text)


def _number(ident: str) -> int:
    if not ident.strip().isdigit():
        raise BlackboxError(f"`{ident}` is not an incident number of the local index.",
                            hint="Incidents in shared storage are named with --from URL.")  # fmt: skip
    return int(ident)


def _list_shared(source: str, category: Optional[str], since: Optional[str], limit: int, fmt: str) -> int:
    from ..storage.remote import Store, records
    from ..storage.urls import display

    store = Store(source)
    rows = records(store)
    if category:
        rows = [r for r in rows if r.get("category") == category or str(r.get("category") or "").startswith(
            category.rstrip(".") + ".")]  # fmt: skip
    if since:
        rows = [r for r in rows if str(r.get("time") or "") >= since]
    rows = rows[: max(0, limit)] if limit else rows
    if fmt == "json":
        json.dump({"from": display(store.url), "incidents": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not rows:
        click.echo(f"no incidents under {display(store.url)}" + (" that match" if category or since else ""))
        return 0
    cells = [(r.get("id"), r.get("time"), r.get("category"), r.get("phase"),
              ",".join(map(str, r.get("suspects") or [])), r.get("host"), r.get("top_frame"), _fixed(r.get("fix")))
             for r in rows]  # fmt: skip
    _table(f"incidents ({display(store.url)})",
           ("id", "when (UTC)", "category", "phase", "suspects", "host", "where", "fix"), cells)  # fmt: skip
    return 0


def _show_shared(source: str, ident: str, fmt: str) -> int:
    from ..storage.remote import Store, find_record

    _, row = find_record(Store(source), ident)
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
        f"  top frame: {row.get('top_frame') or '-'}",
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
    from ..storage.remote import Store, find_record, link_fix

    store = Store(source)
    path, row = find_record(store, ident)
    status = status or ("fixed" if fix_commit else "hypothesis")
    url = link_fix(store, path, {"status": status, "fix_commit": fix_commit, "note": note,
                                 "by": os.environ.get("USER") or None})  # fmt: skip
    if fmt == "json":
        json.dump({"incident": row["id"], "fix": url, "status": status}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    click.echo(f"incident {row['id']}: fix recorded as {status}" + (f" (commit {fix_commit})" if fix_commit else "")
               + f" at {url}")  # fmt: skip
    return 0


def _incident(index: Any, number: int) -> dict[str, Any]:
    found: Optional[dict[str, Any]] = index.get(number)
    if found is None:
        raise BlackboxError(f"There is no incident #{number} in the index `{index.path}`.",
                            hint="`blackbox incidents list` shows the incidents it holds.")  # fmt: skip
    return found


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
    if source is not None:
        return _list_shared(source, category, _since(since), limit, fmt)
    index = _open()
    rows = index.incidents(category=category, since=_since(since), limit=limit)
    for row in rows:
        row["fix"] = index.fix(int(row["id"]))
    if fmt == "json":
        keep = ("id", "created", "run_id", "node", "incident_id", "category", "phase", "suspects", "top_frame",
                "exception_type", "message", "fingerprint", "bundle", "bundle_url", "fix")  # fmt: skip
        json.dump({"index": index.path, "incidents": [{k: r.get(k) for k in keep} for r in rows]}, sys.stdout,
                  indent=2)  # fmt: skip
        sys.stdout.write("\n")
        return 0
    if not rows:
        click.echo(f"no incidents in {index.path}" + (" that match" if category or since else ""))
        return 0
    cells = [(r["id"], r.get("created"), r.get("category"), r.get("phase"), ",".join(map(str, r.get("suspects") or [])),
              r.get("top_frame"), _fixed(r["fix"])) for r in rows]  # fmt: skip
    _table(f"incidents ({index.path})", ("#", "when (UTC)", "category", "phase", "suspects", "where", "fix"), cells)
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
    if source is not None:
        return _show_shared(source, ident, fmt)
    number = _number(ident)
    index = _open()
    row = _incident(index, number)
    row["links"] = index.links(number)
    similar = index.similar(row["fingerprint"], row["category"], row["top_frame"], {row["sha256"]})
    row["same_fingerprint"] = [s["id"] for s in similar if s["match"] == "same"]
    if fmt == "json":
        json.dump(row, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
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
        f"  top frame: {row.get('top_frame') or '-'}",
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
    click.echo(_printable("\n".join(lines)))
    return 0


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
    from ..incidents.indexing import CONFIG_CAP, rerun_outcome
    from ..redact import redact_config, redact_text

    if not (fix_commit or fix_config or rerun or note or status):
        raise BlackboxError("Nothing to link: give --fix-commit, --fix-config, --rerun, --status or --note.")
    if source is not None:
        if fix_config or rerun:
            raise BlackboxError("--fix-config and --rerun are for the local index: with --from, give --fix-commit, "
                                "--status and --note.")  # fmt: skip
        return _link_shared(source, ident, fix_commit, status, redact_text(note) if note else None, fmt)
    number = _number(ident)
    index = _open()
    incident = _incident(index, number)
    fields: dict[str, Any] = {"fix_commit": fix_commit, "note": redact_text(note) if note else None}
    if fix_config is not None:
        try:
            with open(fix_config, "rb") as f:
                text = redact_config(f.read(CONFIG_CAP).decode("utf-8", "replace"))
        except OSError as exc:
            raise BlackboxError(f"Cannot read the config file `{fix_config}`: {exc.strerror}.") from None
        fields.update(fix_config_name=fix_config, fix_config=text)
        if incident.get("config") is not None:
            diff = difflib.unified_diff(str(incident["config"]).splitlines(), text.splitlines(),
                                        f"incident #{number}: {incident.get('config_name')}", f"fix: {fix_config}",
                                        lineterm="")  # fmt: skip
            fields["config_diff"] = "\n".join(diff) or "(no difference)"
    verdict = None
    if rerun is not None:
        if not os.path.exists(rerun):
            raise BlackboxError(f"The rerun `{rerun}` does not exist.", hint="Give its run directory or a bundle.")
        outcome, verdict, rerun_incident = rerun_outcome(rerun, incident, index)
        fields.update(rerun=os.path.abspath(rerun), rerun_outcome=outcome, rerun_incident=rerun_incident)
    if status is None:
        status = {"clean": "verified", "same": "hypothesis"}.get(verdict or "", "fixed" if fix_commit or fix_config
                                                                       else "hypothesis")  # fmt: skip
    fields["status"] = status
    link_id = index.link(number, fields)
    saved = index.links(number)[-1]
    if fmt == "json":
        json.dump({"incident": number, "link": saved}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    click.echo(f"incident #{number}: fix #{link_id} recorded as {status}"
               + (f" (commit {fix_commit})" if fix_commit else "")
               + (f"; rerun: {saved['rerun_outcome']}" if rerun else ""))  # fmt: skip
    if verdict == "same" and status == "verified":
        click.echo("blackbox: warning: the rerun failed the same way, yet the fix is marked verified", err=True)
    if fix_config is not None and incident.get("config") is None:
        click.echo(f"the incident's bundle held no config file: {fix_config} is stored without a diff")
    elif saved.get("config_diff"):
        click.echo(_printable(saved["config_diff"]))
    return 0
