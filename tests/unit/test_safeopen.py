"""Reading a job's run directory as a more privileged user: no symlink is followed, only regular files of the
job's user are read, and a dump request never writes through a link planted in place of a heartbeat."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.heartbeat_reader import HeartbeatTable
from blackbox.safeopen import RunDir, UnsafeFile, read_file

OTHER_UID = 4242


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "root-only"
    path.write_text("ROOT-ONLY-CONTENT")
    path.chmod(0o600)
    return path


def test_links_fifos_and_escapes_are_refused(tmp_path: Path, secret: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks" / "0").mkdir(parents=True)
    (run / "console.log").symlink_to(secret)
    (run / "ranks" / "0" / "metrics.json").write_text("{}")
    (run / "ranks" / "1").symlink_to(secret.parent)  # a directory link: ranks/1/root-only
    os.mkfifo(run / "fifo")
    rd = RunDir(str(run), os.getuid())
    for rel in ("console.log", "ranks/1/root-only", "fifo", "../root-only", "ranks/0/../../root-only"):
        with pytest.raises(OSError):
            rd.read(rel, 100)
    assert rd.read("ranks/0/metrics.json", 100) == b"{}"
    assert rd.list("ranks/1") == [] and rd.list("ranks") == ["0", "1"]
    with pytest.raises(OSError):
        read_file(str(run / "console.log"), None, 100)


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """A directory the other user can reach (pytest's own tmp_path is root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="bb-safeopen-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_files_of_another_user_are_refused(user_dir: Path, secret: Path) -> None:
    run = user_dir / "run"
    run.mkdir()
    (run / "events.jsonl").write_text("{}\n")
    # GIVEN a run directory owned by the job's user, holding a world-readable file that is not theirs
    os.chown(run, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeFile, match="not by the job's user"):
        RunDir(str(run), OTHER_UID).read("events.jsonl", 100)
    os.chown(run / "events.jsonl", OTHER_UID, OTHER_UID)
    assert RunDir(str(run), OTHER_UID).read("events.jsonl", 100) == b"{}\n"
    # AND a path the job named outside it (a torchelastic error file) is read only when it is the job's own
    with pytest.raises(OSError):
        read_file(str(secret), OTHER_UID, 100)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_files_are_opened_as_the_job_user(user_dir: Path) -> None:
    # GIVEN a file of the job's user that the job's user cannot read (root could)
    run = user_dir / "run"
    run.mkdir()
    os.chown(run, OTHER_UID, OTHER_UID)
    locked = run / "locked.json"
    locked.write_text("{}")
    os.chown(locked, OTHER_UID, OTHER_UID)
    locked.chmod(0o000)
    assert locked.read_text() == "{}"  # root reads it
    # THEN blackbox, reading for that user, does not
    with pytest.raises(PermissionError):
        RunDir(str(run), OTHER_UID).read("locked.json", 100)
    assert locked.read_text() == "{}"  # and this thread is root again


def test_a_dump_request_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    (ranks / "0").mkdir(parents=True)
    target = tmp_path / "target"
    target.write_bytes(b"\0" * 4096)
    (ranks / "0" / "heartbeat").symlink_to(target)
    table = HeartbeatTable(str(ranks), lambda p, m: None, os.getuid())
    with pytest.raises(OSError):
        table.request_dump(0)
    assert target.read_bytes() == b"\0" * 4096
    assert table.read() == []
