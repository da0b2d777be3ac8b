"""What follows a bundle, the same for `blackbox run`, `collect` and `report`: the analysis, the incident index and
the incidents seen before it, then the alarms. Fed the bundle in memory (the writer's members and digest, or what
the reader read): nothing is read back or hashed twice. A broken index costs one warning, never the caller.
Imports the analysis, the report model, the bundle reader's model and the incident index."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Callable, Optional

from .analyze.model import Report
from .analyze.verdict import analyze
from .bundle.reader import Bundle
from .incidents.indexing import index_bundle, record_url


class Intake:
    """One bundle taken in. `report` is ready when the constructor returns; the index (and so `report.
    similar_incidents`, the "seen before" list) is written at once, or in a thread of its own with `background`
    (the index is a file other nodes and jobs write too: it may wait on their lock), then `on_seen` is called.
    `index`: the index is used at all; `record`: the bundle is added to it (else only looked up)."""

    def __init__(
        self,
        bundle: Bundle,
        warn: Callable[[str], None],
        *,
        env: Optional[Mapping[str, str]] = None,
        index: bool = True,
        record: bool = True,
        torch_fr: Optional[tuple[Optional[str], str]] = None,
        on_report: Optional[Callable[[Report], None]] = None,
        on_seen: Optional[Callable[[list[dict[str, Any]]], None]] = None,
        background: bool = False,
    ) -> None:
        self.bundle = bundle
        self._record = record
        self.report = analyze(bundle, torch_fr)
        if on_report is not None:  # the verdict is said, and the alarms raised, before the index is touched
            on_report(self.report)
        self._thread: Optional[threading.Thread] = None
        if not index:
            return
        if background:
            self._thread = threading.Thread(target=self._index, args=(warn, env, on_seen), name="blackbox-index",
                                            daemon=True)  # fmt: skip
            self._thread.start()
        else:
            self._index(warn, env, on_seen)

    def _index(self, warn: Callable[[str], None], env: Optional[Mapping[str, str]],
               on_seen: Optional[Callable[[list[dict[str, Any]]], None]]) -> None:  # fmt: skip
        seen = index_bundle(self.report, self.bundle, warn, env, add=self._record)
        self.report.similar_incidents = seen
        if on_seen is not None:
            on_seen(seen)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def record_url(self, sha256: str, url: str, warn: Callable[[str], None], env: Optional[Mapping[str, str]] = None,
                   timeout: float = 5.0) -> None:  # fmt: skip
        """Where `--upload` copied the bundle, into its index entry (once the entry is written)."""
        self.join(timeout)
        record_url(sha256, url, warn, env)
