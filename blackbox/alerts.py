"""Raising the alarm after a bundle is written: the user's `--on-incident` command and the `--notify-url`
webhook, each in a background thread, bounded in time; a failure is logged and never reaches the job.
The core never prints: it reports through `event` and `say_once`. Imports the stdlib and the report model."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

from .analyze.model import Report
from .redact import redact_value

COMMAND_TIMEOUT_S = 60.0
POST_TIMEOUT_S = 10.0
RETRY_AFTER_S = 2.0


def incident_env(bundle: str, report: Optional[Report], run_id: str, node: str, trigger: str,
                 bundle_url: Optional[str] = None) -> dict[str, str]:  # fmt: skip
    env = {"BLACKBOX_BUNDLE": bundle, "BLACKBOX_RUN_ID": run_id, "BLACKBOX_NODE": node, "BLACKBOX_TRIGGER": trigger}
    if bundle_url:
        env["BLACKBOX_BUNDLE_URL"] = bundle_url  # where --upload copied it
    if report is not None:
        v = report.verdict
        env.update(BLACKBOX_CATEGORY=v.category, BLACKBOX_SUSPECTS=",".join(map(str, v.suspect_ranks)),
                   BLACKBOX_PHASE=v.phase or "", BLACKBOX_SUMMARY=v.summary[:2000])  # fmt: skip
    return env


def payload(bundle: str, report: Optional[Report], run_id: str, node: str, trigger: str,
            bundle_url: Optional[str] = None, upload_error: Optional[str] = None) -> dict[str, Any]:  # fmt: skip
    """What the webhook receives: the report's verdict block, where the bundle is (on the node, and in shared
    storage with --upload), and which host."""
    verdict = None
    if report is not None:
        v = report.verdict
        verdict = {"category": v.category, "phase": v.phase, "suspect_ranks": v.suspect_ranks,
                   "confidence": v.confidence, "summary": v.summary}  # fmt: skip
    body = {"source": "torch-blackbox", "run_id": run_id, "node": node, "host": node, "trigger": trigger,
            "bundle": bundle, "verdict": verdict,
            "next_action": report.next_actions[0] if report is not None and report.next_actions else None}  # fmt: skip
    if bundle_url or upload_error:
        body.update(bundle_url=bundle_url, upload_error=upload_error)
    return dict(redact_value(body))  # it leaves the machine: the summary quotes the job's own exception


# Sessions of the alert commands running now: they are not part of the job (the supervisor neither signals
# them when it ends the job nor reaps them: their own Popen does, and reads their exit code).
SESSIONS: set[int] = set()
SESSIONS_LOCK = threading.Lock()


def run_command(cmd: str, extra_env: dict[str, str], timeout: float = COMMAND_TIMEOUT_S) -> tuple[Optional[int], str]:
    """(exit code or None, how it went). The command runs in its own session, killed with it at the timeout."""
    try:
        with SESSIONS_LOCK:
            proc = subprocess.Popen(cmd, shell=True, env={**os.environ, **extra_env}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)  # fmt: skip
            SESSIONS.add(proc.pid)
    except OSError as exc:
        return None, f"could not be started: {exc.strerror}"
    try:
        return _wait(proc, timeout)
    finally:
        with SESSIONS_LOCK:
            SESSIONS.discard(proc.pid)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[Optional[int], str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.communicate()
        return None, f"did not finish within {timeout:g} s and was killed"
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
    return proc.returncode, f"exit code {proc.returncode}" + (f": {tail[0][:300]}" if tail and proc.returncode else "")


def post_json(url: str, body: dict[str, Any], timeout: float = POST_TIMEOUT_S, retries: int = 1) -> tuple[bool, str]:
    data = json.dumps(body).encode()
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(RETRY_AFTER_S)
        request = urllib.request.Request(url, data=data, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": "torch-blackbox"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return True, f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = str(getattr(exc, "reason", exc))
    return False, last


class Alerts:
    def __init__(self, on_incident: str, notify_url: str, event: Callable[..., None],
                 say_once: Callable[[str, str], None]) -> None:  # fmt: skip
        self.on_incident = on_incident
        self.notify_url = notify_url
        self.event = event
        self.say_once = say_once
        self._threads: list[threading.Thread] = []

    def incident(self, bundle: str, report: Optional[Report], run_id: str, node: str, trigger: str,
                 bundle_url: Optional[str] = None, upload_error: Optional[str] = None) -> None:  # fmt: skip
        if self.on_incident:
            env = incident_env(bundle, report, run_id, node, trigger, bundle_url)
            self._start(self._command, env)
        if self.notify_url:
            self._start(self._post, payload(bundle, report, run_id, node, trigger, bundle_url, upload_error))

    def _start(self, fn: Callable[[Any], None], arg: Any) -> None:
        t = threading.Thread(target=fn, args=(arg,), name="blackbox-alert", daemon=True)
        self._threads.append(t)
        t.start()

    def _command(self, env: dict[str, str]) -> None:
        code, how = run_command(self.on_incident, env)
        self.event("on_incident", command=self.on_incident, exit_code=code, result=how)
        if code != 0:
            self.say_once("on_incident", f"--on-incident command {how}; the job is not affected")

    def _post(self, body: dict[str, Any]) -> None:
        ok, how = post_json(self.notify_url, body)
        self.event("notify", ok=ok, result=how, bundle=body.get("bundle"))
        if not ok:
            self.say_once("notify", f"--notify-url could not be reached ({how}); the job is not affected")

    def join(self, timeout: float) -> None:
        """Give pending alerts a moment at the end (they are daemon threads: blackbox's exit ends them)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
