"""console.log: the job's output as the terminal saw it, redacted, bounded, and never in the job's way. The tee
process (tee.py) hands it a copy that can never hold the job; a process of its own, forked from the supervisor (so
it redacts with the secrets the supervisor knows), redacts and writes it in a thread at the lowest CPU priority.
Imports the stdlib, blackbox.redact, blackbox.safeopen and the tee's frame format."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections import deque
from typing import Callable, Optional, Union

from ..redact import StreamRedactor
from ..safeopen import read_file
from .tee import END, GAP, GAP_INFO, PIPE_SIZE, FrameReader, frames, read_chunk

DEFAULT_LOG_BYTES = 256 * 1024 * 1024  # console.log and its tail files together


def _tail(path: str, limit: int) -> bytes:
    """The last `limit` bytes of one of the log's files (never through a link put in its place)."""
    try:
        return read_file(path, None, limit, tail=True)
    except OSError:
        return b""


class ConsoleLog:
    """console.log: the job's output as the terminal saw it, after a header, with secrets redacted line by line
    (a token never straddles two writes). Its writer never waits for it: `write` only queues, a thread of its own
    redacts and writes; if it falls more than MAX_QUEUE behind, output is dropped from the log and the log says so
    where it happened and at its end. Bounded on disk: the first `head_bytes` stay in console.log; after them the
    newest output rolls through console.tail.log (and console.tail.1.log, the part before it), so at most
    `max_bytes` in all; what was dropped between head and tail is said at the end of console.log. A write failure
    (disk full) stops the log, never the job. In a run, it lives in the console log's own process
    (ConsoleLogProcess)."""

    MAX_PENDING = 64 * 1024  # a "line" longer than this is redacted and written in pieces
    MAX_QUEUE = 16 * 1024 * 1024  # bytes the writer may fall behind before output is dropped from the log

    def __init__(self, path: str, on_error: Callable[[str], None], max_bytes: int = DEFAULT_LOG_BYTES,
                 nice: int = 0) -> None:  # fmt: skip
        self.path = path
        self.tail_path, self.old_tail_path = tail_paths(path)
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._tail_fd: Optional[int] = None
        self.head_bytes = max_bytes // 4
        # per stream: a private key printed line by line is dropped from BEGIN to END, and the other stream's lines
        # written meanwhile are not taken for its body
        self._redact: dict[int, StreamRedactor] = {}
        self.tail_bytes = (max_bytes - self.head_bytes) // 2  # each of the two tail files
        self._written = 0  # into the file being written now (console.log, then console.tail.log)
        self._on_error = on_error
        self._pending: dict[int, bytes] = {}  # per stream: the bytes after its last newline (writer thread only)
        # (stream, bytes) to write; (stream, n) n bytes of it lost here; (-1, 0) the partial lines written out
        self._queue: deque[tuple[int, Union[bytes, int]]] = deque()
        self._queued = 0
        self._lost: dict[int, int] = {}  # per stream: bytes dropped since the last note in the log
        self.dropped_queue = 0  # bytes dropped because the writer fell behind
        self.dropped_rolled = 0  # bytes rolled out of the tail
        self.dropped_cut = 0  # bytes still queued when the log was cut short
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._cut = False
        self._nice = nice  # the writer thread's, while the job runs; the end is written at the closer's priority
        self._handover = False
        self._thread = threading.Thread(target=self._drain, name="blackbox-console", daemon=True)
        self._thread.start()

    def write(self, data: bytes, stream: int = 0) -> None:
        """Queue the job's output for the log: never blocks on redaction or the disk."""
        with self._cond:
            if self._fd is None and self._tail_fd is None:  # the log failed (said once): nothing more to do
                return
            if self._queued + len(data) > self.MAX_QUEUE:
                self.dropped_queue += len(data)
                self._lost[stream] = self._lost.get(stream, 0) + len(data)
                return
            if self._lost:
                self._queue.extend(sorted(self._lost.items()))
                self._lost.clear()
            self._queue.append((stream, data))
            self._queued += len(data)
            self._cond.notify()

    def gap(self, stream: int, lost: int) -> None:
        """`lost` bytes of `stream` never reached us (the tee's copy fell behind): said in the log, there."""
        with self._cond:
            self.dropped_queue += lost
            self._queue.append((stream, lost))
            self._cond.notify()

    def _drain(self, niced: bool = True) -> None:
        if niced and self._nice:
            with contextlib.suppress(OSError):  # this thread only (Linux): the job's threads come first
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._handover and niced:  # the closer's thread takes it from here, at its own priority
                    return
                if not self._queue or self._cut:
                    self.dropped_cut += self._queued
                    self._queue.clear()
                    self._queued = 0
                    self._busy = False
                    self._cond.notify_all()
                    if self._closing:
                        return
                    continue
                stream, item = self._queue.popleft()
                if isinstance(item, bytes):
                    self._queued -= len(item)
                self._busy = True
            try:
                if isinstance(item, bytes):
                    self._take(item, stream)
                elif stream < 0:
                    self._flush_partial()
                else:
                    self._note_gap(stream, item)
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
            self._write(buf[:cut], stream)

    def _flush_partial(self) -> None:
        pending, self._pending = self._pending, {}
        for stream in sorted(pending):
            self._write(pending[stream], stream)

    def _note_gap(self, stream: int, lost: int) -> None:
        partial = self._pending.pop(stream, b"")  # the line the gap cut: written as far as it came
        if partial:
            self._write(partial + b"\n", stream)
        name = {1: "stdout", 2: "stderr"}.get(stream, "output")
        self._raw(f"# blackbox: {lost} bytes of the job's {name} are missing here: they came faster than the log "
                  "could take them; the terminal had all of it\n".encode())  # fmt: skip

    def _write(self, data: bytes, stream: int) -> None:
        redact = self._redact.get(stream)
        if redact is None:
            redact = self._redact[stream] = StreamRedactor()
        self._raw(redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))

    def _raw(self, text: bytes) -> None:
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

    def flush_pending(self, timeout: float = 2.0) -> None:
        """The partial last lines (no newline yet) written out too, after everything queued before."""
        with self._cond:
            self._queue.append((-1, 0))
            self._cond.notify()
        self.sync(timeout)

    def tail(self, limit: int) -> bytes:
        """The last `limit` bytes of the job's output in the log, across the tail files."""
        self.sync()
        return read_tail(self.path, limit)

    def idle(self) -> bool:
        """Everything queued is written."""
        with self._cond:
            return not self._queue and not self._busy

    def cut(self) -> None:
        """Stop here: what is still queued is dropped (and said so at the end of the log by `close`)."""
        with self._cond:
            self._cut = True
            self._cond.notify_all()

    def close(self, note: str = "") -> None:
        """Write everything queued (unless cut), then the notes: what was dropped, and `note`."""
        self.flush_pending(0)
        with self._cond:
            self._closing = True
            self._handover = bool(self._nice)
            self._cond.notify_all()
        self._thread.join()
        if self._handover:  # what is left is written at our priority, not the niced writer's
            self._thread = threading.Thread(target=self._drain, args=(False,), name="blackbox-console", daemon=True)
            self._thread.start()
            self._thread.join()
        self._flush_partial()  # after a cut, the partial lines the writer had already taken
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
                if self.dropped_cut:
                    write_all(self._fd, (f"# blackbox: {self.dropped_cut} bytes of output were still to be "
                                          "written when blackbox ended and are not in this log; the terminal had "
                                          "all of it\n").encode())  # fmt: skip
                if note:
                    write_all(self._fd, f"# blackbox: {note}\n".encode())
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def tail_paths(path: str) -> tuple[str, str]:
    """console.tail.log and console.tail.1.log beside console.log."""
    tail = path[: -len(".log")] + ".tail.log" if path.endswith(".log") else path + ".tail"
    return tail, tail[: -len(".log")] + ".1.log"


