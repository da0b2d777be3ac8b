"""Last words: what a rank leaves in its own directory whatever happens to it — faulthandler dumps (SIGUSR1 on
request, SIGTERM before a teardown, fatal signals), uncaught exceptions, CUDA out-of-memory records, and the
richer Python-side dump the daemon thread writes on request. Stdlib only, Python >= 3.9."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

from . import protocol as P

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .seam import RecorderLike

MAX_FRAMES = 64  # per thread, innermost kept
MAX_REPR = 200


def frames_of(tb_or_frame: Any, limit: int = MAX_FRAMES) -> list[dict[str, Any]]:
    """Frames, outermost first, as plain dicts (file, line, function, code)."""
    import traceback  # only when a record is written: it costs milliseconds to import

    if hasattr(tb_or_frame, "tb_frame"):
        summary = traceback.extract_tb(tb_or_frame)
    else:
        summary = traceback.extract_stack(tb_or_frame)
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "")[:MAX_REPR]}
            for f in list(summary)[-limit:]]  # fmt: skip


_redactor: Any = None


def _redacted(data: Any) -> Any:
    """Secrets never reach disk, not even the rank's own files: records are redacted as data (exception
    messages, code lines, argv, metrics), before they are encoded, by the shared redaction, which also knows
    this process's credential-named variables. The files still parse."""
    global _redactor
    if _redactor is None:
        from . import credentials, redact

        credentials.add_known_secrets(os.environ, sys.argv)  # and the credential stores, the config files named
        _redactor = redact.redact_value
    return _redactor(data)


def write_json(path: str, data: Any) -> None:
    """Atomic, private and redacted: a reader never sees half a record, nor a secret."""
    import json

    text = json.dumps(_redacted(data), indent=1, default=repr)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def append_jsonl(path: str, record: Any) -> None:
    import json

    line = json.dumps(_redacted(record), default=repr) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)


