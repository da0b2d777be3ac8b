"""Reading shared storage back: the bundles a URL names (one bundle, a run's prefix — every node's bundle —, or the
newest run under a prefix) and the incident records under a prefix, each bounded before it is read: a listing has
a count limit, every object's size is checked against the reader's limits before its first byte is fetched, and a
download stops at the limit whatever the listing said. Bundles go through the same reader as local ones.
Never prints: a failure is a BlackboxError of one sentence. Imports the stdlib, blackbox.errors, the bundle reader
and this package."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Optional, TypeVar

from ..bundle.reader import MAX_TOTAL_BYTES, Bundle, read_bundle
from ..errors import BlackboxError
from ..incidents.store import differ
from . import layout as SL
from .urls import describe_error, display, is_url, join, open_fs

MAX_LISTED = 200_000  # objects one listing may return before blackbox asks for a narrower prefix
MAX_BUNDLES = 1024  # bundles one report reads (nodes of one job)
MAX_DOWNLOAD_BYTES = 4 * 1024 * 1024 * 1024  # all of them together
MAX_RECORDS = 2000  # incident records read, newest first
MAX_FIXES = 2000
T = TypeVar("T")


class Store:
    """One storage URL opened: listing and reading under it, every failure one sentence."""

    def __init__(self, url: str, timeout: Optional[float] = None) -> None:
        self.url = url.rstrip("/") if is_url(url) else os.path.abspath(url)
        self.fs, self.root = open_fs(self.url, timeout)
        self.local = "file" in _protocols(self.fs)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except BlackboxError:
            raise
        except Exception as exc:
            raise BlackboxError(f"Cannot {what} `{display(self.url)}`: {describe_error(exc)}.") from None

    def url_of(self, path: str) -> str:
        """The user-facing URL of a path in this store."""
        rel = path[len(self.root) :].lstrip("/") if path.startswith(self.root) else path
        return join(display(self.url), rel) if rel else display(self.url)

    def listing(self, path: str) -> dict[str, dict[str, Any]]:
        """path -> info of every object under `path` (at most MAX_LISTED)."""

        def find() -> dict[str, dict[str, Any]]:
            if not self.fs.exists(path):
                raise FileNotFoundError(f"nothing at `{display(self.url_of(path))}`")
            if self.fs.isfile(path):
                return {path: self.fs.info(path)}
            found: dict[str, dict[str, Any]] = self.fs.find(path, detail=True)
            return found

        found = self.call("list", find)
        if len(found) > MAX_LISTED:
            raise BlackboxError(f"`{display(self.url)}` holds more than {MAX_LISTED} objects; refusing to list them.",
                                hint="Name one run under it: URL/RUN_ID.")  # fmt: skip
        return {str(k): v for k, v in found.items() if v.get("type", "file") != "directory"}

    def fetch(self, path: str, size: Optional[int], cap: int, dest: str) -> None:
        """Copy one object to `dest`, refusing it when it is (or turns out, while read) larger than `cap`."""
        if size is not None and size > cap:
            raise BlackboxError(f"`{self.url_of(path)}` is {size} bytes, over the {cap} byte limit; refusing to read "
                                "it.")  # fmt: skip

        def copy() -> None:
            got = 0
            with self.fs.open(path, "rb") as src, open(dest, "wb") as out:
                while True:
                    chunk = src.read(min(8 << 20, cap + 1 - got))
                    if not chunk:
                        return
                    got += len(chunk)
                    if got > cap:
                        raise BlackboxError(f"`{self.url_of(path)}` is over the {cap} byte limit; refusing to read "
                                            "it.")  # fmt: skip
                    out.write(chunk)

        self.call("read", copy)

    def put(self, dest: str, src: Optional[str] = None, data: Optional[bytes] = None) -> None:
        """One object, from a local file or bytes; on a filesystem written beside and renamed, so that no reader
        ever sees half of it, group-readable (the team reads it through the directory), never world-readable.
        Raises the backend's own errors (the caller decides about retries)."""
        fs = self.fs
        if not self.local:
            if src is not None:
                fs.put_file(src, dest)
            else:
                fs.pipe_file(dest, data or b"")
            return
        fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        part = f"{dest}.part-{os.getpid()}"
        try:
            if src is not None:
                fs.put_file(src, part)
            else:
                fs.pipe_file(part, data or b"")
            os.chmod(part, 0o640)
            fs.mv(part, dest)
        finally:
            if fs.exists(part):
                fs.rm(part)

    def cat(self, paths: list[str]) -> dict[str, bytes]:
        if not paths:
            return {}
        got = self.call("read", lambda: self.fs.cat(paths, on_error="omit"))
        return {str(k): v for k, v in got.items() if isinstance(v, bytes)}


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = getattr(fs, "protocol", ())
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _mtime(info: dict[str, Any]) -> float:
    """An object's modification time in seconds, whatever its backend calls it (0 when it says none)."""
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def is_remote(path: str) -> bool:
    """A storage URL, or a local directory laid out as an upload prefix (RUN_ID/NODE/bundle, or NODE/bundle): a
    shared filesystem given as a path. A run directory or a directory of bundles is the local reader's."""
    if is_url(path):
        return True
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "manifest.json")):
        return False
    names = _names(path)
    if "bundles" in names or any(n.endswith(SL.BUNDLE_SUFFIX) for n in names):
        return False
    for run in _dirs(path, 1000):
        if any(n.endswith(SL.BUNDLE_SUFFIX) for n in _names(run)):
            return True  # PREFIX/RUN_ID given: NODE/bundle
        if any(any(n.endswith(SL.BUNDLE_SUFFIX) for n in _names(node)) for node in _dirs(run, 100)):
            return True  # the prefix given: RUN_ID/NODE/bundle
    return False


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _dirs(path: str, limit: int) -> list[str]:
    out = [os.path.join(path, n) for n in _names(path)[:limit]]
    return [p for p in out if os.path.isdir(p) and not os.path.islink(p)]


