"""How the supervisor's words reach stderr without ever holding it up: a line is queued and written by a thread of its
own, so a stderr that nobody reads (a full pipe, a paused terminal) stops the words, never the watch. What cannot be
written in time is handed back to be kept elsewhere (events.jsonl). Imports the stdlib only."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Callable, Optional

QUEUE_LINES = 1000  # lines that may wait for stderr; past this the oldest waiting line is handed back as unsaid
CLOSE_WAIT_S = 2.0  # at the end of a run, how long a write to stderr that does not return may hold it up


class Speaker:
    """Writes lines through `write` (which may block for good) from a thread of its own. `unsaid(line)` is called
    for a line that was not written: dropped from a full queue, or still waiting when the run closes."""

    def __init__(self, write: Callable[[str], None], unsaid: Callable[[str], None]) -> None:
        self._write = write
        self._unsaid = unsaid
        self._lines: collections.deque[str] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._writing: Optional[tuple[float, str]] = None  # (since when, which line) is being written now
        self._thread: Optional[threading.Thread] = None
        self._started = False  # lines are written from `start` on (before it they wait: a fork must come first)

    def start(self) -> None:
        """Write from now on (the supervisor forks console.log's process first, before any thread of its own)."""
        with self._ready:
            self._started = True
            self._wake()

    def say(self, line: str) -> None:
        """Queue one line; never blocks on stderr."""
        dropped = None
        with self._ready:
            if self._closed:
                dropped = line
            else:
                if len(self._lines) >= QUEUE_LINES:
                    dropped = self._lines.popleft()
                self._lines.append(line)
                self._wake()
        if dropped is not None:
            self._hand_back(dropped)

    def _wake(self) -> None:
        """With `_ready` held: the writer told of a line, started at the first one once writing may begin."""
        self._ready.notify()
        if self._thread is None and self._started and self._lines:
            self._thread = threading.Thread(target=self._run, name="blackbox-say", daemon=True)
            self._thread.start()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Let the waiting lines out, for as long as stderr takes them, but never longer than `wait_s` without a
        write returning; what is still waiting then is handed back (with the line stuck in its write: it may have
        gone out in part)."""
        with self._ready:
            self._closed, self._started = True, True
            self._wake()
            while self._lines or self._writing is not None:
                if self._writing is not None and time.monotonic() - self._writing[0] > wait_s:
                    break
                self._ready.wait(0.05)
            left = ([self._writing[1]] if self._writing is not None else []) + list(self._lines)
            self._lines.clear()
        for line in left:
            self._hand_back(line)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._lines and not self._closed:
                    self._ready.wait()
                if not self._lines:
                    return
                line = self._lines.popleft()
                self._writing = (time.monotonic(), line)
            try:
                self._write(line)
            except Exception:
                self._hand_back(line)
            finally:
                with self._ready:
                    self._writing = None
                    self._ready.notify_all()

    def _hand_back(self, line: str) -> None:
        with contextlib.suppress(Exception):
            self._unsaid(line)
