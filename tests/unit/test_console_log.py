"""console.log: never in the job's way (writes only queue; a thread redacts and writes), bounded on disk (the head,
then the newest output rolling through the tail files), secrets redacted across writes; its own process, which
goes on when the supervisor is gone and is cut short, with a note, when it cannot catch up. Real files, no job."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox.supervisor import console_log
from blackbox.supervisor.console_log import ConsoleLog, ConsoleLogProcess
from blackbox.supervisor.tee import GAP, GAP_INFO, frames
from tests.conftest import wait_for


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


def test_a_private_key_on_one_stream_never_swallows_the_others_lines(tmp_path: Path) -> None:
    log = ConsoleLog(str(tmp_path / "console.log"), lambda m: None)
    body = "MIIEpAIBAAKCAQEA" + "x" * 48
    log.write(b"-----BEGIN RSA PRIVATE KEY-----\n", 1)
    log.write(b"rank 1: Watchdog caught collective operation timeout\n", 2)  # between the key's lines
    log.write(body.encode() + b"\n" + body.encode() + b"\n-----END RSA PRIVATE KEY-----\n", 1)
    log.write(b"step 12 loss 0.5\n", 1)
    log.close()
    text = (tmp_path / "console.log").read_text()
    assert body not in text and "-----END RSA PRIVATE KEY-----" in text, text
    assert "rank 1: Watchdog caught collective operation timeout" in text and "step 12 loss 0.5" in text, text


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


# --- console.log's own process ----------------------------------------------------------------------------------
def start_tee_side(log: ConsoleLogProcess) -> int:
    """What the tee holds: the write end of the log's copy (handed over, as the supervisor does)."""
    fd = os.dup(log.copy_fd())
    log.handed_over()
    return fd


def test_the_log_process_writes_the_header_then_the_job_output_and_says_where_a_copy_lost_some(
    tmp_path: Path,
) -> None:
    # GIVEN console.log's process, a header, and the job's output as the tee sends it (a gap in the middle)
    errors: list[str] = []
    log = ConsoleLogProcess(str(tmp_path / "console.log"), errors.append)
    log.write(b"# header\n# ---\n")
    copy = start_tee_side(log)
    token = "hf_" + "b" * 34
    os.write(copy, frames(1, b"step 1 loss 0.5 with " + token[:9].encode()))
    os.write(copy, frames(GAP, GAP_INFO.pack(1, 12345)))
    os.write(copy, frames(2, b"a warning\n") + frames(1, b"step 9 " + token.encode() + b"\n"))
    # WHEN the supervisor reads its tail (a collection), then the output ends and the run closes
    log.sync()
    tail = log.tail(10_000)
    os.close(copy)
    log.close()
    # THEN everything is there, in order, redacted, with the gap said where it happened
    text = (tmp_path / "console.log").read_text()
    assert text.startswith("# header\n# ---\nstep 1 loss 0.5 with hf_bbbbbb\n# blackbox: 12345 bytes of the job's "
                           "stdout are missing here")  # fmt: skip
    assert "a warning\nstep 9 <redacted>\n" in text and token not in text and not errors
    assert b"# blackbox: 12345 bytes" in tail
    with pytest.raises(ChildProcessError):  # ended, and reaped by close
        os.waitpid(log.pid, 0)


def test_a_log_that_cannot_catch_up_is_cut_short_at_the_end_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN console.log's process whose redaction is stuck, and a short wait at the end
    monkeypatch.setattr(console_log, "StreamRedactor", lambda: lambda text: time.sleep(5) or text)
    monkeypatch.setattr(console_log, "CLOSE_WAIT", 3.0)
    said: list[str] = []
    log = ConsoleLogProcess(str(tmp_path / "console.log"), lambda m: None, say=said.append)
    copy = start_tee_side(log)
    os.write(copy, frames(1, b"first line\n") + frames(1, b"second line\n" * 100))
    os.close(copy)
    # WHEN the run ends
    t0 = time.monotonic()
    log.close()
    # THEN blackbox waited a bounded time, said why, and the log says what it could not write
    assert time.monotonic() - t0 < 15
    assert said and "writing the rest of console.log" in said[0]
    wait_for(lambda: b"were still to be written when blackbox ended" in (tmp_path / "console.log").read_bytes(),
             60, "the note")  # fmt: skip


def test_the_log_process_goes_on_by_itself_when_the_supervisor_is_gone(tmp_path: Path) -> None:
    # GIVEN console.log's process with output still coming from the tee
    log = ConsoleLogProcess(str(tmp_path / "console.log"), lambda m: None)
    copy = start_tee_side(log)
    os.write(copy, frames(1, b"before\n"))
    # WHEN the supervisor goes away without a word (SIGKILL: its end of the commands pipe just closes)
    os.close(log._ctl_w)
    # THEN the log still takes the job's output to its end, then ends by itself
    os.write(copy, frames(1, b"after\n"))
    os.close(copy)
    wait_for(lambda: os.waitpid(log.pid, os.WNOHANG)[0], 30, "the log's process to end")
    assert (tmp_path / "console.log").read_text() == "before\nafter\n"


def test_a_key_printed_on_stderr_while_stdout_interleaves_keeps_its_own_state(tmp_path: Path) -> None:
    # GIVEN a job that prints a private key on stderr line by line while stdout goes on between its lines
    log = ConsoleLog(str(tmp_path / "console.log"), lambda m: None)
    body = [f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{i:04d}xyz" for i in range(6)]
    log.write(b"-----BEGIN PRIVATE KEY-----\n", 2)
    for i, line in enumerate(body):
        log.write(b"step %d loss 0.5\n" % i, 1)
        log.write(line.encode() + b"\n", 2)
    log.write(b"-----END PRIVATE KEY-----\n", 2)
    log.write(b"step 6 loss 0.4\n", 1)
    log.close()
    text = (tmp_path / "console.log").read_text()
    # THEN the key's body is gone, its markers stay, and every stdout line is there
    assert not [line for line in body if line in text], text
    assert "-----BEGIN PRIVATE KEY-----" in text and "-----END PRIVATE KEY-----" in text
    assert all(f"step {i} loss" in text for i in range(7))
