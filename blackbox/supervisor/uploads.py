"""`--upload`: each bundle, once written and analysed, copied to shared storage beside the job's ending — by a helper
process (blackbox.storage.push) watched by a thread, so nothing waits on the storage but `finish`, and that no
longer than `--upload-timeout`. The outcome is an event and one line. The helper is blackbox's own: never
signalled as the job's (it runs in a session listed with the alert commands'). Imports the stdlib and blackbox's
host side."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import alerts
from ..analyze.model import Report
from ..bundle.reader import Bundle
from ..bundle.writer import Written
from ..storage import layout as SL
from ..storage.urls import display, scrub
from .context import RunContext

KILL_GRACE_S = 3.0  # past the timeout, before the helper is killed
ANSWER_S = 1.0  # of that grace, what the helper keeps to answer and exit: its last attempt is given up before
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Outcome:
    ok: bool
    url: Optional[str]
    error: Optional[str]
    attempts: int = 0
    seconds: float = 0.0
    seen: list[dict[str, Any]] = field(default_factory=list)


def where(bundle: Bundle, host: str) -> tuple[str, str]:
    """(run, node) of a bundle under the prefix: a multi-node job's nodes share its job id."""
    multinode = bundle.section("multinode")
    run = str(multinode.get("job_id") or bundle.manifest.get("run_id") or "unknown")
    rank = multinode.get("node_rank")
    return run, SL.node_dir(host, rank if isinstance(rank, int) and not isinstance(rank, bool) else None)


class Uploads:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.target = ctx.cfg.upload
        self.timeout = ctx.cfg.upload_timeout
        self._threads: list[threading.Thread] = []

    def submit(self, written: Written, bundle: Bundle, report: Optional[Report],
               on_done: Callable[[Outcome], None]) -> None:  # fmt: skip
        """Start copying `written` (in the background); `on_done` is called with the outcome, in that thread."""
        run, node = where(bundle, self.ctx.node)
        key = SL.bundle_key(run, node, os.path.basename(written.path))
        record = None
        if report is not None:
            record = SL.make_record(report, written.manifest, run, node, self.ctx.node, written.sha256,
                                    _size(written.path))  # fmt: skip
        request = {"url": self.target, "key": key, "bundle": written.path, "timeout": self.timeout,
                   "record": record or {"schema_version": SL.RECORD_SCHEMA_VERSION, "id": SL.short_id(written.sha256),
                                        "run": run, "node": node, "host": self.ctx.node, "fingerprint": "",
                                        "verdict": {}, "sha256": written.sha256},
                   "seen": record is not None and SL.names_a_cause(record)}  # fmt: skip
        t = threading.Thread(target=self._run, args=(written.path, request, on_done), name="blackbox-upload",
                             daemon=True)  # fmt: skip
        self._threads.append(t)
        t.start()

    def _run(self, path: str, request: dict[str, Any], on_done: Callable[[Outcome], None]) -> None:
        ctx = self.ctx
        try:
            outcome = self._push(request)
        except Exception as exc:
            outcome = Outcome(False, None, f"the upload helper failed: {scrub(repr(exc))}")
        ctx.event("upload", ok=outcome.ok, bundle=path, url=outcome.url, error=outcome.error,
                  attempts=outcome.attempts, seconds=outcome.seconds, target=display(self.target))  # fmt: skip
        if outcome.ok:
            ctx.say(f"bundle uploaded: {outcome.url}")
        else:
            ctx.say(f"bundle not uploaded to {display(self.target)}: {outcome.error}; it is kept at {path}")
        try:
            on_done(outcome)
        except Exception as exc:
            ctx.internal_error("upload", exc)

    def _push(self, request: dict[str, Any]) -> Outcome:
        code = f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); from blackbox.storage.push import main; main()"
        started = time.monotonic()
        # the latest moment the helper may still try, on the machine's monotonic clock (shared by every process): its
        # own start-up, slow on a loaded machine, may take some of the grace, and it answers before it is killed
        request = {**request, "deadline": started + self.timeout + KILL_GRACE_S - ANSWER_S}
        with alerts.SESSIONS_LOCK:  # listed before it can be seen: it is never taken for one of the job's processes
            proc = subprocess.Popen([sys.executable, "-E", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self.ctx.env, start_new_session=True)  # fmt: skip
            alerts.SESSIONS.add(proc.pid)
        try:
            try:
                out, err = proc.communicate(json.dumps(request).encode(), timeout=self.timeout + KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()  # an answer written before the kill is still the answer
        finally:
            with alerts.SESSIONS_LOCK:
                alerts.SESSIONS.discard(proc.pid)
        try:
            answer = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            if proc.returncode == -signal.SIGKILL:
                return Outcome(False, None, f"no answer from the storage within --upload-timeout "
                               f"({self.timeout:g} s)", seconds=round(time.monotonic() - started, 3))  # fmt: skip
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
            return Outcome(False, None, "the upload helper gave no answer (exit code "
                           f"{proc.returncode}{': ' + scrub(tail[0]) if tail else ''})")  # fmt: skip
        seen = answer.get("seen") if isinstance(answer.get("seen"), list) else []
        error = answer.get("error")
        attempts = answer.get("attempts")
        if not answer.get("ok") and not answer.get("permanent") and isinstance(attempts, int) and attempts > 0:
            # retried until --upload-timeout: how often, so that a reader knows it was no one-off (under load the
            # helper's start-up can leave time for one attempt only)
            error = f"{error} (gave up after {attempts} attempt{'s' if attempts > 1 else ''} in {self.timeout:g} s)"
        return Outcome(bool(answer.get("ok")), answer.get("url"), scrub(str(error)) if error else None,
                       int(answer.get("attempts") or 0), float(answer.get("seconds") or 0.0),
                       [s for s in seen if isinstance(s, dict)])  # fmt: skip

    def join(self, deadline: float) -> None:
        """Wait for the uploads until `deadline` (monotonic): each is bounded by its own timeout anyway."""
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
