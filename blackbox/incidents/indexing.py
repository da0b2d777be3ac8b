"""Between bundles and the incident index: the record of a bundle (its report's stable fields, fingerprint,
config), indexing what `run`, `collect` and `report` see, and the "seen before" list for a report. A broken
index never stops the caller: `index_bundle` says so once through `warn` and goes on. Imports the stdlib, the
rank protocol, the bundle layout and reader, the analysis, the report model, the event log reader and the index."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Optional

from .._recorder import protocol as P
from ..analyze.model import Report
from ..bundle import layout as L
from ..bundle.reader import Bundle
from ..events import read_events
from .fingerprint import Signature, names_a_cause, signature
from .store import IncidentIndex, IndexUnavailable, default_path

CONFIG_CAP = 256 * 1024


def bundle_files(bundle: Bundle) -> list[tuple[str, str]]:
    """(path, sha256) of each bundle file behind a (possibly merged) bundle, as its reader or writer hashed it."""
    return list(bundle.digests.items())


def job_config(bundle: Bundle) -> tuple[Optional[str], Optional[str]]:
    """(name, text) of the job's first config file the bundle holds (already redacted when collected)."""
    names = sorted(n for n in bundle.files if L.CONFIG_DIR in n)
    if not names:
        return None, None
    return names[0].split(L.CONFIG_DIR, 1)[1], bundle.files[names[0]][:CONFIG_CAP].decode("utf-8", "replace")


def record(sig: Signature, report: Report, bundle: Bundle, path: str, sha256: str) -> dict[str, Any]:
    m = bundle.manifest
    job, multinode, incident = bundle.section("job"), bundle.section("multinode"), bundle.section("incident")
    node = bundle.json(L.NODE)
    git: dict[str, Any] = node["git"] if isinstance(node, dict) and isinstance(node.get("git"), dict) else {}
    config_name, config = job_config(bundle)
    return {
        "sha256": sha256, "bundle": path if "://" in path else os.path.abspath(path),
        "run_id": str(m.get("run_id") or ""),
        "job_id": multinode.get("job_id"), "incident_id": incident.get("id"), "node": str(m.get("node") or ""),
        "trigger": str(m.get("trigger") or ""), "created": m.get("created"), "command": job.get("command"),
        "git_commit": git.get("commit"), "category": sig.category, "phase": sig.phase,
        "suspects": report.verdict.suspect_ranks, "exception_type": sig.exception_type, "message": sig.message,
        "top_frame": sig.top_frame, "top_path": sig.top_path, "fingerprint": sig.fingerprint(),
        "summary": report.verdict.summary[:1000],
        "config_name": config_name, "config": config,
    }  # fmt: skip


def _fix(link: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not link:
        return None
    return {k: link.get(k) for k in ("status", "fix_commit", "fix_config_name", "rerun", "rerun_outcome", "note",
                                     "created")}  # fmt: skip


def rerun_outcome(path: str, incident: Mapping[str, Any], index: IncidentIndex) -> tuple[str, str, Optional[int]]:
    """What the rerun at `path` (a run directory or a bundle) says about the fix: (outcome sentence, verdict —
    `clean`, `same`, `other` or `unknown` —, the rerun's own incident number when it made one)."""
    run_events = os.path.join(path, P.EVENTS_LOG)
    if os.path.isdir(path) and os.path.isfile(run_events) and not os.path.isfile(os.path.join(path, L.MANIFEST)):
        end = next((e for e in reversed(read_events(run_events)) if e.get("event") == "end"), None)
        bundles_dir = os.path.join(path, P.BUNDLES_DIR)
        has_bundles = os.path.isdir(bundles_dir) and any(n.endswith(".tar.gz") for n in os.listdir(bundles_dir))
        if not has_bundles:
            if end is None:
                return "still running, or ended without blackbox's end record", "unknown", None
            code = end.get("exit_code")
            if code == 0:
                return "clean exit (exit code 0, no incident)", "clean", None
            return f"failed with exit code {code} and no bundle", "other", None
    from ..analyze.verdict import analyze
    from ..bundle.reader import read_bundles

    bundle = read_bundles([path])
    report = analyze(bundle)
    sig = signature(report)
    numbers = [index.add(record(sig, report, bundle, p, sha))[0] for p, sha in bundle_files(bundle)]
    number = numbers[0] if numbers else None
    if sig.fingerprint() == incident.get("fingerprint"):
        return f"the same failure again (incident #{number})", "same", number
    where = f" in {sig.top_frame}" if sig.top_frame else ""
    return f"another incident (#{number}: {sig.category}{where})", "other", number


def index_bundle(report: Report, bundle: Bundle, warn: Callable[[str], None],
                 env: Optional[Mapping[str, str]] = None, add: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """Index the bundle file(s) behind a report (`add`; else only look), and return the earlier incidents like it
    ("seen before"), newest first. An index that cannot be used costs one warning through `warn`, and nothing
    else."""
    path = default_path(os.environ if env is None else env)
    try:
        index = IncidentIndex(path)
    except IndexUnavailable as exc:
        warn(f"{exc}; going on without the incident index")
        return []
    try:
        sig = signature(report)
        files = bundle_files(bundle)
        job = bundle.section("multinode").get("job_id")
        found = index.similar(sig.fingerprint(), sig.category, sig.top_frame, {sha for _, sha in files},
                              job=str(job) if job else None, top_path=sig.top_path) if names_a_cause(
            sig.top_frame, sig.exception_type, sig.message) else []  # fmt: skip
        for p, sha in files if add else ():
            index.add(record(sig, report, bundle, p, sha))
    except Exception as exc:  # a full disk, a read-only file, a locked database past every retry
        warn(f"the incident index `{path}` could not be used ({exc}); going on without the incident index")
        return []
    finally:
        index.close()
    # neither other nodes' bundles of this incident nor the run's own earlier incidents are "before"
    current, run = bundle.section("incident").get("id"), bundle.manifest.get("run_id")
    keep = ("id", "match", "created", "run_id", "node", "incident_id", "bundle", "bundle_url", "category", "phase",
            "top_frame", "message", "exception_type", "git_commit", "summary")  # fmt: skip
    return [{k: r.get(k) for k in keep} | {"fix": _fix(r.get("fix"))} for r in found
            if (not current or r.get("incident_id") != current) and (not run or r.get("run_id") != run)]  # fmt: skip


def record_url(sha256: str, url: str, warn: Callable[[str], None], env: Optional[Mapping[str, str]] = None) -> None:
    """The shared-storage URL of an indexed bundle; an index that cannot be used costs one warning."""
    path = default_path(os.environ if env is None else env)
    try:
        index = IncidentIndex(path)
    except IndexUnavailable as exc:
        warn(f"{exc}; the bundle's URL is not in the incident index")
        return
    try:
        index.set_url(sha256, url)
    except Exception as exc:
        warn(f"the incident index `{path}` could not record the bundle's URL ({exc})")
    finally:
        index.close()
