"""The local incident commands' core (`blackbox incidents list|show|link`): the index opened, an incident found, a
fix linked with its config diff and rerun outcome. Never prints; the CLI renders. Imports the stdlib, the errors,
the redaction and the index."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from ..errors import EXIT_CANT_CREATE, BlackboxError
from .fingerprint import names_a_cause
from .store import IncidentIndex, IndexUnavailable, default_path


def open_index() -> IncidentIndex:
    path = default_path(os.environ)
    try:
        return IncidentIndex(path)
    except IndexUnavailable as exc:
        raise BlackboxError(f"{str(exc)[0].upper()}{str(exc)[1:]}.", exit_code=EXIT_CANT_CREATE,
                            hint="BLACKBOX_HOME chooses where the index lives.") from None  # fmt: skip


def since(text: Optional[str]) -> Optional[str]:
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


def number(ident: str) -> int:
    if not ident.strip().isdigit():
        raise BlackboxError(f"`{ident}` is not an incident number of the local index.",
                            hint="Incidents in shared storage are named with --from URL.")  # fmt: skip
    return int(ident)


def incident(index: IncidentIndex, num: int) -> dict[str, Any]:
    found: Optional[dict[str, Any]] = index.get(num)
    if found is None:
        raise BlackboxError(f"There is no incident #{num} in the index `{index.path}`.",
                            hint="`blackbox incidents list` shows the incidents it holds.")  # fmt: skip
    return found


def listed(category: Optional[str], after: Optional[str], limit: int) -> tuple[str, list[dict[str, Any]]]:
    """(the index's path, its incidents newest first, each with its fix)."""
    index = open_index()
    rows = index.incidents(category=category, since=after, limit=limit)
    for row in rows:
        row["fix"] = index.fix(int(row["id"]))
    return index.path, rows


def shown(num: int) -> dict[str, Any]:
    """One incident in full: its links, and the other incidents with its fingerprint (`same_fingerprint`)."""
    index = open_index()
    row = incident(index, num)
    row["links"] = index.links(num)
    similar = index.similar(row["fingerprint"], row["category"], row["top_frame"], {row["sha256"]},
                            top_path=row.get("top_path")) if names_a_cause(
        row["top_frame"], row.get("exception_type"), row.get("message")) else []  # fmt: skip
    row["same_fingerprint"] = [s["id"] for s in similar if s["match"] == "same"]
    return row


@dataclass
class Linked:
    number: int
    link_id: int
    status: str
    saved: dict[str, Any]  # the link as stored
    verdict: Optional[str]  # the rerun's: clean, same, other (None without --rerun)
    incident: dict[str, Any]


def _config_fields(fix_config: str, found: dict[str, Any], num: int) -> dict[str, Any]:
    """The fix's config file, redacted, and its diff against the incident's."""
    from ..redact import redact_config
    from .indexing import CONFIG_CAP

    try:
        with open(fix_config, "rb") as f:
            text = redact_config(f.read(CONFIG_CAP).decode("utf-8", "replace"))
    except OSError as exc:
        raise BlackboxError(f"Cannot read the config file `{fix_config}`: {exc.strerror}.") from None
    fields: dict[str, Any] = {"fix_config_name": fix_config, "fix_config": text}
    if found.get("config") is not None:
        diff = difflib.unified_diff(str(found["config"]).splitlines(), text.splitlines(),
                                    f"incident #{num}: {found.get('config_name')}", f"fix: {fix_config}",
                                    lineterm="")  # fmt: skip
        fields["config_diff"] = "\n".join(diff) or "(no difference)"
    return fields


def link_local(num: int, fix_commit: Optional[str], fix_config: Optional[str], rerun: Optional[str],
               status: Optional[str], note: Optional[str]) -> Linked:  # fmt: skip
    """Record what fixed incident `num` (note redacted) and whether a rerun confirmed it."""
    from ..redact import redact_text
    from .indexing import rerun_outcome

    index = open_index()
    found = incident(index, num)
    fields: dict[str, Any] = {"fix_commit": fix_commit, "note": redact_text(note) if note else None}
    if fix_config is not None:
        fields.update(_config_fields(fix_config, found, num))
    verdict = None
    if rerun is not None:
        if not os.path.exists(rerun):
            raise BlackboxError(f"The rerun `{rerun}` does not exist.", hint="Give its run directory or a bundle.")
        outcome, verdict, rerun_incident = rerun_outcome(rerun, found, index)
        fields.update(rerun=os.path.abspath(rerun), rerun_outcome=outcome, rerun_incident=rerun_incident)
    if status is None:
        status = {"clean": "verified", "same": "hypothesis"}.get(verdict or "", "fixed" if fix_commit or fix_config
                                                                       else "hypothesis")  # fmt: skip
    fields["status"] = status
    link_id = index.link(num, fields)
    return Linked(num, link_id, status, index.links(num)[-1], verdict, found)