# --- bundles --------------------------------------------------------------------------------------------------
def bundle_paths(store: Store) -> list[tuple[str, dict[str, Any]]]:
    """The bundles a URL names: the object itself; every bundle under a node's or a run's prefix; or, under a
    prefix of runs (RUN_ID/NODE/bundle), those of the newest run."""
    objects = store.listing(store.root)
    bundles = {p: i for p, i in objects.items() if p.endswith(SL.BUNDLE_SUFFIX)}
    if not bundles:
        raise BlackboxError(
            f"`{display(store.url)}` holds no bundle (.tar.gz).",
            hint="Give a bundle's URL, a run's prefix (PREFIX/RUN_ID) or the upload prefix.",
        )
    base = store.root.rstrip("/")
    depth = {p: p[len(base) :].strip("/").count("/") for p in bundles}
    if max(depth.values()) >= 2:  # PREFIX/RUN/NODE/bundle: the newest run
        runs: dict[str, list[str]] = {}
        for p in bundles:
            runs.setdefault(p[len(base) :].strip("/").split("/", 1)[0], []).append(p)
        newest = max(runs, key=lambda r: (max(_mtime(bundles[p]) for p in runs[r]), r))
        bundles = {p: bundles[p] for p in runs[newest]}
    if len(bundles) > MAX_BUNDLES:
        raise BlackboxError(f"`{display(store.url)}` holds more than {MAX_BUNDLES} bundles; refusing to read them.",
                            hint="Name one run or one node under it.")  # fmt: skip
    return sorted(bundles.items())


@contextmanager
def _scratch() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="blackbox-remote-")  # 0700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def read_remote(url: str) -> list[Bundle]:
    """Every bundle a URL names, read through the bundle reader (each named by its URL)."""
    store = Store(url)
    out: list[Bundle] = []
    total = 0
    with _scratch() as scratch:
        for n, (path, info) in enumerate(bundle_paths(store)):
            size = info.get("size")
            size = int(size) if isinstance(size, (int, float)) else None
            total += size or 0
            if total > MAX_DOWNLOAD_BYTES:
                raise BlackboxError(f"The bundles under `{display(store.url)}` add up to more than "
                                    f"{MAX_DOWNLOAD_BYTES} bytes; refusing to read them.",
                                    hint="Name one run or one node under it.")  # fmt: skip
            local = os.path.join(scratch, f"{n}{SL.BUNDLE_SUFFIX}")
            store.fetch(path, size, MAX_TOTAL_BYTES, local)
            where = store.url_of(path)
            try:
                bundle = read_bundle(local)
            except BlackboxError as exc:
                raise BlackboxError(exc.message.replace(f"`{local}`", f"`{where}`"), hint=exc.hint) from None
            finally:
                os.unlink(local)
            bundle.path = where
            bundle.digests = {where: next(iter(bundle.digests.values()), "")}
            out.append(bundle)
    return out


