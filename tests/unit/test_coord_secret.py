"""The coordination store answers only to the job: what steers the other nodes is signed with the job's secret,
and a value that is unsigned, wrongly signed, tampered with or moved to another key is not believed."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox.coord import store_process as sp
from blackbox.coord.client import secret_source


def helper(secret: bytes | None, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> sp.StoreProcess:
    monkeypatch.setattr(sp, "emit", lambda event, **fields: events.append({"ev": event, **fields}))
    proc = sp.StoreProcess({"node": "0", "poll_interval": 1, "silent_after": 10})
    proc.secret = secret
    return proc


def test_a_signed_value_reads_back_and_every_forgery_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    ours = helper(b"s3cret", events, monkeypatch)
    body = json.dumps({"kind": "stall", "origin": "1"})
    sealed = ours.seal("incident/4", body)
    assert ours.unseal("incident/4", sealed.encode()) == body
    assert events == []
    # GIVEN values written by someone without the secret, or replayed from another key
    forged = {
        "unsigned": body,
        "wrongly signed": json.dumps({"body": body, "mac": sp.mac(b"guess", "incident/4", body)}),
        "tampered": json.dumps({"body": body.replace("stall", "crash"), "mac": json.loads(sealed)["mac"]}),
        "moved": ours.seal("incident/3", body),
        "not json": "\x00\xff garbage",
    }
    # THEN none is believed, and each says why once
    for raw in forged.values():
        assert ours.unseal("incident/4", raw.encode()) is None
    assert [e["why"] for e in events] == ["unsigned", "wrongly signed", "wrongly signed", "wrongly signed", "unsigned"]
    assert all(e == {"ev": "rejected", "key": "incident/4", "why": e["why"]} for e in events)
    assert all("s3cret" not in json.dumps(e) for e in events)


def test_without_a_secret_values_are_plain_json_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    plain = helper(None, events, monkeypatch)
    assert plain.seal("silent", "{}") == "{}"
    assert plain.unseal("silent", b'{"1": {}}') == '{"1": {}}'
    assert events == []


def test_the_secret_comes_from_the_environment_before_any_file(tmp_path: Path) -> None:
    assert sp.job_secret({"secret_file": str(tmp_path / "absent")}, {sp.SECRET_ENV: "abc"}) == b"abc"
    assert sp.job_secret({}, {}) is None
    named = tmp_path / "secret"
    named.write_text("from-a-file\n")
    assert sp.job_secret({"secret_file": str(named)}, {}) == b"from-a-file"


def test_the_first_node_creates_the_secret_file_private_and_whole_and_the_others_wait_for_it(tmp_path: Path) -> None:
    path = tmp_path / "shared" / ".blackbox" / "coord-secret-77"
    got: list[bytes | None] = []
    # GIVEN node 1 asking first: it waits for the file rather than making one of its own
    waiter = threading.Thread(target=lambda: got.append(sp.job_secret({"secret_file": str(path)}, {})))
    waiter.start()
    time.sleep(0.5)
    assert not path.exists() and waiter.is_alive()
    # WHEN node 0 creates it
    secret = sp.job_secret({"secret_file": str(path), "secret_create": True}, {})
    waiter.join(10)
    # THEN both hold the same 64 hex characters, in a file only the owner may read
    assert secret is not None and len(secret) == 64 and got == [secret]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # and a second creation (a requeued first task) keeps the file the other nodes already read
    assert sp.job_secret({"secret_file": str(path), "secret_create": True}, {}) == secret
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_secret_file_that_never_comes_is_an_error_not_a_hang(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        sp.job_secret({"secret_file": str(tmp_path / "never"), "secret_wait_s": 0.3}, {})


def test_where_the_secret_is_read_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert secret_source("", {}) == ("", False)
    assert secret_source("", {sp.SECRET_ENV: "x", "SLURM_JOB_ID": "5", "SLURM_SUBMIT_DIR": "/s"}) == ("", False)
    assert secret_source("k8s/secret", {}) == (os.path.join(str(tmp_path), "k8s/secret"), False)
    slurm = secret_source("", {"SLURM_JOB_ID": "5", "SLURM_SUBMIT_DIR": "/shared/run"})
    assert slurm == ("/shared/run/.blackbox/coord-secret-5", True)


class MemoryStore:
    """The few calls of torch's TCPStore the helper makes, over a dict: what the job's nodes and a forger write."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def add(self, key: str, n: int) -> int:
        value = int(self.data.get(key, b"0")) + n
        self.data[key] = str(value).encode()
        return value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


def test_a_forged_beat_keeps_no_node_alive_and_a_forged_summary_or_host_is_not_believed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the hosting node's helper with the job's secret, and node 1 on the roster, its beat and host signed
    events: list[dict[str, Any]] = []
    host = helper(b"s3cret", events, monkeypatch)
    host.cfg.update(hosting=True, nnodes=2, hostname="node0")
    host.silent_after = 0.3
    store = host.store = MemoryStore()
    store.set("motion", host.seal("motion", "[]"))
    one = helper(b"s3cret", events, monkeypatch)
    one.me, one.store = "1", store
    for name in ("0", "1"):
        store.set(f"roster/{store.add('roster', 1)}", name)
    one.summary = {"ranks": {"2": {}, "3": {}}, "moved_s": 0.0}
    one.cfg.update(hostname="node1", nnodes=2, hosting=False)
    one.tick()
    host.watch()
    assert host.peers["1"]["beat"] == "1 0.0" and not [e for e in events if e["ev"] == "rejected"], events
    # WHEN node 1 falls silent while someone without the secret writes a new beat every poll (its ranks moving), a
    # summary and a host for it
    store.set("hosts/1", json.dumps({"host": "evil", "ranks": [2, 3]}))
    deadline = time.monotonic() + 5
    forged = 0
    while "1" not in host.silent and time.monotonic() < deadline:
        forged += 1
        store.set("beat/1", f"{forged} 0.0")
        store.set("summary/1", json.dumps({"ranks": {"2": {"step": 999}}}))
        host.watch()
        host.silent = json.loads(json.loads(store.data["silent"])["body"]) if "silent" in store.data else {}
        time.sleep(0.1)
    host.learn_hosts()
    # THEN node 1 is silent all the same (its forged beats never believed), its forged summary is not the one the
    # verdict carries, its forged host is not learned, and each forgery is said as rejected
    assert "1" in host.silent and host.silent["1"]["summary"] is None, host.silent
    assert "1" not in host.hosts, host.hosts
    rejected = {(e["key"], e["why"]) for e in events if e["ev"] == "rejected"}
    assert {("beat/1", "unsigned"), ("summary/1", "unsigned"), ("hosts/1", "unsigned")} <= rejected, rejected