def read_tail(path: str, limit: int) -> bytes:
    """The last `limit` bytes of the job's output in the log at `path`, across its tail files."""
    tail_path, old_tail_path = tail_paths(path)
    if not os.path.exists(tail_path):
        return _tail(path, limit)
    newest = _tail(tail_path, limit)
    if len(newest) < limit and os.path.exists(old_tail_path):
        newest = _tail(old_tail_path, limit - len(newest)) + newest
    return newest


# --- the console log's own process ------------------------------------------------------------------------
# Commands (supervisor -> log process) and replies, in the tee's frames: kind, length, payload.
SYNC, FLUSH, CLOSE, CUT, WRITE = b"S"[0], b"F"[0], b"C"[0], b"X"[0], b"W"[0]
ACK, ERROR = b"A"[0], b"E"[0]
NICE = 19  # the log's writer yields the CPU to the job: on a busy node it falls behind (and says so), the job does
# not; the rest of it is written at the end at normal priority
CLOSE_WAIT = 30.0  # seconds the supervisor waits at the end for the log to catch up before cutting it short
_F_SETPIPE_SZ = 1031


class ConsoleLogProcess:
    """The supervisor's handle on console.log, which a process of its own writes (a ConsoleLog inside it): forked
    at start, so it redacts with every secret the supervisor knows by then; its writer thread runs at the lowest
    CPU priority while the job runs, so that redaction takes the job's CPU last. The tee sends it the job's
    output (`copy_fd`); the header comes from here before that. It outlives the supervisor: if blackbox dies, it
    writes what the tee still sends, until the job's output ends."""

    def __init__(self, path: str, on_error: Callable[[str], None], max_bytes: int = DEFAULT_LOG_BYTES,
                 say: Optional[Callable[[str], None]] = None) -> None:  # fmt: skip
        self.path = path
        self._on_error = on_error
        self._say = say
        data_r, self._data_w = os.pipe()
        ctl_r, self._ctl_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl_pipe_size(self._data_w, PIPE_SIZE)
        pid = os.fork()
        if pid == 0:  # the log's process: never returns
            code = 1
            try:
                _serve(path, max_bytes, data_r, ctl_r, rep_w)
                code = 0
            finally:
                os._exit(code)
        self.pid = pid
        for fd in (data_r, ctl_r, rep_w):
            os.close(fd)
        self._cond = threading.Condition()
        self._seq = 0
        self._acked = 0
        self._exited = False
        self._replies = threading.Thread(target=self._read_replies, name="blackbox-console-replies", daemon=True)
        self._replies.start()

    # --- what the supervisor does -------------------------------------------------------------------------
    def write(self, data: bytes, stream: int = 0) -> None:
        """Text for the log from blackbox itself (the header): in order before the job's output."""
        try:
            if self._data_w >= 0:
                write_all(self._data_w, frames(stream, data))
            else:
                self._command(WRITE, frames(stream, data))
        except OSError:
            pass  # the log's process is gone: it said why

    def copy_fd(self) -> int:
        """The write end the tee sends the job's output to; `handed_over` once the tee holds it."""
        return self._data_w

    def handed_over(self) -> None:
        if self._data_w >= 0:
            os.close(self._data_w)
            self._data_w = -1

    def sync(self, timeout: float = 2.0) -> None:
        """Wait (at most `timeout`) until the output the log has been sent so far is written."""
        self._wait_for(self._command(SYNC), timeout)

    def flush_pending(self, timeout: float = 2.0) -> None:
        """Like sync, and the job's partial last lines (no newline yet) written out too."""
        self._wait_for(self._command(FLUSH), timeout)

    def tail(self, limit: int) -> bytes:
        """The last `limit` bytes of the job's output in the log, across the tail files."""
        self.sync()
        return read_tail(self.path, limit)

    def close(self, wait: bool = True) -> None:
        """The end of the run. `wait`: the job's output has ended, and the log writes all of it before we go (at
        most CLOSE_WAIT, then it is cut short, with a note). Else something of the job still holds its output open
        (or blackbox is leaving early): the log's process goes on by itself, to the end of the job's output."""
        self.handed_over()
        if wait:
            self._command(CLOSE)
            if not self._wait_exit(2.0):
                if self._say is not None:
                    self._say(f"writing the rest of console.log (the job printed faster than it could be redacted; "
                              f"at most {CLOSE_WAIT:g} s)")  # fmt: skip
                if not self._wait_exit(CLOSE_WAIT - 2.0):
                    self._command(CUT)
                    self._wait_exit(5.0)
        with contextlib.suppress(OSError):
            os.close(self._ctl_w)
        self._ctl_w = -1
        self._replies.join(1.0 if wait else 0.0)

    # --- the pipes ------------------------------------------------------------------------------------------
    def _command(self, kind: int, payload: bytes = b"") -> int:
        with self._cond:
            self._seq += 1
            seq = self._seq
        try:
            if self._ctl_w >= 0:
                write_all(self._ctl_w, frames(kind, payload or seq.to_bytes(8, "little")))
        except OSError:
            pass
        return seq

    def _wait_for(self, seq: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._acked < seq and not self._exited and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid = self.pid
            if pid:
                with self._cond:
                    self._exited = True
                    self._cond.notify_all()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _read_replies(self) -> None:
        frames_in = FrameReader()
        while True:
            data = read_chunk(self._rep_r, 65536)
            if not data:
                break
            for kind, payload in frames_in.feed(data):
                if kind == ACK:
                    with self._cond:
                        self._acked = max(self._acked, int.from_bytes(payload, "little"))
                        self._cond.notify_all()
                elif kind == ERROR:
                    with contextlib.suppress(Exception):
                        self._on_error(payload.decode("utf-8", "replace"))
        os.close(self._rep_r)
        with self._cond:
            self._exited = True
            self._cond.notify_all()


def fcntl_pipe_size(fd: int, size: int) -> None:
    import fcntl

    fcntl.fcntl(fd, _F_SETPIPE_SZ, size)


def _serve(path: str, max_bytes: int, data_r: int, ctl_r: int, rep_w: int) -> None:
    """The log's process: the job's output (data_r, from the tee; the header first) into a ConsoleLog, commands
    from the supervisor (ctl_r), replies to it (rep_w). Runs until the job's output ends and the supervisor says
    close (or is gone), or the supervisor cuts it short."""
    _detach({data_r, ctl_r, rep_w})
    reply_lock = threading.Lock()

    def reply(kind: int, payload: bytes) -> None:
        with reply_lock, contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
            write_all(rep_w, frames(kind, payload))

    try:
        log = ConsoleLog(path, lambda m: reply(ERROR, m.encode()), max_bytes, nice=NICE)
    except OSError as exc:
        reply(ERROR, f"console.log cannot be written: {exc.strerror}".encode())
        return
    os.set_blocking(data_r, False)
    data_in, ctl_in = FrameReader(), FrameReader()
    data_open = ctl_open = True
    finishing = cut = False

    def take(kind: int, payload: bytes) -> None:
        if kind == GAP:
            stream, lost = GAP_INFO.unpack(payload)
            log.gap(stream, lost)
        elif kind != END:
            log.write(payload, kind)

    def drain() -> bool:
        """What the tee has sent so far (a bounded amount: it may be sending more all the time); False once its
        end is read."""
        for _ in range(64):
            try:
                data = os.read(data_r, PIPE_SIZE)
            except BlockingIOError:
                return True
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:
                return False
            for kind, payload in data_in.feed(data):
                take(kind, payload)
        return True

    while not cut and (data_open or (ctl_open and not finishing)):
        ready = select.select([fd for fd, on in ((data_r, data_open), (ctl_r, ctl_open)) if on], [], [])[0]
        if ctl_r in ready:
            data = read_chunk(ctl_r, 65536)
            if not data:
                ctl_open = False  # the supervisor is gone: write what the tee still sends, to its end
            for kind, payload in ctl_in.feed(data):
                if kind in (SYNC, FLUSH):
                    data_open = data_open and drain()
                    if kind == FLUSH:
                        log.flush_pending(1e9)
                    else:
                        log.sync(1e9)
                    reply(ACK, payload)
                elif kind == WRITE:
                    for k, p in FrameReader().feed(payload):
                        log.write(p, k)
                elif kind == CLOSE:
                    finishing = True
                elif kind == CUT:
                    cut = True
        if data_r in ready and data_open and not cut:
            data_open = drain()
    while not cut and ctl_open and not log.idle():  # the backlog is being written: a cut may still come
        if select.select([ctl_r], [], [], 0.1)[0]:
            data = read_chunk(ctl_r, 65536)
            ctl_open = bool(data)
            cut = any(kind == CUT for kind, _ in ctl_in.feed(data))
    if cut:
        log.cut()
    log.close("blackbox ended while the job's output was still open; what came after is not in this log"
              if data_open else "")  # fmt: skip


def _detach(keep: set[int]) -> None:
    """The log's process holds nothing of the supervisor's: not our stdout or stderr (a pipeline's reader must
    see its end when the job's output ends), no other file, none of blackbox's signals."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTSTP", "SIGTTIN", "SIGTTOU",
                 "SIGPIPE"):  # fmt: skip
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    for name in ("SIGCHLD", "SIGWINCH"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, b"blackbox-log", 0, 0, 0)  # PR_SET_NAME


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
