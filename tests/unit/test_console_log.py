"""console.log: never in the job's way (writes only queue; a thread redacts and writes), bounded on disk (the head,
then the newest output rolling through the tail files), secrets redacted across writes. Real files, no job."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from blackbox.supervisor import console_log
from blackbox.supervisor.console_log import ConsoleLog


def test_a_stuck_writer_never_holds_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a log whose redaction is stuck (a pathological line, a slow disk), and a small queue
    release = threading.Event()

    def stuck(text: str) -> str:
        release.wait(30)
        return text

    monkeypatch.setattr(console_log, "StreamRedactor", lambda: stuck)
    monkeypatch.setattr(ConsoleLog, "MAX_QUEUE", 64 * 1024)
    errors: list[str] = []
    log = ConsoleLog(str(tmp_path / "console.log"), errors.append)
    # WHEN the job writes far more than the queue holds
    for i in range(10_000):
        log.write(b"step %d loss 0.123\n" % i, 1)  # THEN every write returns (the test would hang otherwise)
    assert log.dropped_queue > 0
    release.set()
    log.close()
    text = (tmp_path / "console.log").read_text()
    # AND the log says what it could not take; what it took is in order
    assert "came faster than the log could take them; the terminal had all of it" in text
    assert text.startswith("step 0 loss") and not errors


def test_the_log_keeps_its_head_and_the_newest_output_within_its_bound(tmp_path: Path) -> None:
    log = ConsoleLog(str(tmp_path / "console.log"), lambda m: None, max_bytes=64 * 1024)
    log.write(b"# header: host, GPUs, git\n# ---\n")
    for i in range(20_000):  # ~400 KiB of output
        log.write(b"line %06d of a chatty job\n" % i, 1)
    tail = log.tail(1000)
    log.close()
    head = (tmp_path / "console.log").read_bytes()
    files = [tmp_path / "console.log", tmp_path / "console.tail.log", tmp_path / "console.tail.1.log"]
    assert sum(f.stat().st_size for f in files) <= 64 * 1024 + 1024  # the bound, and the two notes
    assert head.startswith(b"# header") and b"line 000000 " in head
    assert b"the newest output rolls through console.tail.log" in head
    assert b"bytes of output rolled out of the tail" in head
    newest = (tmp_path / "console.tail.log").read_bytes()
    assert newest.endswith(b"line 019999 of a chatty job\n")
    assert tail.endswith(b"line 019999 of a chatty job\n") and len(tail) == 1000


def test_a_secret_split_across_writes_is_redacted(tmp_path: Path) -> None:
    log = ConsoleLog(str(tmp_path / "console.log"), lambda m: None)
    token = "hf_" + "a" * 34
    log.write(b"loading with " + token[:10].encode(), 2)
    log.write(token[10:].encode() + b" now\n", 2)
    log.write(b"a 64 KiB line " + b"-" * 65536 + b"\n", 1)
    log.close()
    text = (tmp_path / "console.log").read_text()
    assert token not in text and "loading with <redacted> now" in text and "-" * 65536 in text


def test_a_full_disk_stops_the_log_not_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[str] = []
    log = ConsoleLog(str(tmp_path / "console.log"), errors.append)

    def full(fd: int, data: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(console_log, "write_all", full)
    log.write(b"one line\n")
    log.sync()
    log.write(b"another line\n")  # still returns
    log.close()
    assert errors and "No space left on device" in errors[0]
