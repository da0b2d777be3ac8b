"""The job's output path through `blackbox run`: a tee process of its own carries it, console.log's process (niced)
redacts and writes a copy. Neither a stuck console log, a stopped supervisor nor a supervisor killed with SIGKILL
can hold or break the job's output."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from blackbox.events import read_events
from tests.conftest import BLACKBOX, PROGRAMS, ROOT, TORCHRUN, job_env, wait_for

CHATTY = str(PROGRAMS / "chatty_ranks.py")


def read_until(fd: int, out: bytearray, done: object, timeout: float) -> None:
    """Read `fd` into `out` until `done(out)` holds, its end, or `timeout`."""
    deadline = time.monotonic() + timeout
    while not done(out) and time.monotonic() < deadline:  # type: ignore[operator]
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: a pty's last writer is gone
            chunk = b""
        if not chunk:
            return
        out.extend(chunk)


def expected(rank: int, lines: int) -> list[str]:
    return [f"rank {rank} line {i}" for i in range(lines)] + [f"rank {rank} done"]


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "pty"])
def test_the_job_outlives_a_supervisor_killed_with_sigkill(tmp_path: Path, terminal: bool) -> None:
    # GIVEN a 2-rank torchrun job printing a numbered line every 0.05 s per rank under `blackbox run`, whose stdout
    # is a pipe or a terminal (then the job gets a pty of its own)
    run_dir, lines = tmp_path / "run", 60
    if terminal:
        read_fd, their_out = os.openpty()
        attrs = termios.tcgetattr(their_out)
        attrs[1] &= ~termios.OPOST  # the bytes as written: no \n -> \r\n on the way to us
        termios.tcsetattr(their_out, termios.TCSANOW, attrs)
    else:
        read_fd, their_out = os.pipe()
    proc = subprocess.Popen(
        [*BLACKBOX, "run", "--run-dir", str(run_dir), "--", TORCHRUN, "--standalone", "--nproc-per-node", "2",
         CHATTY, str(lines), "0.05"],
        cwd=tmp_path, env=job_env(), stdin=subprocess.DEVNULL, stdout=their_out, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(their_out)
    out = bytearray()
    try:
        read_until(read_fd, out, lambda b: b"rank 0 line 5\n" in b and b"rank 1 line 5\n" in b, 120)
        assert b"rank 1 line 5\n" in out and b"rank 0 line 5\n" in out, bytes(out)
        launched = wait_for(lambda: [e for e in read_events(str(run_dir / "events.jsonl")) if e["event"] ==
                                     "launched"], 10, "the launched event")  # fmt: skip
        launcher = int(launched[0]["pid"])  # type: ignore[index]
        # WHEN blackbox itself is killed with SIGKILL mid-run (the OOM killer, a mistaken kill -9)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        # THEN the job runs on to its end and every line it printed reaches the original stdout, in order
        read_until(read_fd, out, lambda b: False, 120)
        got = out.decode().splitlines()
        for rank in (0, 1):
            assert [line for line in got if line.startswith(f"rank {rank} ")] == expected(rank, lines)
        # AND the launcher ends by itself, exit code 0 to whoever waits for it now (this test: a child subreaper)
        _, status = os.waitpid(launcher, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # AND console.log's process, on its own now, writes the rest of the job's output and ends (as the tee did)
        ours = [p.pid for p in psutil.Process().children() if p.name() in ("blackbox-log", "blackbox-tee")]
        assert len(ours) == 2
        for pid in ours:
            wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0], 30, f"blackbox's process {pid} to end")  # noqa: B023
        console = (run_dir / "console.log").read_text().splitlines()
        for rank in (0, 1):
            assert [line for line in console if line.startswith(f"rank {rank} ")] == expected(rank, lines)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        os.close(read_fd)


def _job_started(supervisor: int) -> bool:
    """Whether the job (`python -c ...`) runs under the supervisor yet (its forked helpers carry blackbox's argv)."""
    for child in psutil.Process(supervisor).children(recursive=True):
        try:
            if child.cmdline()[1:2] == ["-c"]:
                return True
        except psutil.Error:
            continue
    return False


def test_a_stopped_console_log_or_supervisor_never_holds_the_job(tmp_path: Path) -> None:
    # GIVEN a job that prints 42 MB as fast as it can once told to go, under `blackbox run`
    run_dir, go, lines = tmp_path / "run", tmp_path / "go", 400_000
    code = (f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            f"for i in range({lines}):\n    sys.stdout.write(f'line {{i:07d}} ' + 'x' * 90 + '\\n')\n")  # fmt: skip
    proc = subprocess.Popen([*BLACKBOX, "run", "--run-dir", str(run_dir), "--", sys.executable, "-c", code],
                            cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    stopped: list[int] = []
    try:
        log = wait_for(lambda: [p for p in psutil.Process(proc.pid).children() if p.name() == "blackbox-log"], 30,
                       "console.log's process")  # fmt: skip
        # (and the job started: a supervisor stopped before it starts the job holds it, rightly, from starting)
        wait_for(lambda: _job_started(proc.pid), 60, "the job's process")
        # WHEN console.log's process and the supervisor itself stop dead (as a redactor stuck on a pathological
        # line, or a supervisor starved of CPU, would) before the job prints
        stopped = [log[0].pid, proc.pid]  # type: ignore[index]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        go.touch()
        # THEN the job's output still all arrives, in order, at the speed of the pipe we read
        out = bytearray()
        read_until(proc.stdout.fileno(), out, lambda b: b.endswith(b"line %07d " % (lines - 1) + b"x" * 90 + b"\n"),
                   120)  # fmt: skip
        assert out.count(b"\n") == lines and out.startswith(b"line 0000000 ")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    # AND once they go on, blackbox ends as the job did, and console.log says where output is missing and how much
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert rest == b""
    console = (run_dir / "console.log").read_bytes()
    assert b"\nline 0000000 " in console
    assert b"bytes of the job's stdout are missing here: they came faster than the log could take them" in console
    assert b"came faster than the log could take them; the terminal had all of it" in console


@pytest.mark.timeout(180)
def test_a_job_blocked_on_its_unread_output_is_not_a_stall(tmp_path: Path) -> None:
    # GIVEN blackbox's stdout piped to a reader that stops (a pager, a log shipper) for 4 stall timeouts, while rank 0
    # prints 8 MB and rank 1 waits for it at a barrier
    run_dir, lines = tmp_path / "run", 80_000
    cmd = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", "5", "--", TORCHRUN, "--standalone",
           "--nproc-per-node", "2", str(PROGRAMS / "unread_output.py"), str(lines)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stderr is not None and proc.stdout is not None
        err = bytearray()
        read_until(proc.stderr.fileno(), err, lambda e: False, 20)  # stderr is read; stdout is not, for 20 s
        # THEN blackbox saw the job blocked on its output, said so once, and did not call it a stall
        events = read_events(str(run_dir / "events.jsonl"))
        blocked = [e for e in events if e.get("event") == "output_blocked"]
        assert [e["rank"] for e in blocked] == [0], (blocked, err.decode()[-2000:])
        assert not [e for e in events if e.get("event") in ("stall", "bundle")], err.decode()[-2000:]
        # AND once read, every line arrives and the job ends by itself, exit 0
        out, rest = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = (bytes(err) + rest).decode()
    assert proc.returncode == 0, text[-3000:]
    assert text.count("the job is blocked on its output: nothing reads blackbox's stdout or stderr") == 1, text
    got = out.decode().splitlines()
    assert [g[:13] for g in got if g.startswith("line ")] == [f"line {i:08d}" for i in range(lines)]
    assert {"rank 0 done", "rank 1 done"} <= set(got)
    assert not (run_dir / "bundles").exists() or not list((run_dir / "bundles").iterdir())


F_SETPIPE_SZ = 1031


@pytest.mark.timeout(150)
def test_a_stderr_nobody_reads_never_stops_the_watch(tmp_path: Path) -> None:
    # GIVEN blackbox's stderr a pipe nobody reads, already full (a log shipper that died), its stdout read, and a job
    # whose rank 1 hangs reading its data while the job's own stderr goes elsewhere (so its output never blocks)
    import fcntl

    read_end, stderr = os.pipe()
    fcntl.fcntl(stderr, F_SETPIPE_SZ, 4096)
    os.set_blocking(stderr, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(stderr, b"x" * 4096)
    os.set_blocking(stderr, True)
    run_dir = tmp_path / "run"
    job = " ".join([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(ROOT / "scripts" / "scenarios" / "train.py"),
                    "data-hang", "1"])  # fmt: skip
    cmd = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", "3", "--poll-interval", "0.5",
           "--kill-grace", "3", "--", "sh", "-c", f"exec 2>/dev/null; exec {job}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=job_env(), stdout=subprocess.DEVNULL, stderr=stderr,
                            start_new_session=True)  # fmt: skip
    os.close(stderr)
    try:
        # WHEN the hang comes: THEN the watch still catches it, bundles it and ends the job, exit 86, though not one
        # of its words could be written
        code = proc.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(read_end)
    assert code == 86
    assert len(list((run_dir / "bundles").glob("*.tar.gz"))) == 1
    # AND what it would have said is kept in events.jsonl, in order
    unsaid = [e["line"] for e in read_events(str(run_dir / "events.jsonl")) if e.get("event") == "unsaid"]
    assert any(line.startswith("stall: ") for line in unsaid), unsaid
    assert any(line.startswith("evidence bundle: ") for line in unsaid), unsaid
