"""What a poll loop checks (blackbox/collect/polled.py) on real processes with real py-spy: the loop's `while` line
and the strings that name what it waits for — a marker that does not exist, a lock file and the process that holds
it open — and never a secret its frames hold, nor a `while` that does not enclose where the loop is; and the report's
words for it (analyze.states.describe_polls), read from an untrusted bundle."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blackbox.adapters import pyspy
from blackbox.analyze.states import describe_polls
from blackbox.collect import polled
from blackbox.redact import REDACTED

pytestmark = pytest.mark.timeout(60)

SECRET = "hf_" + "Zq8Lm2Xw4Vt6Rn0Pk3Jh5Gf7Ds9Ab1Cy"
HOLDER = "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(120)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def loop(tmp_path: Path, started: list[subprocess.Popen[bytes]], body: str) -> int:
    """A Python process running `body` (a script file of its own, as a job's is), once it is in its loop."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdin=subprocess.DEVNULL, cwd=tmp_path)
    started.append(p)
    time.sleep(1.5)
    return p.pid


def checked(pid: int) -> dict[str, Any]:
    result = pyspy.dump(pid, locals=True)
    assert result.threads is not None, result.error
    record = polled.checks(pid, result.threads)
    assert record is not None
    return record


def test_a_marker_loop_names_its_line_and_the_file_that_does_not_exist(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # GIVEN a loop waiting for a marker file, its frame also holding a token and other strings
    pid = loop(
        tmp_path,
        started,
        f"""
        import os, sys, time
        def wait_for_stage(work):
            token = "{SECRET}"
            label = "stage one"
            path = os.path.join(work, "stage1.done")
            while not os.path.exists(path):
                time.sleep(0.1)
        wait_for_stage(sys.argv[1])
    """,
    )
    # WHEN its checks are read
    record = checked(pid)
    # THEN the loop's line, and the path it checks, which does not exist; nothing else it holds
    assert record == {"loop": {"frame": "wait_for_stage (job.py:8)", "line": "while not os.path.exists(path):"},
                      "checks": [{"name": "path", "value": f"{tmp_path}/stage1.done",
                                  "frame": "wait_for_stage (job.py:8)", "exists": False}]}  # fmt: skip
    assert SECRET not in str(record)
    assert describe_polls(record) == f"`while not os.path.exists(path)`; path = {tmp_path}/stage1.done, no such file"


def test_a_secret_the_loop_checks_is_redacted(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    # GIVEN a loop whose condition names a token (a store or an endpoint polled with it)
    pid = loop(
        tmp_path,
        started,
        f"""
        import time
        def ready(token):
            return False
        def wait():
            api_token = "{SECRET}"
            while not ready(api_token):
                time.sleep(0.1)
        wait()
    """,
    )
    # THEN the line is there, the token's value never is
    record = checked(pid)
    assert record["loop"]["line"] == "while not ready(api_token):"
    assert [(c["name"], c["value"]) for c in record["checks"]] == [("api_token", REDACTED)]
    assert SECRET not in str(record)


def test_a_held_lock_names_its_holder_and_not_an_earlier_loop(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # GIVEN a `filelock` held by another process, waited for after an earlier loop that has ended
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)])
    started.append(holder)
    pid = loop(
        tmp_path,
        started,
        """
        import os, sys, time
        from filelock import FileLock
        def load(work):
            path = os.path.join(work, "model.lock")
            while not os.path.exists(path):
                time.sleep(0.05)
            FileLock(path).acquire()
        load(sys.argv[1])
    """,
    )
    record = checked(pid)
    # THEN the loop's line is not the ended loop above (the lock's loop is filelock's own `while True`), and the lock
    # file is named with the process that holds it
    assert record["loop"] is None, record
    (check,) = record["checks"]
    assert (check["name"], check["value"], check["exists"]) == ("lock_filename", str(lock), True), check
    assert [h["pid"] for h in check["held_by"]] == [holder.pid], check
    said = describe_polls(record)
    assert said.startswith(f"lock_filename = {lock}, held open by `{sys.executable} -c import fcntl, sys, time; f = ")
    assert said.endswith(f"` (pid {holder.pid})") and "\n" not in said, said


def test_a_source_file_gone_leaves_the_line_out(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    # GIVEN a loop whose script was removed since it started (a job launched from a temporary copy)
    pid = loop(
        tmp_path,
        started,
        """
        import os, sys, time
        os.unlink(__file__)
        key = "blackbox/never-set"
        while not os.path.exists(os.path.join(sys.argv[1], key)):
            time.sleep(0.1)
    """,
    )
    # THEN there is no line, and a key that is no path in its view (no such folder) is not taken
    assert polled.checks(pid, pyspy.dump(pid, locals=True).threads) is None


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"loop": "x", "checks": "y"},
        {"checks": [{"value": 3}, "z", {}]},
        {"loop": {"line": 7}, "checks": [{"value": "v", "held_by": [{"pid": "1"}, 5]}]},
    ],
)
def test_the_words_take_an_untrusted_record(bad: Any) -> None:
    # GIVEN a bundle's `polls` record that does not fit; THEN what fits is said, the rest left out, nothing raised
    said = describe_polls(bad)
    assert said in ("", "`7`; ? = v")


def test_an_existing_file_no_one_holds_is_said() -> None:
    # a soft lock (a file that exists while held) left behind by a process that died: no holder
    record = {"loop": None, "checks": [{"name": "lock", "value": "/x/.lock", "exists": True, "held_by": []}]}
    assert describe_polls(record) == "lock = /x/.lock, which no process holds open"


def test_the_loop_is_the_while_around_the_line(tmp_path: Path) -> None:
    # GIVEN a source file (read here through this process's own root, as the collector reads a rank's)
    source = tmp_path / "job.py"
    source.write_text(
        textwrap.dedent("""\
        def wait(path, store):
            while not store.check([path]):
        # a comment at the margin, inside the loop
                try:
                    time.sleep(0.1)
                except OSError:
                    pass
            while True:
                time.sleep(1)
            done = 1
    """)
    )
    line = {text.strip(): n for n, text in enumerate(source.read_text().splitlines(), 1)}
    # THEN the `while` around a line in it, past a comment and a `try`; the check's own line; none for a bare
    # `while True` or a line after the loops
    assert (
        polled._while_line(os.getpid(), str(source), line["time.sleep(0.1)"]) == "    while not store.check([path]):\n"
    )
    assert polled._while_line(os.getpid(), str(source), line["while not store.check([path]):"]) is not None
    assert polled._while_line(os.getpid(), str(source), line["time.sleep(1)"]) is None
    assert polled._while_line(os.getpid(), str(source), line["done = 1"]) is None
