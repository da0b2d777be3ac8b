"""The stream state: redaction of a stream read in pieces (a job's console), one StreamRedactor per stream,
holding back a partial line and what a line says about the next. Stdlib only; imports common and text."""

from __future__ import annotations

from typing import Callable, Optional

from .common import _State
from .text import _failed, _scrub, redact_text


class StreamRedactor:
    """redact_text for a stream read in pieces (a job's console), keeping what a line says about the next ones: a
    private key whose lines arrive in separate writes loses its body from BEGIN to END (the markers and one
    `<redacted>` line stay, so nothing goes silently; a BEGIN with no body, or a key cut short, never swallows
    what follows — at most MAX_KEY_LINES), a YAML block under a secret key, a .netrc entry, a Kubernetes env entry.

    `feed(text)` returns what is complete and holds back a partial last line (at most MAX_LINE characters) so
    that a secret split across writes is caught; `flush()` returns the rest. Calling the object
    (`redactor(text)`) redacts `text` whole, holding nothing back (for callers that cut at line ends themselves)."""

    MAX_LINE = 64 * 1024  # a partial line longer than this is redacted and passed on in pieces

    def __init__(self, redact: Optional[Callable[[str], str]] = None) -> None:
        self._redact = redact
        self._state: Optional[_State] = None
        self._partial = ""

    def _run(self, text: str) -> str:
        if not text:
            return ""
        try:
            if self._redact is not None and self._redact is not redact_text:
                return self._redact(text)
            out, self._state = _scrub(text, self._state)
            return out
        except Exception as exc:  # pragma: no cover
            self._state = None
            return _failed(exc)

    def __call__(self, text: str) -> str:
        return self._run(self.flush_raw() + text)

    def feed(self, text: str) -> str:
        buf = self._partial + text
        cut = buf.rfind("\n") + 1
        if not cut and len(buf) > self.MAX_LINE:  # one endless line: cut at a space near the end if there is one
            space = max(buf.rfind(" ", len(buf) - 4096), buf.rfind("\t", len(buf) - 4096))
            cut = space + 1 if space > 0 else len(buf)
        self._partial = buf[cut:]
        return self._run(buf[:cut])

    def flush(self) -> str:
        return self._run(self.flush_raw())

    def flush_raw(self) -> str:
        partial, self._partial = self._partial, ""
        return partial