class LastWords:
    def __init__(self, rec: RecorderLike) -> None:
        self.rec = rec
        self.dir = rec.rank_dir
        self._files: dict[str, Any] = {}  # kept open: faulthandler writes to their descriptors
        self.stack_dump_index = 0
        self._oom_seen: set[int] = set()

    def _open(self, key: str, name: str) -> Any:
        old = self._files.get(key)
        fd = os.open(os.path.join(self.dir, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._files[key] = os.fdopen(fd, "a")
        if old is not None:
            old.close()
        return self._files[key]

    def note(self, what: str, **fields: Any) -> None:
        """A line in the rank's `recorder-events.jsonl`: what the recorder did that the job could notice."""
        try:
            append_jsonl(os.path.join(self.dir, P.RANK_EVENTS), {"time": time.time(), "what": what, **fields})
        except OSError:
            pass

    # --- faulthandler -------------------------------------------------------------------------------------
    def install(self) -> None:
        rec = self.rec
        rec.guard("fatal", self._enable_fatal)
        rec.guard("sigusr1", self._register, signal.SIGUSR1)
        rec.guard("dump_signal", self._register, P.dump_signal())
        rec.guard("sigterm", self._register, signal.SIGTERM)
        rec.guard("signal_watch", self._watch_signal_calls)
        rec.guard("exceptions", self._install_excepthooks)

    def _enable_fatal(self) -> None:
        if faulthandler.is_enabled():  # the job chose where fatal dumps go (PYTHONFAULTHANDLER): leave it
            self.note("faulthandler already enabled by the job; fatal-signal dumps go where it chose")
            return
        faulthandler.enable(file=self._open("fatal", P.RANK_FATAL), all_threads=True)

    def _file_for(self, sig: int) -> Any:
        if sig in (signal.SIGUSR1, P.dump_signal()):
            return self._files.get("usr1") or self._open("usr1", P.RANK_STACKS % self.stack_dump_index)
        return self._files.get("term") or self._open("term", P.RANK_SIGTERM)

    def _register(self, sig: int, handler: Any = None) -> None:
        """Dump all threads on `sig` from C (it works while the main thread is blocked in C or holds the
        GIL), then let the signal do what it did before: chain to a handler, die of SIGTERM's default."""
        if handler is None:
            handler = signal.getsignal(sig)
        if sig == signal.SIGTERM:
            chain = handler is not signal.SIG_IGN
        elif sig == P.dump_signal():  # blackbox's own: a dump and nothing else, whatever the job installed
            chain = False
        else:  # SIGUSR1's default would kill the rank: chain only to a real handler
            chain = handler not in (signal.SIG_DFL, signal.SIG_IGN)
        faulthandler.register(sig, file=self._file_for(sig), all_threads=True, chain=chain)

    def step_aside(self) -> None:
        """This process no longer records (the ranks it started do): its signal dumps stop, and SIGUSR1 and
        SIGTERM do again what they did before."""
        for sig in (signal.SIGUSR1, signal.SIGTERM, P.dump_signal()):
            try:
                faulthandler.unregister(sig)
            except Exception:
                pass

    def rotate_stack_file(self) -> None:
        """After a served dump request the next SIGUSR1 dump goes to a new `stacks-<n>.txt`."""
        self.stack_dump_index += 1
        self._open("usr1", P.RANK_STACKS % self.stack_dump_index)
        self._register(signal.SIGUSR1)
        self._register(P.dump_signal())

    def _watch_signal_calls(self) -> None:
        """`signal.signal(SIGUSR1 or SIGTERM, h)` by the job would silently replace faulthandler's handler:
        install h as asked, then put faulthandler back in front of it, chained, and record that."""
        original = signal.signal
        watched = (signal.SIGUSR1, signal.SIGTERM)

        def watching_signal(signalnum: Any, handler: Any) -> Any:
            if (
                signalnum not in watched
                or not self.rec.hook_ok("signal_watch")
                or threading.current_thread() is not threading.main_thread()  # signal.signal will refuse it
            ):
                return original(signalnum, handler)
            try:
                faulthandler.unregister(signalnum)
            except Exception as exc:
                self.rec.fail("signal_watch", exc)
                return original(signalnum, handler)
            previous = original(signalnum, handler)  # the job's own errors reach the job
            try:
                self._register(signalnum, handler)
                self.note("the job installed its own handler; faulthandler re-registered in front of it, chained",
                          signal=signal.Signals(signalnum).name, handler=repr(handler)[:MAX_REPR])  # fmt: skip
            except Exception as exc:
                self.rec.fail("signal_watch", exc)
            return previous

        watching_signal.__wrapped__ = original  # type: ignore[attr-defined]
        signal.signal = watching_signal

    # --- exceptions -------------------------------------------------------------------------------------
    def _install_excepthooks(self) -> None:
        previous = sys.excepthook

        def excepthook(tp: Any, value: Any, tb: Any) -> None:
            self.record_exception(tp, value, tb, threading.current_thread().name)
            previous(tp, value, tb)

        sys.excepthook = excepthook
        previous_thread_hook = threading.excepthook

        def thread_excepthook(args: Any) -> None:
            name = args.thread.name if args.thread is not None else "?"
            self.record_exception(args.exc_type, args.exc_value, args.exc_traceback, name)
            previous_thread_hook(args)

        threading.excepthook = thread_excepthook

    def record_exception(self, tp: Any, value: Any, tb: Any, thread: str) -> None:
        rec = self.rec
        try:
            if not rec.enabled:
                return
            record = {
                "time": time.time(), "rank": rec.rank, "pid": rec.pid, "thread": thread,
                "type": getattr(tp, "__module__", "") + "." + getattr(tp, "__qualname__", str(tp)),
                "message": str(value)[:4000], "traceback": frames_of(tb) if tb is not None else [],
                "chain": _chain(value), **rec.context(),
            }  # fmt: skip
            # written before the heartbeat says "exception": whoever sees the state finds the record (and can
            # tell a Ctrl-C's KeyboardInterrupt from a crash)
            append_jsonl(os.path.join(self.dir, P.RANK_EXCEPTIONS), record)
        except Exception as exc:
            rec.fail("exceptions", exc)
        finally:
            if rec.enabled and thread == "MainThread":
                try:
                    rec.mark_exception()
                except Exception as exc:
                    rec.fail("exceptions", exc)

    # --- CUDA out of memory --------------------------------------------------------------------------------
    def watch_oom(self, torch: Any) -> None:
        """Record every torch.OutOfMemoryError when it is made (also one the job catches and re-raises):
        the message, the phase, the last batch's shapes, and the CUDA memory snapshot where one is kept."""
        cls = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if cls is None:
            raise RuntimeError("this torch has no OutOfMemoryError")
        original = cls.__init__
        lastwords = self

        def __init__(exc_self: Any, *args: Any, **kwargs: Any) -> None:
            original(exc_self, *args, **kwargs)
            if lastwords.rec.hook_ok("oom") and id(exc_self) not in lastwords._oom_seen:
                lastwords._oom_seen.add(id(exc_self))
                try:
                    lastwords.record_oom(torch, str(exc_self))
                except Exception as exc:
                    lastwords.rec.fail("oom", exc)

        cls.__init__ = __init__

    def record_oom(self, torch: Any, message: str) -> None:
        n = len(self._oom_seen)
        snapshot = None
        cuda: Any = getattr(torch, "cuda", None)
        dump = getattr(getattr(cuda, "memory", None), "_dump_snapshot", None)
        if dump is not None and cuda.is_initialized():
            snapshot = os.path.join(self.dir, P.RANK_OOM_SNAPSHOT % n)
            try:
                dump(snapshot)
            except Exception as exc:
                snapshot = None
                self.note("memory snapshot failed", error=repr(exc))
        record = {"time": time.time(), "rank": self.rec.rank, "pid": self.rec.pid, "message": message[:4000],
                  "memory_snapshot": snapshot and os.path.basename(snapshot), "stack": frames_of(sys._getframe(2)),
                  **self.rec.context()}  # fmt: skip
        append_jsonl(os.path.join(self.dir, P.RANK_OOM), record)


def _chain(value: Any) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    seen = {id(value)}
    cause = getattr(value, "__cause__", None) or getattr(value, "__context__", None)
    while cause is not None and id(cause) not in seen and len(out) < 8:
        seen.add(id(cause))
        out.append({"type": type(cause).__qualname__, "message": str(cause)[:1000]})
        cause = getattr(cause, "__cause__", None) or getattr(cause, "__context__", None)
    return out


def thread_names() -> dict[str, str]:
    """faulthandler names threads by hex id only: this is the map from that id to the thread's name."""
    return {"0x%016x" % t.ident: t.name for t in threading.enumerate() if t.ident is not None}


def python_stacks() -> list[dict[str, Any]]:
    names = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        t = names.get(ident)
        out.append({
            "ident": "0x%016x" % ident, "name": t.name if t else "?", "daemon": bool(t and t.daemon),
            "stack": frames_of(frame),
        })  # fmt: skip
    return out
