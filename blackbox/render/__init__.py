"""Renderers: each takes the report model and a sink. No analysis here. Bundles are untrusted: every renderer
shows bundle text as text (never as markup, HTML or an escape sequence), through `printable`."""

from __future__ import annotations

import re

# C0 controls but the tab (ESC starts a terminal sequence; a newline would forge a line of the report), DEL, C1
# controls (0x9b is a one-byte CSI), line separators, and the bidirectional overrides that reorder what is shown
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` with its control characters written out (`\\x1b`, `\\u202e`): visible, and inert."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        str(text))  # fmt: skip
