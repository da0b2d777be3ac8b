"""Writes one bundle: entries gathered in memory, each capped, a manifest first, the tar.gz written to a
temporary name and renamed, files 0600 and directories 0700. What was written comes back whole (members, manifest,
the file's sha256), so that what follows a bundle never reads it back. Imports the stdlib and blackbox only."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from .. import __version__
from ..detections import Trigger
from .layout import MANIFEST, MANIFEST_SCHEMA_VERSION, RANK_TABLE, TABLED, rank_member

DEFAULT_FILE_CAP = 4 * 1024 * 1024  # bytes per file
DEFAULT_TOTAL_CAP = 64 * 1024 * 1024  # bytes per bundle, before compression


@dataclass
class Step:
    name: str
    status: str  # ok | failed | skipped | truncated
    duration_s: float
    detail: Optional[str] = None


@dataclass(frozen=True)
class Written:
    """A bundle as it was written: its path, the sha256 of the file, its manifest and every member's bytes (the
    manifest's among them), as a reader of the file would find them."""

    path: str
    sha256: str
    manifest: dict[str, Any]
    members: dict[str, bytes]


class _Hashing(io.RawIOBase):
    """A file that hashes what is written through it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.hash.update(data)
        self.raw.write(data)
        return len(data)


@dataclass
class BundleWriter:
    run_id: str
    node: str
    trigger: Trigger
    file_cap: int = DEFAULT_FILE_CAP
    total_cap: int = DEFAULT_TOTAL_CAP
    entries: dict[str, bytes] = field(default_factory=dict)
    truncated: dict[str, int] = field(default_factory=dict)  # path -> original size
    dropped: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    records: dict[tuple[int, str], bytes] = field(default_factory=dict)  # (rank, name) -> compact JSON
    _total: int = 0

    def add_bytes(self, path: str, data: bytes, *, keep: str = "tail", cap: Optional[int] = None) -> None:
        """Add an entry, cut to its cap (keeping the tail or the head; `keep="whole"` drops an entry that
        a cut would make useless, like a pickle) and to the total cap."""
        cap = self.file_cap if cap is None else cap
        if len(data) > cap:
            self.truncated[path] = len(data)
            if keep == "whole":
                self.dropped.append(path)
                return
            data = data[-cap:] if keep == "tail" else data[:cap]
        if self._total + len(data) > self.total_cap:
            self.dropped.append(path)
            return
        self._total += len(data)
        self.entries[path] = data

    def add_json(self, path: str, obj: Any) -> None:
        self.add_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode(), keep="head")

    def add_record(self, rank: int, name: str, obj: Any) -> None:
        """One of a rank's own records (layout.TABLED: heartbeat, history, py-spy, /proc), kept in the node's rank
        table; a reader sees it as the member ranks/<rank>/<name>. Over the file cap it is dropped whole (a cut
        record would not parse), and so is one past the total cap."""
        assert name in TABLED, name
        data = json.dumps(obj, separators=(",", ":"), default=str).encode()
        member = rank_member(rank, name)
        if len(data) > self.file_cap:
            self.truncated[member] = len(data)
            self.dropped.append(member)
            return
        if self._total + len(data) > self.total_cap:
            self.dropped.append(member)
            return
        self._total += len(data)
        self.records[(rank, name)] = data

    def rank_table(self) -> Optional[bytes]:
        """The ranks' records as the one member that holds them (None: no record)."""
        if not self.records:
            return None
        return b"".join(b'[%d,"%s",%s]\n' % (rank, name.encode(), data) for (rank, name), data in
                        sorted(self.records.items(), key=lambda kv: kv[0]))  # fmt: skip

    def step(self, name: str, status: str, started: float, detail: Optional[str] = None) -> None:
        self.steps.append(Step(name, status, round(time.monotonic() - started, 4), detail))

    def manifest(self, extra: dict[str, Any]) -> dict[str, Any]:
        files = [
            {
                "path": path,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                **({"truncated_from": self.truncated[path]} if path in self.truncated else {}),
            }
            for path, data in self.entries.items()
        ]
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "blackbox_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run_id": self.run_id,
            "node": self.node,
            "trigger": self.trigger.name,
            "triggered_by": self.trigger.to_json(),
            **extra,
            "files": files,
            "steps": [s.__dict__ for s in self.steps],
            "limits": {
                "file_cap_bytes": self.file_cap,
                "total_cap_bytes": self.total_cap,
                "truncated": sorted(self.truncated),
                "dropped": self.dropped,
            },
        }

    def default_name(self) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        return f"blackbox-{_safe(self.run_id)}-{_safe(self.node)}-{stamp}-{_safe(self.trigger.name)}.tar.gz"

    def write(self, out_dir: str, extra: dict[str, Any], name: Optional[str] = None) -> Written:
        """Write atomically into `out_dir` (as `name`, or the standard name). An existing file is never
        overwritten: a suffix is added."""
        name = name or self.default_name()
        final = os.path.join(out_dir, name)
        n = 1
        while os.path.exists(final):
            n += 1
            stem, dot, ext = name.partition(".tar")
            final = os.path.join(out_dir, f"{stem}-{n}{dot}{ext}")
        tmp = os.path.join(out_dir, f".{name}.{os.getpid()}.tmp")
        table = self.rank_table()
        if table is not None:  # the ranks' records, one member (counted against the caps as each was added)
            self.entries[RANK_TABLE] = table
        manifest = json.dumps(self.manifest(extra), indent=2).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw:
                hashing = _Hashing(raw)
                with tarfile.open(fileobj=hashing, mode="w:gz") as tar:
                    now = time.time()
                    dirs: set[str] = set()
                    _add(tar, MANIFEST, manifest, now)
                    for path, data in self.entries.items():
                        parts = path.split("/")[:-1]
                        for i in range(1, len(parts) + 1):
                            d = "/".join(parts[:i])
                            if d not in dirs:
                                dirs.add(d)
                                info = tarfile.TarInfo(d)
                                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, int(now)
                                tar.addfile(info)
                        _add(tar, path, data, now)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return Written(final, hashing.hash.hexdigest(), json.loads(manifest), {MANIFEST: manifest, **self.entries})


def _add(tar: tarfile.TarFile, path: str, data: bytes, now: float) -> None:
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime = len(data), 0o600, int(now)
    tar.addfile(info, io.BytesIO(data))


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:64] or "unknown"
