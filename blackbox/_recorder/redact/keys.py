"""Key blocks: PEM and OpenSSH private keys, whole or one line per write; the markers stay, the body goes.
Stdlib only; imports common."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from .common import REDACTED, _State

# PEM and OpenSSH private keys, one line per write or JSON-escaped on one line: the markers stay (they say a key
# was there), the body goes. The body is a run of base64 lines (at least 16 characters each, the last may be
# shorter before the END marker) and the headers of encrypted keys — so a BEGIN with no body, in an error
# message about a bad key file, keeps everything after it.
_PEM_SEP = r"(?:[ \t\r\n]|\\[rn])+(?:\[[A-Za-z0-9_,.\- ]{1,32}\]:?[ \t]*)?"  # torchrun's `[rank0]:` prefix
_PEM_BEGIN = r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
_PEM_END = r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
_PEM = re.compile(
    "(" + _PEM_BEGIN + ")"
    "((?:" + _PEM_SEP + r"(?:(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset): ?[^\r\n\\]{0,200}"
    r"|[A-Za-z0-9+/=]{16,}(?=[ \t\r\n\\]|$)))*"
    "(?:" + _PEM_SEP + "[A-Za-z0-9+/=]{1,15}(?=" + _PEM_SEP + _PEM_END + "))?)"
    "(" + _PEM_SEP + _PEM_END + ")?"
)  # fmt: skip
_PEM_END_RE = re.compile(_PEM_END)
_PEM_BODY_LINE = re.compile(
    r"(?:\[[A-Za-z0-9_,.\- ]{1,32}\]:?)?[ \t]*(?:[A-Za-z0-9+/]{16,128}={0,2}|"
    r"[A-Za-z0-9+/]{1,15}={1,2}|(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset):.*)?"
    r"[ \t]*\r?"
)  # a line of base64 (a short one ends with padding), or a header


_ONLY_SPACE = re.compile(r"\s*\Z")  # read from a position: never a copy of the rest per key


def _pem(text: str) -> Tuple[str, Optional[_State]]:
    out: List[str] = []
    pos = 0
    state: Optional[_State] = None
    for m in _PEM.finditer(text):
        body = m.group(2)
        out.append(text[pos : m.start()])
        if body:
            sep = re.match(_PEM_SEP, body)
            out.append(m.group(1) + (sep.group() if sep else "\n") + REDACTED + (m.group(3) or ""))
        else:
            out.append(m.group(0))
        pos = m.end()
        if m.group(3) is None and _ONLY_SPACE.match(text, pos):  # the key goes on in the next write
            state = _State("pem", marked=bool(body))
    out.append(text[pos:])
    return "".join(out), state
