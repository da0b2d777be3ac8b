"""Starting the launcher transparently: its own process group, the terminal handed to it when we have one,
stdout/stderr teed through a pty (where ours is a terminal) or a pipe, to ours and to console.log.
Imports the stdlib and the console log."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import subprocess
import termios
import threading
from collections.abc import Mapping
from typing import Callable, Optional

from .console_log import ConsoleLog, write_all

Sink = Callable[[bytes, int], None]  # (data, stream: 1 stdout or 2 stderr)


class _Tee(threading.Thread):
    def __init__(self, src: int, dst: int, console: ConsoleLog, watchers: list[Sink]) -> None:
        super().__init__(name=f"blackbox-tee-{dst}", daemon=True)
        self.src, self.dst, self.console, self.watchers = src, dst, console, watchers

    def run(self) -> None:
        dst_ok = True
        while True:
            try:
                data = os.read(self.src, 65536)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                break  # EIO: the pty's last writer is gone
            if not data:
                break
            if dst_ok:
                try:
                    write_all(self.dst, data)
                except BrokenPipeError:
                    # Our reader went away (`| head`): let the job meet the closed pipe as it would have.
                    dst_ok = False
                    break
                except OSError:
                    dst_ok = False
            self.console.write(data, self.dst)
            for watch in self.watchers:
                with contextlib.suppress(Exception):
                    watch(data, self.dst)
        os.close(self.src)


class Launched:
    """The launcher process and the threads that carry its output."""

    def __init__(self, popen: subprocess.Popen[bytes], tees: list[_Tee], tty_fd: Optional[int]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.tees = tees
        self._tty_fd = tty_fd  # the terminal we handed to the job, to take back at the end

    def join_output(self, timeout: float) -> None:
        for t in self.tees:
            t.join(timeout)

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
    return os.pipe()


def resize_ptys(launched: Launched) -> None:
    for t in launched.tees:
        with contextlib.suppress(OSError):
            if os.isatty(t.src) and os.isatty(t.dst):
                size = fcntl.ioctl(t.dst, termios.TIOCGWINSZ, b"\0" * 8)
                fcntl.ioctl(t.src, termios.TIOCSWINSZ, size)


def spawn(argv: list[str], env: Mapping[str, str], console: ConsoleLog, watchers: list[Sink],
          unblock: Optional[set[int]] = None) -> Launched:  # fmt: skip
    """Start `argv` in its own process group (with `unblock`: signals blackbox blocks, unblocked for it). Raises
    OSError (ENOENT, EACCES) as exec reports it."""
    tty_fd = _foreground_tty()
    out_r, out_w = _open_stream(1)
    err_r, err_w = _open_stream(2)

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
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise
    os.close(out_w)
    os.close(err_w)
    if tty_fd is not None:
        # Hand the terminal to the job (the shell's job control sees us; Ctrl-C reaches the job as it
        # would without blackbox) and never stop for writing to it from the background.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty_fd, popen.pid)
    tees = [_Tee(out_r, 1, console, watchers), _Tee(err_r, 2, console, watchers)]
    for t in tees:
        t.start()
    return Launched(popen, tees, tty_fd)
