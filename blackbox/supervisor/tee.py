"""The tee: the one process that carries the job's output, from the job's pipes (or pty) to blackbox's own stdout
and stderr as fast as they take it, with a copy for console.log and one for the supervisor's watch that can never
hold it. A process of its own, so that nothing else blackbox does (a slow redactor, a collection, the supervisor
crashing or SIGKILLed) can stall or break the job's output. Stdlib only: run by path (`python -I -S tee.py ...`)."""

from __future__ import annotations

import errno
import os
import select
import signal
import struct
import sys
import time
from typing import Optional

# A copy is a stream of frames: kind, payload length, payload. Kinds 0-2 are bytes of a stream (0 blackbox's own
# text, 1 the job's stdout, 2 its stderr); then:
FRAME = struct.Struct("<BI")
GAP = 16  # payload GAP_INFO: the copy lost this many bytes of this stream here (its reader fell behind)
GAP_INFO = struct.Struct("<BQ")
END = 17  # every source is closed: the job's output has all been read
READ_SIZE = 65536
COPY_WAIT = 0.02  # seconds a copy's bytes may wait to be sent with more: the job's output passes at once, as
# through `cat`, while console.log's process and the supervisor wake at most fifty times a second, not once a line
COPY_BATCH = 256 * 1024  # ... or until this many bytes wait
LOG_LIMIT = 16 * 1024 * 1024  # bytes a copy may fall behind before it loses output (and says so)
WATCH_LIMIT = 4 * 1024 * 1024
PIPE_SIZE = 1024 * 1024  # F_SETPIPE_SZ for the pipes we create: fewer wakeups, more slack
_F_SETPIPE_SZ = 1031
# Signals meant for blackbox or its terminal: the tee outlives them all and ends when the job's output does.
IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE")


def frames(kind: int, data: bytes) -> bytes:
    return FRAME.pack(kind, len(data)) + data


class FrameReader:
    """Frames out of a byte stream read in arbitrary pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out, at = [], 0
        while len(self._buf) - at >= FRAME.size:
            kind, size = FRAME.unpack_from(self._buf, at)
            if len(self._buf) - at - FRAME.size < size:
                break
            out.append((kind, bytes(self._buf[at + FRAME.size : at + FRAME.size + size])))
            at += FRAME.size + size
        del self._buf[:at]
        return out


class Copy:
    """A copy of the output for another process, written without ever blocking: what it cannot take at once waits
    here, up to `limit` bytes; beyond that output is lost from the copy, and a GAP frame says how much, where."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.buf = bytearray()
        self.lost: dict[int, int] = {}  # stream -> bytes lost since the last GAP frame
        self.alive = True
        os.set_blocking(fd, False)

    def put(self, kind: int, data: bytes) -> None:
        if not self.alive:
            return
        need = FRAME.size + len(data) + len(self.lost) * (FRAME.size + GAP_INFO.size)
        if self.buf and len(self.buf) + need > self.limit:
            if kind in (1, 2):
                self.lost[kind] = self.lost.get(kind, 0) + len(data)
            return
        self._say_lost()
        self.buf += FRAME.pack(kind, len(data))
        self.buf += data

    def _say_lost(self) -> None:
        for stream, n in sorted(self.lost.items()):
            self.buf += frames(GAP, GAP_INFO.pack(stream, n))
        self.lost.clear()

    def flush(self) -> None:
        while self.alive and self.buf:
            try:
                with memoryview(self.buf) as view:
                    n = os.write(self.fd, view[:PIPE_SIZE])
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError:  # the reader is gone (EPIPE): the copy ends, the output goes on
                self.close()
                return
            del self.buf[:n]  # O(1) at the front of a bytearray

    def finish(self) -> None:
        """Hand over what is left (the reader is slower, not gone), then close."""
        if self.alive:
            self._say_lost()  # a loss at the very end is said too
            try:
                os.set_blocking(self.fd, True)
            except OSError:
                pass
            self.flush()
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = -1
        self.alive = False
        self.buf = bytearray()


def read_chunk(fd: int, size: int) -> bytes:
    """One read of a blocking `fd`: b"" at its end, or when it can no longer be read (os.read itself retries an
    interrupted read)."""
    try:
        return os.read(fd, size)
    except OSError:
        return b""


