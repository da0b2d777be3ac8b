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


def test_tar_bomb_is_refused_after_reading_at_most_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an archive that is small on disk but unpacks to far more than the limit (zeros compress ~1000:1)
    from blackbox.bundle import reader

    monkeypatch.setattr(reader, "MAX_TOTAL_BYTES", 4 * 2**20)
    bomb = tmp_path / "bomb.tar.gz"
    make_tar(bomb, [tarfile.TarInfo("manifest.json"), tarfile.TarInfo("ranks/0/zeros")],
             {"manifest.json": manifest(), "ranks/0/zeros": bytes(64 * 2**20)})  # fmt: skip
    assert bomb.stat().st_size < 200_000
    # THEN it is refused in one sentence
    with pytest.raises(BlackboxError, match="unpacks to more than"):
        read_bundle(str(bomb))


def test_too_many_members_and_oversized_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blackbox.bundle import reader

    many = tmp_path / "many.tar.gz"
    names = [f"ranks/{i}/x" for i in range(50)]
    make_tar(many, [tarfile.TarInfo("manifest.json")] + [tarfile.TarInfo(n) for n in names],
             {"manifest.json": manifest(), **{n: b"x" for n in names}})  # fmt: skip
    monkeypatch.setattr(reader, "MAX_MEMBERS", 10)
    with pytest.raises(BlackboxError, match="more than 10 members"):
        read_bundle(str(many))
    monkeypatch.setattr(reader, "MAX_MEMBERS", 1000)
    monkeypatch.setattr(reader, "MAX_MEMBER_BYTES", 10)
    big = tmp_path / "big.tar.gz"
    make_tar(big, [tarfile.TarInfo("manifest.json"), tarfile.TarInfo("ranks/0/big")],
             {"manifest.json": manifest()[:10], "ranks/0/big": b"y" * 100})  # fmt: skip
    with pytest.raises(BlackboxError):  # the manifest itself was cut: not a bundle
        read_bundle(str(big))


def test_links_devices_and_long_names(tmp_path: Path) -> None:
    # GIVEN a hard link, a FIFO, a device, and a member whose name needs a PAX header
    long_name = "ranks/0/" + "n" * 150 + ".json"
    hard = tarfile.TarInfo("ranks/0/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "manifest.json"
    fifo = tarfile.TarInfo("ranks/0/fifo")
    fifo.type = tarfile.FIFOTYPE
    dev = tarfile.TarInfo("ranks/0/dev")
    dev.type = tarfile.CHRTYPE
    bundle = tmp_path / "b.tar.gz"
    make_tar(bundle, [tarfile.TarInfo("manifest.json"), hard, fifo, dev, tarfile.TarInfo(long_name)],
             {"manifest.json": manifest(), long_name: b"{}"})  # fmt: skip
    b = read_bundle(str(bundle))
    # THEN only the regular files are read, the long name intact; the others are named as skipped
    assert set(b.files) == {"manifest.json", long_name}
    assert sorted(s.split(":")[0] for s in b.skipped) == ["ranks/0/dev", "ranks/0/fifo", "ranks/0/hard"]


def test_a_corrupt_header_is_one_sentence(tmp_path: Path) -> None:
    import gzip

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest())
        tar.addfile(info, io.BytesIO(manifest()))
    data = bytearray(raw.getvalue())
    data[10] ^= 0xFF  # inside the first header's name: its checksum no longer matches
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(BlackboxError, match="checksum"):
        read_bundle(str(bad))


@pytest.mark.parametrize("text", [
    b'{"loss": NaN, "best": Infinity, "worst": -Infinity}',  # a metric the job logged as NaN
    b'{"name": "\\ud800 alone"}',  # a lone surrogate, escaped
    b'{"name": "caf\xc3\xa9", "a": 1, "a": 2}',  # UTF-8, a key twice (the last wins)
    b'[1.0000000000000002, 5e-324, 1e308, -0.0, 0.1]',
    b' \n{"x": [true, false, null, "\\u00e9\\n"]}\n',
])  # fmt: skip
def test_bundle_json_is_what_the_stdlib_reads(text: bytes) -> None:
    # orjson is the fast path; whatever it refuses, the stdlib's json decides: one answer either way
    from blackbox.bundle import reader

    assert reader._fast_loads is not None, "orjson is a dependency: the report's speed at 32,768 ranks needs it"
    expected = json.loads(text)
    got = reader.parse_json(text)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_an_integer_past_64_bits_is_no_integer_to_the_report() -> None:
    # orjson reads it as a float (as a browser would), the stdlib as an int: either way no rank, step or pid, and
    # no finite number the report computes with (number() bounds at 1e20)
    from blackbox.bundle import reader

    value = reader.parse_json(b'{"rank": 123456789012345678901234567890}')["rank"]
    assert reader.integer(value) is None and reader.number(value) is None


@pytest.mark.parametrize("text", [b'{"a": 1,}', b"{'a': 1}", b'{"a": "tab\tinside"}', b"[" * 100_000, b"\xff{}", b""])
def test_bundle_json_refuses_what_the_stdlib_refuses(text: bytes) -> None:
    from blackbox.bundle import reader

    with pytest.raises((ValueError, RecursionError)):
        json.loads(text)
    with pytest.raises(ValueError):  # one error type for the report to catch
        reader.parse_json(text)
