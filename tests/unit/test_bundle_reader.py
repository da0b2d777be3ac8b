"""Bundles are untrusted input: nothing escapes, nothing executes, bad archives get one sentence."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import pytest

from blackbox.adapters.flight_recorder import FlightRecorderError, load_dump
from blackbox.bundle.reader import read_bundle
from blackbox.errors import BlackboxError


def make_tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)


def manifest(version: int = 1) -> bytes:
    return json.dumps({"schema_version": version, "run_id": "r", "node": "n", "trigger": "manual"}).encode()


def test_escaping_members_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    # GIVEN an archive with a traversal path, an absolute path and a link out of the tree
    link = tarfile.TarInfo("ranks/0/evil-link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    members = [tarfile.TarInfo(n) for n in ("manifest.json", "../escape.txt", "/tmp/abs.txt")] + [link]
    bundle = tmp_path / "b.tar.gz"
    make_tar(bundle, members, {"manifest.json": manifest(), "../escape.txt": b"x", "/tmp/abs.txt": b"y"})
    before = set(os.listdir(tmp_path))
    # WHEN it is read
    b = read_bundle(str(bundle))
    # THEN none of them is taken, each is named, and nothing appeared on disk
    assert set(b.files) == {"manifest.json"}
    assert len(b.skipped) == 3
    assert set(os.listdir(tmp_path)) == before and not Path("/tmp/abs.txt").exists()


def test_corrupt_truncated_newer_and_foreign(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    make_tar(good, [tarfile.TarInfo("manifest.json")], {"manifest.json": manifest()})
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(good.read_bytes()[:20])
    with pytest.raises(BlackboxError, match="corrupt or truncated"):
        read_bundle(str(truncated))
    newer = tmp_path / "newer.tar.gz"
    make_tar(newer, [tarfile.TarInfo("manifest.json")], {"manifest.json": manifest(99)})
    with pytest.raises(BlackboxError, match="schema 99, newer"):
        read_bundle(str(newer))
    foreign = tmp_path / "foreign.tar.gz"
    make_tar(foreign, [tarfile.TarInfo("x.txt")], {"x.txt": b"x"})
    with pytest.raises(BlackboxError, match="not a blackbox bundle"):
        read_bundle(str(foreign))
    with pytest.raises(BlackboxError, match="does not exist"):
        read_bundle(str(tmp_path / "missing.tar.gz"))


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/blackbox-pwned",))


def test_a_pickle_that_would_run_code_is_refused() -> None:
    payload = pickle.dumps({"entries": [], "x": _Boom()})
    with pytest.raises(FlightRecorderError, match="only plain data"):
        load_dump(payload)
    assert not Path("/tmp/blackbox-pwned").exists()
    assert load_dump(pickle.dumps({"entries": [{"a": (1, "b")}], "pg_config": {}}))["entries"][0]["a"] == (1, "b")
