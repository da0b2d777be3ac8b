"""Copying one bundle and its incident record to shared storage, retried with backoff within a deadline, then
(when asked) the records under the prefix searched for the same failure. Runs in a helper process of its own
(`python -m blackbox.storage.push`, a JSON request on stdin, one JSON answer on stdout), so that a backend that
hangs is ended with its process and never holds the supervisor. Imports the stdlib and this package."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable

from ..errors import BlackboxError
from . import layout as SL
from .urls import describe_error, display, join, permanent

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0


def push(request: dict[str, Any]) -> dict[str, Any]:
    """Copy request["bundle"] to request["url"]/request["key"] and its record beside it. The answer: ok, url (the
    bundle's), error (one scrubbed sentence), permanent (the error is no use retrying), attempts, seconds, seen
    (records of the same failure)."""
    from .remote import Store, seen_before

    started = time.monotonic()
    # the timeout from this process's start, or sooner the caller's last moment (the machine's monotonic clock) where
    # it gave one: a start-up slowed by load is not allowed to make the answer come after the caller stops waiting
    deadline = started + float(request["timeout"])
    if request.get("deadline"):
        deadline = min(deadline, float(request["deadline"]))
    target, key, record = str(request["url"]), str(request["key"]), dict(request["record"])
    answer: dict[str, Any] = {"ok": False, "url": None, "error": None, "attempts": 0, "seen": []}
    try:
        store = Store(target, timeout=max(1.0, deadline - time.monotonic()))
    except BlackboxError as exc:
        answer["error"] = exc.message.rstrip(".") + (f" ({exc.hint})" if exc.hint else "")
        return answer
    dest = join(store.root, key)
    url = join(display(store.url), key)
    record["bundle"] = url
    body = (json.dumps(record, indent=1) + "\n").encode()
    backoff = FIRST_BACKOFF_S

    def attempt() -> None:
        store.put(dest, src=str(request["bundle"]))
        store.put(join(store.root, SL.record_key(key)), data=body)

    while True:
        answer["attempts"] += 1
        try:
            within(attempt, deadline - time.monotonic())
            answer.update(ok=True, url=url, error=None)
            break
        except TimeoutError:  # the deadline came during an attempt (a backend's own retries): answer with what is known
            answer.update(error=answer["error"] or "no answer from the storage", permanent=False)
            break
        except Exception as exc:
            answer.update(error=describe_error(exc), permanent=permanent(exc))
            if answer["permanent"] or deadline - time.monotonic() < backoff:
                break
            time.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
    if answer["ok"] and request.get("seen"):
        try:
            answer["seen"] = seen_before(store, record["fingerprint"], record["verdict"]["category"],
                                         record.get("top_frame"), record.get("incident_id"),
                                         record.get("sha256"), run=record.get("run"),
                                         top_path=record.get("top_path"))  # fmt: skip
        except Exception as exc:
            answer["seen_error"] = exc.message if isinstance(exc, BlackboxError) else describe_error(exc)
    answer["seconds"] = round(time.monotonic() - started, 3)
    return answer


def within(fn: Callable[[], None], seconds: float) -> None:
    """`fn()`, or TimeoutError once `seconds` have passed: a backend retrying on its own (botocore and s3fs retry a
    refused connection with backoff) would otherwise run past the deadline, and the supervisor would end the helper
    before it could say how many attempts it made and why they failed. The attempt left running is a daemon thread:
    it ends with the helper's process."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller
            box.append(exc)

    thread = threading.Thread(target=run, name="blackbox-push", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        raise TimeoutError
    if box:
        raise box[0]


def main() -> None:
    try:
        request = json.loads(sys.stdin.read())
        answer = push(request)
    except Exception as exc:  # a bug here is said in the answer, never as a traceback on the job's terminal
        answer = {"ok": False, "error": f"internal error: {describe_error(exc)}", "attempts": 0, "seen": []}
    sys.stdout.write(json.dumps(answer, default=str) + "\n")
    sys.stdout.flush()
    # answered: no backend's exit hooks or attempt left running (a daemon thread in a retry's sleep, fsspec's event
    # loop) may hold the process past the caller's deadline
    os._exit(0)


if __name__ == "__main__":
    main()