# --- incident records -------------------------------------------------------------------------------------------
def records(store: Store, limit: int = MAX_RECORDS,
            objects: Optional[dict[str, dict[str, Any]]] = None) -> list[dict[str, Any]]:  # fmt: skip
    """The incident records under the store's URL, newest first (at most `limit`), each with its newest linked fix
    (`fix`, or None). `objects`: the store's listing, when the caller has it."""
    objects = store.listing(store.root) if objects is None else objects
    found = sorted(((p, i) for p, i in objects.items() if p.endswith(SL.RECORD_SUFFIX)),
                   key=lambda pi: _mtime(pi[1]), reverse=True)[:limit]  # fmt: skip
    fixes = sorted(((p, i) for p, i in objects.items() if SL.FIX_MARK in p.rsplit("/", 1)[-1] and p.endswith(".json")),
                   key=lambda pi: _mtime(pi[1]), reverse=True)[:MAX_FIXES]  # fmt: skip
    small = [p for p, i in found + fixes if int(i.get("size") or 0) <= SL.MAX_RECORD_BYTES]
    data = store.cat(small)
    newest_fix: dict[str, dict[str, Any]] = {}
    for p, _ in fixes:  # newest first: the first one seen for a record is its newest
        stem = p.rsplit(SL.FIX_MARK, 1)[0]
        fix = SL.parse_fix(data.get(p, b"{}"))
        if fix is not None and stem not in newest_fix:
            newest_fix[stem] = fix
    out = []
    for p, _ in found:
        rec = SL.parse_record(data.get(p, b""), store.url_of(p))
        if rec is None:
            continue
        rec["fix"] = newest_fix.get(p[: -len(SL.RECORD_SUFFIX)])
        out.append(rec)
    out.sort(key=lambda r: str(r.get("time") or ""), reverse=True)
    return out


def find_record(store: Store, ident: str) -> tuple[str, dict[str, Any]]:
    """(record path, record) whose id starts with `ident`."""
    ident = ident.strip().lower()
    objects = store.listing(store.root)
    matches = []
    for rec in records(store, MAX_RECORDS, objects):
        if ident and str(rec.get("id") or "").lower().startswith(ident):
            matches.append(rec)
    if not matches:
        raise BlackboxError(f"There is no incident `{ident}` under `{display(store.url)}`.",
                            hint=f"`blackbox incidents list --from {display(store.url)}` shows the ids.")  # fmt: skip
    if len({m["id"] for m in matches}) > 1:
        raise BlackboxError(f"`{ident}` names {len(matches)} incidents under `{display(store.url)}`.",
                            hint="Give more of the id.")  # fmt: skip
    rec = matches[0]
    path = next(p for p in objects if store.url_of(p) == rec["record"])
    return path, rec


def link_fix(store: Store, record_path: str, fields: dict[str, Any]) -> str:
    """Write a fix record beside an incident record; returns its URL."""
    created = fields.get("created") or datetime.now(timezone.utc).isoformat(timespec="seconds")
    body = {k: fields.get(k) for k in SL.FIX_FIELDS} | {"created": created, "record": store.url_of(record_path)}
    dest = SL.fix_key(record_path, str(created).replace(":", ""))
    store.call("write to", lambda: store.put(dest, data=(json.dumps(body, indent=1) + "\n").encode()))
    return store.url_of(dest)


def seen_before(store: Store, fingerprint: str, category: str, top_frame: Optional[str], incident_id: Optional[str],
                sha256: Optional[str], limit: int = 5, run: Optional[str] = None, top_path: Optional[str] = None
                ) -> list[dict[str, Any]]:  # fmt: skip
    """Earlier incidents under the prefix like this one: the same fingerprint ("same"), else the same category
    and top frame ("similar"); one line per incident (not one per node bundle), newest first. An incident of the
    same `run` is not "before", nor one whose top frame is in another file of another work tree (`top_path`)."""
    out: list[dict[str, Any]] = []
    seen_incidents: set[str] = set()
    for rec in records(store):
        if rec.get("sha256") == sha256 or (incident_id and rec.get("incident_id") == incident_id) or (
                run and rec.get("run") == run):  # fmt: skip
            continue
        same = rec.get("fingerprint") == fingerprint
        if not same and not (rec.get("category") == category and rec.get("top_frame") == top_frame):
            continue
        if differ(top_path, rec.get("top_path")):
            continue
        key = str(rec.get("incident_id") or rec.get("id"))
        if key in seen_incidents:
            continue
        seen_incidents.add(key)
        out.append({**rec, "match": "same" if same else "similar"})
    out.sort(key=lambda r: r["match"] != "same")
    return out[:limit]


def describe_remote(entry: dict[str, Any]) -> str:
    """One line for a record seen before: which incident, when, where, and what fixed it."""
    when = str(entry.get("time") or "?")[:10]
    what = "the same failure" if entry.get("match") == "same" else "a similar failure (same place, other message)"
    line = f"incident {entry.get('id')} on {when} (run {entry.get('run')}, {entry.get('host')}): {what}"
    fix = entry.get("fix")
    if isinstance(fix, dict):
        line += f"; {fix.get('status')}"
        if fix.get("fix_commit"):
            line += f" in {str(fix['fix_commit'])[:12]}"
        if fix.get("note"):
            line += f" — {fix['note']}"
    else:
        line += "; no fix linked"
    return line