def write_out(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, waiting as `cat` would (a terminal or pipe that is slow holds us, as it holds cat);
    an fd left non-blocking by someone else is waited on, not given up."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]


class Tee:
    """`pairs`: (source, destination, stream) — the job's read end (or pty master), ours (1 or 2), which stream."""

    def __init__(self, pairs: list[tuple[int, int, int]], copies: list[Copy], watch: Optional[Copy] = None) -> None:
        self.dst = {src: dst for src, dst, _ in pairs}
        self.stream = {src: stream for src, _, stream in pairs}
        self.dst_ok = {src: True for src, _, _ in pairs}
        self.copies = copies
        self.watch = watch
        self.live = set(self.dst)

    def pump(self, src: int) -> int:
        """One read from `src`, passed on. The bytes read; -1 when the source is done."""
        try:
            data = os.read(src, READ_SIZE)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return 0
            data = b""  # EIO: the pty's last writer is gone
        if not data:
            self.close(src)
            return -1
        if self.dst_ok[src]:
            try:
                write_out(self.dst[src], data)
            except BrokenPipeError:
                # Our reader went away (`| head`): the job meets the closed pipe as it would have without us.
                self.close(src)
                return -1
            except OSError:  # our terminal hung up, our file is on a full disk: the log and the watch still see it
                self.dst_ok[src] = False
        for copy in self.copies:
            copy.put(self.stream[src], data)
        return len(data)

    def close(self, src: int) -> None:
        self.live.discard(src)
        try:
            os.close(src)
        except OSError:
            pass

    def run(self) -> None:
        poller = select.poll()
        for src in self.live:
            poller.register(src, select.POLLIN)
        waiting: dict[int, Copy] = {}  # copies whose reader was slow: registered for POLLOUT, by their fd
        since: Optional[float] = None  # when the copies' oldest unsent bytes came
        while self.live:
            timeout = -1.0 if since is None else max(0.0, since + COPY_WAIT - time.monotonic()) * 1000
            for fd, _ in poller.poll(timeout):
                if fd in self.live:
                    if self.pump(fd) < 0:
                        poller.unregister(fd)
                    elif since is None:
                        since = time.monotonic()
                elif fd in waiting:
                    waiting[fd].flush()
            pending = [c for c in self.copies if c.alive and c.buf]
            if pending and (time.monotonic() - (since or 0.0) >= COPY_WAIT or
                            max(len(c.buf) for c in pending) >= COPY_BATCH):  # fmt: skip
                for copy in pending:
                    copy.flush()
                since = None
            for copy in self.copies:  # a copy that could not take it all is written as soon as it can
                if copy.alive and copy.buf and since is None and copy.fd not in waiting:
                    poller.register(copy.fd, select.POLLOUT)
                    waiting[copy.fd] = copy
            for fd, copy in list(waiting.items()):
                if not (copy.alive and copy.buf):
                    poller.unregister(fd)
                    del waiting[fd]
        if self.watch is not None:
            self.watch.put(END, b"")
        for copy in sorted(self.copies, key=lambda c: c is not self.watch):  # the watch first: it is waited on
            copy.finish()

    def cat(self) -> None:
        """The output alone, no copies: what is left to do after a bug of ours."""
        for copy in self.copies:
            copy.close()
        while self.live:
            for src in select.select(list(self.live), [], [])[0]:
                try:
                    data = os.read(src, READ_SIZE)
                except OSError:
                    data = b""
                if not data:
                    self.close(src)
                    continue
                if self.dst_ok[src]:
                    try:
                        write_out(self.dst[src], data)
                    except BrokenPipeError:
                        self.close(src)
                    except OSError:
                        self.dst_ok[src] = False


def resize(pairs: list[tuple[int, int, int]]) -> None:
    """Our terminal changed size: so do the job's ptys."""
    import fcntl
    import termios

    for src, dst, _ in pairs:
        try:
            if os.isatty(src) and os.isatty(dst):
                fcntl.ioctl(src, termios.TIOCSWINSZ, fcntl.ioctl(dst, termios.TIOCGWINSZ, b"\0" * 8))
        except OSError:
            pass


def main(argv: list[str]) -> int:
    """tee.py OUT_SRC ERR_SRC LOG_FD WATCH_FD: the job's stdout and stderr to ours (1 and 2), copies to the log's
    and the watch's fds (-1: none)."""
    out_src, err_src, log_fd, watch_fd = (int(a) for a in argv[1:5])
    for name in IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    pairs = [(out_src, 1, 1), (err_src, 2, 2)]
    signal.signal(signal.SIGWINCH, lambda *_: resize(pairs))
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"blackbox-tee", 0, 0, 0)  # PR_SET_NAME: what top and ps -o comm show
    except Exception:
        pass
    log = Copy(log_fd, LOG_LIMIT) if log_fd >= 0 else None
    watch = Copy(watch_fd, WATCH_LIMIT) if watch_fd >= 0 else None
    copies = [c for c in (log, watch) if c is not None]
    tee = Tee(pairs, copies, watch)
    try:
        tee.run()
    except Exception:  # a bug of ours: the job's output must still flow, so carry on as plain `cat`
        tee.cat()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
