"""Starting the launcher transparently: its own process group, the terminal handed to it when we have one, its
stdout and stderr through a pty (where ours is a terminal) or a pipe to the tee process (tee.py), which carries them
to ours and hands copies to console.log's process and to the watch here. Imports the stdlib, the console log and
the tee's frame format."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Mapping
from typing import Callable, Optional

from .console_log import ConsoleLogProcess, fcntl_pipe_size
from .tee import END, PIPE_SIZE, FrameReader, read_chunk

Sink = Callable[[bytes, int], None]  # (data, stream: 1 stdout or 2 stderr)
TEE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tee.py")


class _Watch(threading.Thread):
    """The supervisor's copy of the job's output, from the tee: each piece to the watchers (fatal lines)."""

    def __init__(self, fd: int, watchers: list[Sink]) -> None:
        super().__init__(name="blackbox-watch-output", daemon=True)
        self.fd, self.watchers = fd, watchers
        self.ended = threading.Event()  # the tee read the job's output to its end (or is gone)

    def run(self) -> None:
        frames_in = FrameReader()
        try:
            while True:
                data = read_chunk(self.fd, PIPE_SIZE)
                if not data:
                    break
                for kind, payload in frames_in.feed(data):
                    if kind == END:
                        self.ended.set()
                    elif kind in (1, 2):
                        for watch in self.watchers:
                            with contextlib.suppress(Exception):
                                watch(payload, kind)
        finally:
            os.close(self.fd)
            self.ended.set()


class Launched:
    """The launcher process, and the tee process that carries its output."""

    def __init__(self, popen: subprocess.Popen[bytes], tee: Optional[subprocess.Popen[bytes]],
                 watch: Optional[_Watch], tty_fd: Optional[int], tee_error: str = "") -> None:  # fmt: skip
        self.popen = popen
        self.pid = popen.pid
        self.tee = tee
        self.tee_error = tee_error  # why there is no tee (the job's output went straight to ours)
        self._watch = watch
        self._tty_fd = tty_fd  # the terminal we handed to the job, to take back at the end

    @property
    def helper_pids(self) -> list[int]:
        """blackbox's own processes for this job's output: never the job's."""
        return [self.tee.pid] if self.tee is not None else []

    def join_output(self, timeout: float) -> bool:
        """Wait (at most `timeout`) until the tee has read the job's output to its end and handed it on. False
        when something of the job still holds its output open."""
        if self.tee is None or self._watch is None:
            return True
        deadline = time.monotonic() + timeout
        if not self._watch.ended.wait(timeout):
            return False
        try:
            self.tee.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass  # it still hands the last of the output to console.log's process, which reads it to its end
        return True

    def resize(self) -> None:
        """Our terminal changed size: the tee passes it on to the job's ptys."""
        if self.tee is not None and self.tee.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.tee.pid, signal.SIGWINCH)

    def restore_terminal(self) -> None:
        if self._tty_fd is None:
            return
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(self._tty_fd, os.getpgrp())
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, old)
            self._tty_fd = None


def _foreground_tty() -> Optional[int]:
    """Our stdin's terminal, if we are its foreground process group (an interactive run)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _open_stream(our_fd: int) -> tuple[int, int]:
    """(read end for us, write end for the job): a pty that behaves like our terminal, or a pipe."""
    if os.isatty(our_fd):
        try:
            master, slave = os.openpty()
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.OPOST  # bytes as the job wrote them: no \n -> \r\n in console.log
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            with contextlib.suppress(OSError):
                size = fcntl.ioctl(our_fd, termios.TIOCGWINSZ, b"\0" * 8)
                fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
            return master, slave
        except OSError:
            pass
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl_pipe_size(w, PIPE_SIZE)  # a chatty job wakes the tee less often
    return r, w


def resize_ptys(launched: Launched) -> None:
    launched.resize()


def _start_tee(out_r: int, err_r: int, log_fd: int, watch_fd: int) -> subprocess.Popen[bytes]:
    """The tee process: our interpreter, isolated (-I -S: nothing of the job's or the user's Python set-up)."""
    fds = (out_r, err_r, log_fd, watch_fd)
    return subprocess.Popen([sys.executable, "-I", "-S", TEE_SCRIPT, *(str(fd) for fd in fds)],
                            stdin=subprocess.DEVNULL, pass_fds=[fd for fd in fds if fd >= 0])  # fmt: skip


def spawn(argv: list[str], env: Mapping[str, str], console: ConsoleLogProcess, watchers: list[Sink],
          unblock: Optional[set[int]] = None) -> Launched:  # fmt: skip
    """Start `argv` in its own process group, its output through the tee (with `unblock`: signals blackbox
    blocks, unblocked for it). Raises OSError (ENOENT, EACCES) as exec reports it."""
    tty_fd = _foreground_tty()
    out_r, out_w = _open_stream(1)
    err_r, err_w = _open_stream(2)
    watch_r, watch_w = os.pipe()
    tee: Optional[subprocess.Popen[bytes]] = None
    watch: Optional[_Watch] = None
    tee_error = ""
    try:
        tee = _start_tee(out_r, err_r, console.copy_fd(), watch_w)
    except OSError as exc:  # the job still runs, its output straight to ours
        tee_error = f"the tee process could not be started ({exc.strerror or exc})"
    for fd in (out_r, err_r, watch_w):
        os.close(fd)
    console.handed_over()
    if tee is None:
        os.close(watch_r)
        for fd in (out_w, err_w):
            os.close(fd)
        out_w, err_w = 1, 2
    else:
        watch = _Watch(watch_r, watchers)
        watch.start()

    def child_setup() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        if tty_fd is not None:
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(tty_fd, os.getpid())
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)

    try:
        popen = subprocess.Popen(
            argv, env=dict(env), stdout=out_w, stderr=err_w, preexec_fn=child_setup, close_fds=True
        )
    except BaseException:
        if tee is not None:
            for fd in (out_w, err_w):
                os.close(fd)
            with contextlib.suppress(subprocess.TimeoutExpired):
                tee.wait(5.0)  # it sees the end of the output at once
        raise
    if tee is not None:
        os.close(out_w)
        os.close(err_w)
    if tty_fd is not None:
        # Hand the terminal to the job (the shell's job control sees us; Ctrl-C reaches the job as it
        # would without blackbox) and never stop for writing to it from the background.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty_fd, popen.pid)
    return Launched(popen, tee, watch, tty_fd, tee_error)
