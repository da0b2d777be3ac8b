"""The supervisor's words never hold up its watch: a line goes to stderr from a thread of its own, and what a stderr
that nobody reads will not take is handed back (to events.jsonl) instead of blocking or being lost."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from blackbox.supervisor.speaker import Speaker

F_SETPIPE_SZ = 1031


def full_pipe() -> tuple[int, int]:
    """A pipe whose reader never reads, filled to the brim: the next write to it blocks."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def test_words_to_a_stderr_nobody_reads_never_block_and_are_handed_back() -> None:
    # GIVEN a speaker whose stderr is a full pipe nobody reads
    r, w = full_pipe()
    unsaid: list[str] = []
    writing = threading.Event()

    def write(line: str) -> None:
        writing.set()
        os.write(w, f"blackbox: {line}\n".encode())

    speaker = Speaker(write, unsaid.append)
    speaker.start()
    try:
        # WHEN the watch says a thousand and five lines (the first one's write under way)
        start = time.monotonic()
        speaker.say("line 0")
        assert writing.wait(5)
        for i in range(1, 1005):
            speaker.say(f"line {i}")
        said_in = time.monotonic() - start
        # THEN saying them took no time (the first is stuck in its write, the rest wait), the oldest waiting ones past
        # the queue's bound are handed back at once, and at the end the rest are, within the close's wait
        assert said_in < 1.0, said_in
        assert unsaid == [f"line {i}" for i in range(1, 5)], unsaid[:10]
        start = time.monotonic()
        speaker.close(wait_s=0.3)
        assert time.monotonic() - start < 2.0
        assert unsaid == [f"line {i}" for i in range(1, 5)] + ["line 0"] + [f"line {i}" for i in range(5, 1005)]
        # AND a line said after the close is handed back, never queued for a thread that will not write it
        speaker.say("late")
        assert unsaid[-1] == "late"
    finally:
        os.close(r)
        os.close(w)


def test_words_to_a_stderr_that_reads_all_go_out_in_order() -> None:
    r, w = os.pipe()
    speaker = Speaker(lambda line: os.write(w, f"{line}\n".encode()) and None, lambda line: None)
    speaker.say("line 0")  # before the start (the supervisor forks console.log's process first): it waits, no thread
    assert not any(t.name == "blackbox-say" for t in threading.enumerate())
    speaker.start()
    for i in range(1, 50):
        speaker.say(f"line {i}")
    speaker.close()
    os.close(w)
    with os.fdopen(r) as f:
        assert f.read().splitlines() == [f"line {i}" for i in range(50)]
