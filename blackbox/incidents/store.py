"""The incident index: one SQLite file ($BLACKBOX_HOME/incidents.sqlite) that remembers every bundle written or
reported, its fingerprint, and the fixes linked to it. WAL mode and retries on a busy database, so that several
nodes or jobs of one host can write at once; versioned schema with migrations. Never prints: a failure is an
IndexUnavailable with one sentence. Imports the stdlib only."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Optional

INDEX_NAME = "incidents.sqlite"
STATUSES = ("hypothesis", "fixed", "verified")
BUSY_RETRIES = 40  # with the connection's own 10 s busy timeout: a writer gives up after minutes, not at once

# Each entry takes the schema from version i to i + 1 (PRAGMA user_version). Append; never edit a released one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        sha256 TEXT NOT NULL UNIQUE,      -- the bundle's (a bundle indexed twice is one incident)
        bundle TEXT NOT NULL,
        run_id TEXT, job_id TEXT, incident_id TEXT, node TEXT, trigger TEXT,
        created TEXT,                     -- when the bundle was made, UTC ISO 8601
        indexed TEXT NOT NULL,
        command TEXT,                     -- JSON list, redacted
        git_commit TEXT,
        category TEXT, phase TEXT, suspects TEXT,
        exception_type TEXT, message TEXT, top_frame TEXT,
        fingerprint TEXT NOT NULL,
        summary TEXT,
        config_name TEXT, config TEXT     -- the job's config file as the bundle has it (redacted)
    );
    CREATE INDEX incidents_fingerprint ON incidents (fingerprint);
    CREATE INDEX incidents_category ON incidents (category, top_frame);
    CREATE INDEX incidents_created ON incidents (created);
    CREATE TABLE links (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        incident INTEGER NOT NULL REFERENCES incidents (id),
        created TEXT NOT NULL,
        status TEXT NOT NULL,
        fix_commit TEXT, fix_config_name TEXT, fix_config TEXT, config_diff TEXT,
        rerun TEXT, rerun_outcome TEXT, rerun_incident INTEGER,
        note TEXT
    );
    CREATE INDEX links_incident ON links (incident);
    """,
    """
    ALTER TABLE incidents ADD COLUMN bundle_url TEXT;  -- where `blackbox run --upload` copied the bundle
    """,
    """
    ALTER TABLE incidents ADD COLUMN top_path TEXT;  -- top_frame's file from the job's git work tree
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def differ(top_path: Optional[str], other: Optional[str]) -> bool:
    """Whether two incidents' top frames are in different files although their names match: another project's
    `train.py:get_batch` is not the same failure. Only where both files are known from their work trees."""
    return bool(top_path and other) and top_path != other


class IndexUnavailable(Exception):
    """The index cannot be used: `str()` is one sentence that names the file and what to do."""


def default_path(env: Mapping[str, str]) -> str:
    home = env.get("BLACKBOX_HOME")
    if not home:
        data = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        home = os.path.join(data, "blackbox")
    return os.path.join(os.path.expanduser(home), INDEX_NAME)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class IncidentIndex:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            if not os.path.exists(self.path):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise IndexUnavailable(f"the incident index `{self.path}` cannot be opened ({_why(exc)})") from None
        self.db.row_factory = sqlite3.Row
        try:
            self._retry(lambda: self.db.execute("PRAGMA journal_mode=WAL").fetchone())
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise IndexUnavailable(
                f"the incident index `{self.path}` is unreadable ({_why(exc)}): move it away and a new one starts"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()

    # --- plumbing ---------------------------------------------------------------------------------
    def _retry(self, fn: Any) -> Any:
        for attempt in range(BUSY_RETRIES):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                text = str(exc).lower()
                if ("locked" not in text and "busy" not in text) or attempt == BUSY_RETRIES - 1:
                    raise
                time.sleep(min(1.0, 0.02 * (attempt + 1)) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE) so that two writers queue, never deadlock."""
        self._retry(lambda: self.db.execute("BEGIN IMMEDIATE"))
        try:
            yield self.db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise
        self._retry(lambda: self.db.execute("COMMIT"))

    def _migrate(self) -> None:
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise IndexUnavailable(
                f"the incident index `{self.path}` was written by a newer blackbox (schema {version}, this one "
                f"knows {SCHEMA_VERSION}): upgrade blackbox, or set BLACKBOX_HOME to use another index"
            )
        if version == SCHEMA_VERSION:
            return
        with self._write() as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])  # another process may have done it
            for i in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")

    # --- incidents ------------------------------------------------------------------------------------
    def add(self, record: Mapping[str, Any]) -> tuple[int, bool]:
        """Index one bundle: (its incident number, whether it is new). A bundle already indexed (same sha256)
        keeps its number."""
        fields = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in record.items()}
        fields["indexed"] = now_iso()
        columns = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)

        def insert() -> tuple[int, bool]:
            with self._write() as db:
                row = db.execute("SELECT id FROM incidents WHERE sha256 = ?", (fields["sha256"],)).fetchone()
                if row is not None:
                    return int(row["id"]), False
                cur = db.execute(f"INSERT INTO incidents ({columns}) VALUES ({marks})", list(fields.values()))
                return int(cur.lastrowid or 0), True

        result: tuple[int, bool] = self._retry(insert)
        return result

    def set_url(self, sha256: str, url: str) -> None:
        """The shared-storage URL of an indexed bundle (`--upload`)."""

        def update() -> None:
            with self._write() as db:
                db.execute("UPDATE incidents SET bundle_url = ? WHERE sha256 = ?", (url, sha256))

        self._retry(update)

    def get(self, incident: int) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT * FROM incidents WHERE id = ?", (incident,)).fetchone()
        return None if row is None else _plain(row)

    def incidents(self, category: Optional[str] = None, since: Optional[str] = None,
             limit: Optional[int] = None) -> list[dict[str, Any]]:  # fmt: skip
        where, args = [], []
        if category:
            where.append("(category = ? OR category LIKE ?)")
            args += [category, category.rstrip(".") + ".%"]
        if since:
            where.append("created >= ?")
            args.append(since)
        sql = "SELECT * FROM incidents" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_plain(r) for r in self.db.execute(sql, args)]

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM incidents").fetchone()[0])

    def similar(self, fingerprint: str, category: str, top_frame: Optional[str], exclude: set[str], limit: int = 5,
                job: Optional[str] = None, top_path: Optional[str] = None) -> list[dict[str, Any]]:  # fmt: skip
        """Earlier incidents: the same fingerprint ("same"), else the same category and top frame with another
        message ("similar"); newest first, each with its latest linked fix. Other nodes' bundles of the same
        incident are not earlier incidents, nor are those of the same multi-node `job` (a node cut off from the
        others posts its own incident for the same failure), nor those whose top frame is in another file of
        another work tree (`top_path`: another project's function of the same name)."""
        rows = self.db.execute(
            "SELECT * FROM incidents WHERE fingerprint = ? OR (category = ? AND top_frame IS ?) ORDER BY id DESC",
            (fingerprint, category, top_frame),
        ).fetchall()
        out: list[dict[str, Any]] = []
        seen_incidents: set[str] = set()
        for row in rows:
            rec = _plain(row)
            if rec["sha256"] in exclude or (job and rec.get("job_id") == job):
                continue
            if differ(top_path, rec.get("top_path")):
                continue
            if rec.get("incident_id"):
                if rec["incident_id"] in seen_incidents:
                    continue  # one line per incident, not one per node bundle
                seen_incidents.add(rec["incident_id"])
            rec["match"] = "same" if rec["fingerprint"] == fingerprint else "similar"
            rec["fix"] = self.fix(int(rec["id"]))
            out.append(rec)
        out.sort(key=lambda r: (r["match"] != "same", -int(r["id"])))
        return out[:limit]

    # --- fixes ----------------------------------------------------------------------------------------
    def link(self, incident: int, fields: Mapping[str, Any]) -> int:
        if fields.get("status") not in STATUSES:
            raise ValueError(fields.get("status"))
        values = {**fields, "incident": incident, "created": now_iso()}
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)

        def insert() -> int:
            with self._write() as db:
                cur = db.execute(f"INSERT INTO links ({columns}) VALUES ({marks})", list(values.values()))
                return int(cur.lastrowid or 0)

        result: int = self._retry(insert)
        return result

    def fix(self, incident: int) -> Optional[dict[str, Any]]:
        """The newest link: the fix shown for the incident."""
        row = self.db.execute("SELECT * FROM links WHERE incident = ? ORDER BY id DESC LIMIT 1", (incident,)).fetchone()
        return None if row is None else _plain(row)

    def links(self, incident: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM links WHERE incident = ? ORDER BY id", (incident,))
        return [_plain(r) for r in rows]


def _plain(row: sqlite3.Row) -> dict[str, Any]:
    rec = dict(row)
    for key in ("suspects", "command"):
        if isinstance(rec.get(key), str):
            with contextlib.suppress(ValueError):
                rec[key] = json.loads(rec[key])
    return rec


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
