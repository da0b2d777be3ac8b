"""Where bundles go under a storage prefix, and the small incident record written beside each:

    PREFIX/RUN_ID/NODE/blackbox-….tar.gz            the bundle, as written on the node (redacted)
    PREFIX/RUN_ID/NODE/blackbox-….incident.json     run, node, host, trigger, verdict, fingerprint, bundle URL, time
    PREFIX/RUN_ID/NODE/blackbox-….fix-<UTC>.json    a fix linked to it (`blackbox incidents link --from PREFIX`)

RUN_ID is the job's id (a multi-node job's nodes share node 0's), NODE the host, with the node rank where there
are several. Records are untrusted input when read back. Imports the stdlib, the report model and fingerprints."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from ..analyze.model import Report
from ..incidents import fingerprint
from ..incidents.fingerprint import signature

RECORD_SCHEMA_VERSION = 1
BUNDLE_SUFFIX = ".tar.gz"
RECORD_SUFFIX = ".incident.json"
FIX_MARK = ".fix-"
MAX_RECORD_BYTES = 64 * 1024  # a record is a few hundred bytes: anything far larger is not one
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def segment(text: str) -> str:
    """A path segment from a host name or run id: letters, digits, `.`, `_`, `-` only; never `.` or `..`."""
    out = _UNSAFE.sub("_", text).strip(".") or "unknown"
    return out[:120]


def node_dir(host: str, node_rank: Optional[int]) -> str:
    return segment(host if node_rank is None else f"node{node_rank}-{host}")


def bundle_key(run: str, node: str, filename: str) -> str:
    return f"{segment(run)}/{node}/{segment(filename)}"


def record_key(bundle: str) -> str:
    stem = bundle[: -len(BUNDLE_SUFFIX)] if bundle.endswith(BUNDLE_SUFFIX) else bundle
    return stem + RECORD_SUFFIX


def fix_key(record: str, utc: str) -> str:
    return record[: -len(RECORD_SUFFIX)] + FIX_MARK + segment(utc) + ".json"


def short_id(sha256: str) -> str:
    """A record's id, for `incidents show ID --from`: the first 12 hex digits of its bundle's sha256."""
    return sha256[:12]


def make_record(report: Report, manifest: dict[str, Any], run: str, node: str, host: str, sha256: str,
                size: int) -> dict[str, Any]:  # fmt: skip
    """The incident record of one bundle (its URL is added by whoever copies it)."""
    sig = signature(report)
    v = report.verdict
    incident: dict[str, Any] = manifest["incident"] if isinstance(manifest.get("incident"), dict) else {}
    return {
        "schema_version": RECORD_SCHEMA_VERSION, "kind": "torch-blackbox incident", "id": short_id(sha256),
        "run": run, "run_id": str(manifest.get("run_id") or ""), "node": node, "host": host,
        "incident_id": incident.get("id"),
        "trigger": str(manifest.get("trigger") or ""), "time": manifest.get("created"),
        "verdict": {"category": v.category, "phase": v.phase, "suspect_ranks": list(v.suspect_ranks),
                    "confidence": v.confidence, "summary": v.summary[:1000]},
        "fingerprint": sig.fingerprint(), "exception_type": sig.exception_type, "message": sig.message,
        "top_frame": sig.top_frame, "top_path": sig.top_path, "bundle": None, "sha256": sha256, "size": size,
    }  # fmt: skip


def _text(value: Any, cap: int = 1000) -> Optional[str]:
    return None if value is None else str(value)[:cap]


def _small_json(data: bytes) -> Optional[dict[str, Any]]:
    """A JSON object of at most MAX_RECORD_BYTES, else None."""
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def parse_record(data: bytes, where: str) -> Optional[dict[str, Any]]:
    """A record read back (untrusted): its known fields, typed, or None when it is not one this blackbox reads."""
    raw = _small_json(data)
    if raw is None or not isinstance(raw.get("schema_version"), int):
        return None
    if raw["schema_version"] > RECORD_SCHEMA_VERSION or not isinstance(raw.get("fingerprint"), str):
        return None
    verdict: dict[str, Any] = raw["verdict"] if isinstance(raw.get("verdict"), dict) else {}
    suspects = verdict.get("suspect_ranks")
    fields = ("id", "run", "run_id", "node", "host", "incident_id", "trigger", "time", "fingerprint",
              "exception_type", "message", "top_frame", "top_path", "bundle", "sha256")  # fmt: skip
    out: dict[str, Any] = {k: _text(raw.get(k)) for k in fields}
    out.update(
        category=_text(verdict.get("category"), 64), phase=_text(verdict.get("phase"), 64),
        summary=_text(verdict.get("summary")), confidence=_text(verdict.get("confidence"), 32),
        suspects=[s for s in suspects if isinstance(s, int) and not isinstance(s, bool)][:64]
        if isinstance(suspects, list) else [],
        record=where,
    )  # fmt: skip
    return out


FIX_FIELDS = ("status", "fix_commit", "fix_config_name", "note", "created", "by")


def parse_fix(data: bytes) -> Optional[dict[str, Any]]:
    raw = _small_json(data)
    if raw is None or raw.get("status") not in ("hypothesis", "fixed", "verified"):
        return None
    return {k: _text(raw.get(k)) for k in FIX_FIELDS}


def names_a_cause(record: dict[str, Any]) -> bool:
    """Whether an incident record says what failed (incidents.fingerprint.names_a_cause): only then are earlier
    records searched for the same failure."""
    return fingerprint.names_a_cause(record.get("top_frame"), record.get("exception_type"), record.get("message"))
