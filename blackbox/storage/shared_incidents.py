"""The incident commands over shared storage (`blackbox incidents … --from URL`): which records a listing shows, one
record by its id, a fix linked to one. Never prints; imports the stdlib and this package (remote, urls)."""

from __future__ import annotations

import os
from typing import Any, Optional

from .remote import Store, find_record, link_fix, records
from .urls import display


def listed(source: str, category: Optional[str], after: Optional[str], limit: int) -> tuple[str, list[dict[str, Any]]]:
    """(the prefix as it may be shown, its incident records newest first): `category` matches itself and what is
    under it (`hang` matches hang.io), `after` an ISO time, `limit` 0 for all."""
    store = Store(source)
    rows = records(store)
    if category:
        under = category.rstrip(".") + "."
        rows = [r for r in rows if r.get("category") == category or str(r.get("category") or "").startswith(under)]
    if after:
        rows = [r for r in rows if str(r.get("time") or "") >= after]
    return display(store.url), rows[: max(0, limit)] if limit else rows


def shown(source: str, ident: str) -> dict[str, Any]:
    """The record whose id starts with `ident` (a BlackboxError when none does, or several)."""
    return find_record(Store(source), ident)[1]


def linked(source: str, ident: str, fix_commit: Optional[str], status: Optional[str],
           note: Optional[str]) -> tuple[dict[str, Any], str, str]:  # fmt: skip
    """Link a fix to the record whose id starts with `ident`: (the record, the fix's URL, its status — `fixed` with
    a commit, else `hypothesis`, unless given)."""
    store = Store(source)
    path, row = find_record(store, ident)
    status = status or ("fixed" if fix_commit else "hypothesis")
    url = link_fix(store, path, {"status": status, "fix_commit": fix_commit, "note": note,
                                 "by": os.environ.get("USER") or None})  # fmt: skip
    return row, url, status
