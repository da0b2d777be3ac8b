"""Reads a bundle as untrusted input: a tar.gz, an extracted bundle directory, or a run directory (its
newest bundle). Members are read into memory, never extracted: only regular files with relative paths,
bounded in count and size; nothing is executed or unpickled. Imports the stdlib and blackbox only."""

from __future__ import annotations

import json
import os
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

from ..errors import BlackboxError
from .writer import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION

MAX_MEMBERS = 20_000
MAX_MEMBER_BYTES = 64 * 1024 * 1024
MAX_TOTAL_BYTES = 512 * 1024 * 1024


@dataclass
class Bundle:
    path: str
    manifest: dict[str, Any]
    files: dict[str, bytes]
    skipped: list[str]  # members refused (links, devices, unsafe paths), with the reason

    def json(self, name: str) -> Any:
        data = self.files.get(name)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def text(self, name: str) -> str:
        return self.files.get(name, b"").decode("utf-8", "replace")


def _safe_name(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and "\0" not in name


def find_bundle(path: str) -> str:
    """A bundle file or directory from what the user named (a run directory gives its newest bundle)."""
    if not os.path.exists(path):
        raise BlackboxError(f"`{path}` does not exist.", hint="Give a bundle (.tar.gz), or a run directory.")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            return path
        bundles_dir = os.path.join(path, "bundles")
        found = []
        if os.path.isdir(bundles_dir):
            found = [os.path.join(bundles_dir, n) for n in os.listdir(bundles_dir) if n.endswith(".tar.gz")]
        if not found:
            raise BlackboxError(
                f"`{path}` holds no bundle: it is neither a bundle directory nor a run directory with bundles."
            )
        return max(found, key=os.path.getmtime)
    return path


def read_bundle(path: str) -> Bundle:
    path = find_bundle(path)
    files: dict[str, bytes] = {}
    skipped: list[str] = []
    if os.path.isdir(path):
        _read_dir(path, files, skipped)
    else:
        _read_tar(path, files, skipped)
    raw = files.get(MANIFEST_NAME)
    if raw is None:
        raise BlackboxError(f"`{path}` is not a blackbox bundle: it has no {MANIFEST_NAME}.")
    try:
        manifest = json.loads(raw)
    except ValueError:
        raise BlackboxError(f"The manifest of `{path}` is not valid JSON.") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("schema_version"), int):
        raise BlackboxError(f"The manifest of `{path}` has no schema version.")
    if manifest["schema_version"] > MANIFEST_SCHEMA_VERSION:
        raise BlackboxError(
            f"`{path}` was written with bundle schema {manifest['schema_version']}, newer than this blackbox "
            f"reads ({MANIFEST_SCHEMA_VERSION}).",
            hint="Upgrade torch-blackbox to read it.",
        )
    return Bundle(path, manifest, files, skipped)


def _read_tar(path: str, files: dict[str, bytes], skipped: list[str]) -> None:
    total = 0
    try:
        with tarfile.open(path, "r:*") as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise BlackboxError(f"`{path}` has more than {MAX_MEMBERS} members; refusing to read it.")
                if not _safe_name(member.name):
                    skipped.append(f"{member.name}: unsafe path")
                    continue
                if member.isdir():
                    continue
                if not member.isfile():
                    skipped.append(f"{member.name}: not a regular file")
                    continue
                if member.size > MAX_MEMBER_BYTES:
                    skipped.append(f"{member.name}: {member.size} bytes, over the {MAX_MEMBER_BYTES} byte limit")
                    continue
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    raise BlackboxError(f"`{path}` unpacks to more than {MAX_TOTAL_BYTES} bytes; refusing to read it.")
                f = tar.extractfile(member)
                if f is not None:
                    name = member.name[2:] if member.name.startswith("./") else member.name
                    files[name] = f.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES]
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BlackboxError(f"`{path}` is not a readable bundle (corrupt or truncated archive: {exc}).") from None


def _read_dir(path: str, files: dict[str, bytes], skipped: list[str]) -> None:
    total = 0
    root = os.path.realpath(path)
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full) or not os.path.isfile(full):
                skipped.append(f"{rel}: not a regular file")
                continue
            size = os.path.getsize(full)
            if size > MAX_MEMBER_BYTES or len(files) >= MAX_MEMBERS:
                skipped.append(f"{rel}: over the size or count limit")
                continue
            total += size
            if total > MAX_TOTAL_BYTES:
                raise BlackboxError(f"`{path}` holds more than {MAX_TOTAL_BYTES} bytes; refusing to read it.")
            with open(full, "rb") as f:
                files[rel] = f.read()
