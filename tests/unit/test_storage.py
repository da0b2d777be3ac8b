"""Shared storage without a server: URLs and what may be shown of them, the layout under a prefix, incident records
as untrusted input, and reading a prefix on a filesystem (fsspec's local backend) — which bundles a URL names and
the limits that hold before anything is read."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from blackbox.config import load_run_config
from blackbox.errors import BlackboxError
from blackbox.storage import layout as SL
from blackbox.storage import remote
from blackbox.storage.urls import add_url_secrets, describe_error, display, open_fs, scrub

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"


def test_upload_option_takes_storage_urls_and_paths() -> None:
    assert load_run_config({"upload": "s3://bucket/team/"}, {}).upload == "s3://bucket/team"
    assert load_run_config({}, {"BLACKBOX_UPLOAD": "gs://b/p"}).upload == "gs://b/p"
    assert load_run_config({"upload": "shared/bb"}, {}).upload == os.path.abspath("shared/bb")
    for bad in ("http://host/x", "s3://", "ftp://x/y"):
        with pytest.raises(BlackboxError, match="must be a storage URL"):
            load_run_config({"upload": bad}, {})
    c = load_run_config({"metrics_port": "9400"}, {})
    assert (c.metrics_port, c.metrics_addr, c.upload_timeout) == (9400, "127.0.0.1", 60.0)
    with pytest.raises(BlackboxError, match="--metrics-port"):
        load_run_config({"metrics_port": "70000"}, {})


def test_a_url_is_shown_without_its_credentials() -> None:
    url = "az://user:pa55word-xyz@container/prefix?sv=2024&sig=AbCdEf0123456789"
    assert display(url) == "az://container/prefix"
    add_url_secrets(url)
    from blackbox.redact import redact_text

    assert "pa55word-xyz" not in redact_text("failed: pa55word-xyz") and "AbCdEf0123456789" not in redact_text(
        "x AbCdEf0123456789 y")  # fmt: skip


def test_backend_errors_are_scrubbed() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value-abcdef", "AWS_SESSION_TOKEN": "sess-token-0123456789"}
    text = (
        "An error occurred (403) for https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeef1234&"
        "X-Amz-Credential=AKIAEXAMPLE/2026 with s3cr3t-value-abcdef and sess-token-0123456789\nsecond line"
    )
    out = scrub(text, env)
    for secret in ("s3cr3t-value-abcdef", "sess-token-0123456789", "deadbeef1234", "AKIAEXAMPLE"):
        assert secret not in out, out
    assert "\n" not in out
    assert describe_error(PermissionError("Access Denied.")).startswith("access refused")
    assert "(no such bucket" in describe_error(FileNotFoundError("The specified bucket does not exist"))
    connect = describe_error(OSError('Could not connect to the endpoint URL: "http://h:9/bucket/run/node/b.tar.gz"'))
    assert connect.endswith('"http://h:9"'), connect


def test_a_missing_backend_is_one_sentence_with_its_extra() -> None:
    pytest.importorskip("fsspec")
    try:
        import adlfs  # noqa: F401

        pytest.skip("adlfs is installed here")
    except ImportError:
        pass
    with pytest.raises(BlackboxError) as err:
        open_fs("az://container/prefix")
    assert "Azure Blob Storage backend (adlfs), which is not installed" in err.value.message
    assert err.value.hint == "pip install 'torch-blackbox[azure]'"


def test_layout_segments_never_climb_out_of_the_prefix() -> None:
    assert SL.segment("../../etc") == "_.._etc" and "/" not in SL.segment("a/b")
    assert SL.node_dir("gpu-017.cluster", None) == "gpu-017.cluster"
    assert SL.node_dir("host", 3) == "node3-host"
    key = SL.bundle_key("20261201-120000-ab12cd", "node1-host", "blackbox-x.tar.gz")
    assert key == "20261201-120000-ab12cd/node1-host/blackbox-x.tar.gz"
    assert SL.record_key(key) == "20261201-120000-ab12cd/node1-host/blackbox-x.incident.json"
    assert SL.fix_key(SL.record_key(key), "2026-12-01T12:00:00") == (
        "20261201-120000-ab12cd/node1-host/blackbox-x.fix-2026-12-01T12_00_00.json")  # fmt: skip


def record(**kw: object) -> bytes:
    base = {"schema_version": 1, "id": "abcdef012345", "run": "r1", "node": "n", "host": "h", "time": "2026-12-01",
            "fingerprint": "f" * 20, "verdict": {"category": "hang.data_loading", "suspect_ranks": [3]},
            "bundle": "s3://b/p/r1/n/x.tar.gz", "sha256": "ab" * 32}  # fmt: skip
    base.update(kw)
    return json.dumps(base).encode()


def test_records_are_untrusted_input() -> None:
    good = SL.parse_record(record(), "where")
    assert good is not None and good["category"] == "hang.data_loading" and good["suspects"] == [3]
    assert SL.parse_record(record(schema_version=2), "w") is None  # a newer format: not guessed at
    assert SL.parse_record(b"[" * 100_000, "w") is None
    assert SL.parse_record(b" " * (SL.MAX_RECORD_BYTES + 1), "w") is None
    assert SL.parse_record(record(fingerprint=None), "w") is None
    odd = SL.parse_record(record(verdict={"suspect_ranks": ["x", True, 2], "category": ["?"]}, run={"a": 1}), "w")
    assert odd is not None and odd["suspects"] == [2] and odd["category"] == "['?']" and odd["run"] == "{'a': 1}"
    assert SL.parse_fix(b'{"status": "fixed", "fix_commit": "abc"}') == {
        "status": "fixed",
        "fix_commit": "abc",
        "fix_config_name": None,
        "note": None,
        "created": None,
        "by": None,
    }
    assert SL.parse_fix(b'{"status": "pwned"}') is None


# --- a prefix on a filesystem ---------------------------------------------------------------------------------
def lay_out(prefix: Path, run: str, node: str, golden: str, mtime: float) -> Path:
    target = prefix / run / node / f"blackbox-{run}-{node}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(GOLDEN / golden, target)
    os.utime(target, (mtime, mtime))
    return target


def test_a_prefix_names_its_newest_run_and_a_run_names_its_bundles(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    prefix = tmp_path / "shared"
    lay_out(prefix, "run-old", "node0-h", "raise.tar.gz", 1_000_000)
    new = lay_out(prefix, "run-new", "node0-h", "data-hang.tar.gz", 2_000_000)
    assert remote.is_remote(str(prefix)) and remote.is_remote(str(prefix / "run-new"))
    assert not remote.is_remote(str(new.parent)) and not remote.is_remote(str(GOLDEN))
    (newest,) = remote.read_remote(str(prefix))
    assert newest.path == str(new) and newest.manifest.get("schema_version")
    (old,) = remote.read_remote(f"file://{prefix}/run-old")
    assert old.path == f"file://{prefix}/run-old/node0-h/blackbox-run-old-node0-h.tar.gz"
    assert list(old.digests) == [old.path]  # indexed under its URL
    (tmp_path / "empty" / "r").mkdir(parents=True)
    with pytest.raises(BlackboxError, match="holds no bundle"):
        remote.read_remote(str(tmp_path / "empty"))
    with pytest.raises(BlackboxError, match=r"Cannot list .* not found"):
        remote.read_remote(f"file://{tmp_path}/nothing-here")


def test_limits_hold_before_a_remote_bundle_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    prefix = tmp_path / "shared"
    lay_out(prefix, "r", "node0-h", "raise.tar.gz", 1_000_000)
    lay_out(prefix, "r", "node1-h", "raise.tar.gz", 1_000_000)
    monkeypatch.setattr(remote, "MAX_BUNDLES", 1)
    with pytest.raises(BlackboxError, match="more than 1 bundles"):
        remote.read_remote(str(prefix / "r"))
    monkeypatch.setattr(remote, "MAX_BUNDLES", 1024)
    monkeypatch.setattr(remote, "MAX_TOTAL_BYTES", 100)  # each bundle's size is checked before its first byte
    with pytest.raises(BlackboxError, match="over the 100 byte limit; refusing to read it"):
        remote.read_remote(str(prefix / "r"))
    store = remote.Store(str(prefix))
    path = next(iter(store.listing(store.root)))
    out = tmp_path / "copy"
    with pytest.raises(BlackboxError, match="over the 100 byte limit"):  # a listing that lied: the read stops
        store.fetch(path, 10, 100, str(out))
    monkeypatch.setattr(remote, "MAX_LISTED", 1)
    with pytest.raises(BlackboxError, match="more than 1 objects"):
        remote.read_remote(str(prefix))


def test_records_under_a_prefix_newest_first_with_their_fix(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    node = tmp_path / "p" / "r1" / "node0-h"
    node.mkdir(parents=True)
    (node / "a.incident.json").write_bytes(record(id="aaaa00000000", time="2026-12-01T10:00:00"))
    (node / "b.incident.json").write_bytes(record(id="bbbb00000000", time="2026-12-02T10:00:00", fingerprint="g" * 20))
    (node / "c.incident.json").write_bytes(b"not json")
    (node / "a.fix-2026-12-03.json").write_bytes(b'{"status": "fixed", "fix_commit": "c0ffee"}')
    store = remote.Store(str(tmp_path / "p"))
    found = remote.records(store)
    assert [r["id"] for r in found] == ["bbbb00000000", "aaaa00000000"]
    assert found[1]["fix"]["fix_commit"] == "c0ffee" and found[0]["fix"] is None
    seen = remote.seen_before(store, "f" * 20, "x", None, None, None)
    assert [s["id"] for s in seen] == ["aaaa00000000"] and seen[0]["match"] == "same"
    assert "fixed in c0ffee" in remote.describe_remote(seen[0])
    similar = remote.seen_before(store, "z" * 20, "hang.data_loading", None, None, None)
    assert {s["match"] for s in similar} == {"similar"}
    path, rec = remote.find_record(store, "bbbb")
    assert rec["id"] == "bbbb00000000" and path.endswith("b.incident.json")
    url = remote.link_fix(store, path, {"status": "verified", "fix_commit": "d00d", "note": None})
    assert url.startswith(str(tmp_path / "p")) and remote.find_record(store, "bbbb")[1]["fix"]["status"] == "verified"
    with pytest.raises(BlackboxError, match="no incident `cccc`"):
        remote.find_record(store, "cccc")


def test_the_alarms_carry_the_uploaded_bundles_url() -> None:
    from blackbox.alerts import incident_env, payload

    url = "s3://team/bb/r1/node0-h/b.tar.gz"
    assert incident_env("/local/b.tar.gz", None, "r1", "h", "stall", url)["BLACKBOX_BUNDLE_URL"] == url
    body = payload("/local/b.tar.gz", None, "r1", "h", "stall", url)
    assert body["bundle_url"] == url and body["bundle"] == "/local/b.tar.gz" and body["upload_error"] is None
    failed = payload("/local/b.tar.gz", None, "r1", "h", "stall", None, "access refused")
    assert failed["bundle_url"] is None and failed["upload_error"] == "access refused"
    assert "bundle_url" not in payload("/local/b.tar.gz", None, "r1", "h", "stall")  # without --upload: as before


def test_an_incident_of_the_same_run_is_not_seen_before(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    for run, name in (("r1", "a"), ("r2", "b")):
        node = tmp_path / "p" / run / "node0-h"
        node.mkdir(parents=True)
        (node / f"{name}.incident.json").write_bytes(record(id=f"{name * 4}00000000", run=run, sha256=name * 64))
    store = remote.Store(str(tmp_path / "p"))
    assert {s["id"] for s in remote.seen_before(store, "f" * 20, "x", None, None, None)} == {
        "aaaa00000000",
        "bbbb00000000",
    }
    assert [s["id"] for s in remote.seen_before(store, "f" * 20, "x", None, None, None, run="r2")] == ["aaaa00000000"]


def test_another_projects_record_of_the_same_frame_is_not_seen_before(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    node = tmp_path / "p" / "r1" / "node0-h"
    node.mkdir(parents=True)
    for name, path in (("a", "train.py"), ("b", "scripts/scenarios/train.py"), ("c", None)):
        (node / f"{name}.incident.json").write_bytes(record(id=f"{name * 4}00000000", sha256=name * 64, top_path=path))
    store = remote.Store(str(tmp_path / "p"))
    seen = remote.seen_before(store, "f" * 20, "x", None, None, None, top_path="scripts/scenarios/train.py")
    assert sorted(s["id"] for s in seen) == ["bbbb00000000", "cccc00000000"]
    assert len(remote.seen_before(store, "f" * 20, "x", None, None, None)) == 3


def test_an_attempt_that_outlives_the_deadline_is_given_up_with_what_is_known() -> None:
    import threading

    from blackbox.storage.push import within

    # GIVEN an attempt that a backend's own retries keep busy past the deadline
    release = threading.Event()

    def retrying() -> None:
        release.wait(30)

    with pytest.raises(TimeoutError):
        within(retrying, 0.2)
    release.set()
    # AND one that fails, and one that succeeds, within it

    def refused() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionRefusedError):
        within(refused, 5)
    done: list[int] = []
    within(lambda: done.append(1), 5)
    assert done == [1]


def test_the_helper_gives_up_at_the_callers_deadline_which_its_own_start_up_has_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("s3fs")
    import socket

    from blackbox.storage.push import push

    # GIVEN a storage nobody answers for (a refused port: the backend retries on its own), a 30 s --upload-timeout,
    # and a caller whose deadline is 1 s away (the rest spent starting the helper on a loaded machine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-0123456789")
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"x" * 100)
    started = time.monotonic()
    answer = push({"url": "s3://bucket/p", "key": "r/n/b.tar.gz", "bundle": str(bundle), "timeout": 30.0,
                   "deadline": started + 1.0, "record": {"fingerprint": "", "verdict": {}}})  # fmt: skip
    # THEN it answers by the caller's deadline, not 30 s after its own start, with the attempts it made
    assert time.monotonic() - started < 4.0
    assert answer["ok"] is False and answer["attempts"] >= 1 and answer["error"]
