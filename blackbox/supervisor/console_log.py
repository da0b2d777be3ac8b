"""console.log: the job's output as the terminal saw it, redacted, bounded, and never in the job's way (the tee
only queues; a thread of its own redacts and writes). Imports the stdlib, blackbox.redact and blackbox.safeopen."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from typing import Callable, Optional

from ..redact import StreamRedactor
from ..safeopen import read_file

DEFAULT_LOG_BYTES = 256 * 1024 * 1024  # console.log and its tail files together


def _tail(path: str, limit: int) -> bytes:
    """The last `limit` bytes of one of the log's files (never through a link put in its place)."""
    try:
        return read_file(path, None, limit, tail=True)
    except OSError:
        return b""


class ConsoleLog:
    """console.log: the job's output as the terminal saw it, after a header, with secrets redacted line by line
    (a token never straddles two writes). The job never waits for it: `write` only queues (the output has
    already gone to the terminal), a thread of its own redacts and writes; if it falls more than MAX_QUEUE
    behind, output is dropped from the log and the drop is said in it. Bounded on disk: the first `head_bytes`
    stay in console.log; after them the newest output rolls through console.tail.log (and console.tail.1.log,
    the part before it), so at most `max_bytes` in all; what was dropped between head and tail is said at the
    end of console.log. A write failure (disk full) stops the log, never the job."""

    MAX_PENDING = 64 * 1024  # a "line" longer than this is redacted and written in pieces
    MAX_QUEUE = 16 * 1024 * 1024  # bytes the writer may fall behind before output is dropped from the log

    def __init__(self, path: str, on_error: Callable[[str], None], max_bytes: int = DEFAULT_LOG_BYTES) -> None:
        self.path = path
        self.tail_path = path[: -len(".log")] + ".tail.log" if path.endswith(".log") else path + ".tail"
        self.old_tail_path = self.tail_path[: -len(".log")] + ".1.log"
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._tail_fd: Optional[int] = None
        self.head_bytes = max_bytes // 4
        self._redact = StreamRedactor()  # a private key printed line by line is dropped from BEGIN to END
        self.tail_bytes = (max_bytes - self.head_bytes) // 2  # each of the two tail files
        self._written = 0  # into the file being written now (console.log, then console.tail.log)
        self._on_error = on_error
        self._pending: dict[int, bytes] = {}  # per stream: the bytes after its last newline (writer thread only)
        self._queue: deque[tuple[int, bytes]] = deque()
        self._queued = 0
        self.dropped_queue = 0  # bytes dropped because the writer fell behind
        self.dropped_rolled = 0  # bytes rolled out of the tail
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._thread = threading.Thread(target=self._drain, name="blackbox-console", daemon=True)
        self._thread.start()

    def write(self, data: bytes, stream: int = 0) -> None:
        """Queue the job's output for the log: never blocks on redaction or the disk."""
        with self._cond:
            if self._fd is None and self._tail_fd is None:  # the log failed (said once): nothing more to do
                return
            if self._queued + len(data) > self.MAX_QUEUE:
                self.dropped_queue += len(data)
                return
            self._queue.append((stream, data))
            self._queued += len(data)
            self._cond.notify()

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._queued = 0
                self._busy = True
            try:
                for stream, data in batch:
                    self._take(data, stream)
            except Exception as exc:  # blackbox's own bug: the log stops, the job goes on
                self._fail(f"console.log is no longer written: {exc!r}")
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _take(self, data: bytes, stream: int) -> None:
        buf = self._pending.pop(stream, b"") + data
        cut = buf.rfind(b"\n") + 1
        if not cut and len(buf) > self.MAX_PENDING:
            cut = len(buf)
        if cut < len(buf):
            self._pending[stream] = buf[cut:]
        if cut:
            self._write(buf[:cut])

    def _write(self, data: bytes) -> None:
        text = self._redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
        try:
            if self._tail_fd is None and self._written + len(text) > self.head_bytes and self._fd is not None:
                tail = os.path.basename(self.tail_path)
                write_all(self._fd, (f"# blackbox: console.log keeps the first {self.head_bytes} bytes of the "
                                      f"job's output; the newest output rolls through {tail} "
                                      "(--console-log-max)\n").encode())  # fmt: skip
                self._tail_fd = os.open(self.tail_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                self._written = 0
            if self._tail_fd is not None and self._written + len(text) > self.tail_bytes and self._written:
                with contextlib.suppress(OSError):  # the part before the part before the newest is dropped
                    self.dropped_rolled += os.path.getsize(self.old_tail_path)
                os.replace(self.tail_path, self.old_tail_path)
                os.close(self._tail_fd)
                self._tail_fd = os.open(self.tail_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                self._written = 0
            fd = self._tail_fd if self._tail_fd is not None else self._fd
            if fd is not None:
                write_all(fd, text)
                self._written += len(text)
        except OSError as exc:
            self._fail(f"console.log is no longer written: {exc.strerror}")

    def _fail(self, message: str) -> None:
        for fd in (self._fd, self._tail_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._tail_fd = None
        self._on_error(message)

    def sync(self, timeout: float = 2.0) -> None:
        """Wait (at most `timeout`) until what was queued so far is written: a collection reads the log next."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))

    def flush_pending(self) -> None:
        self.sync()
        with self._cond:
            pending, self._pending = self._pending, {}
        for stream in sorted(pending):
            self._write(pending[stream])

    def tail(self, limit: int) -> bytes:
        """The last `limit` bytes of the job's output in the log, across the tail files."""
        self.sync()
        if self._tail_fd is None and not os.path.exists(self.tail_path):
            return _tail(self.path, limit)
        newest = _tail(self.tail_path, limit)
        if len(newest) < limit and os.path.exists(self.old_tail_path):
            newest = _tail(self.old_tail_path, limit - len(newest)) + newest
        return newest

    def close(self) -> None:
        self.flush_pending()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(5.0)
        dropped = self.dropped_queue + self.dropped_rolled
        for fd in (self._tail_fd,):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._tail_fd = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                if dropped:
                    write_all(self._fd, (f"# blackbox: {self.dropped_rolled} bytes of output rolled out of the "
                                          f"tail and {self.dropped_queue} bytes came faster than the log could "
                                          "take them; the terminal had all of it\n").encode())  # fmt: skip
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
