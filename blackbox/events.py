"""The run's event log, `events.jsonl`: one versioned JSON object per line, appended by the supervisor, redacted
as data. Imports the stdlib and blackbox.redact."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from typing import Any

EVENTS_VERSION = 1


class EventLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        self.broken = False
        from .redact import redact_value  # here, not at the top: a reader of events (a report) needs no redaction

        self._redact = redact_value

    def write(self, event: str, **fields: Any) -> None:
        """Append one record; a full disk or a closed log never raises into the supervisor."""
        now = time.time()
        record = {
            "v": EVENTS_VERSION,
            "time": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="milliseconds"),
            "t": round(now, 3),
            "event": event,
            **self._redact(fields),  # a job's command, a fatal line, the config: never a secret on disk
        }
        line = (json.dumps(record, default=str, sort_keys=False) + "\n").encode()
        with self._lock:
            if self.broken:
                return
            try:
                os.write(self._fd, line)
            except OSError:
                self.broken = True

    def close(self) -> None:
        with self._lock:
            if not self.broken:
                self.broken = True
                os.close(self._fd)


def read_events(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    out.append(record)
    except OSError:
        pass
    return out
