"""What every room of redaction shares: the replacement, a span of text to replace and how spans are applied,
the state a line leaves for the next ones, and the trie that finds many words in one pass. Stdlib only."""

from __future__ import annotations

import re
from typing import List, Tuple

REDACTED = "<redacted>"

Span = Tuple[int, int, str]  # (start, end, what replaces text[start:end])

MAX_KEY_LINES = 256  # a private key printed line by line: beyond this, what follows is output again


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


def _trie(words: List[str]) -> str:
    """One regular expression matching any of `words` (sorted, distinct, non-empty), longest first, that tries
    a few characters at each position of the text whatever the number of words."""
    alts = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and words[j][0] == words[i][0]:
            j += 1
        group = words[i:j]
        prefix = _common_prefix(group[0], group[-1])  # the words are sorted: the first and last differ most
        rests = [w[len(prefix) :] for w in group]
        tails = [r for r in rests if r]
        sub = _trie(tails) if tails else ""
        if sub and len(tails) < len(rests):
            sub = "(?:" + sub + ")?"
        alts.append(re.escape(prefix) + sub)
        i = j
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _apply(text: str, spans: List[Span]) -> str:
    """Replace the spans (overlapping ones merged into one replacement)."""
    if not spans:
        return text
    spans.sort()
    out: List[str] = []
    pos = 0
    cur_start, cur_end, cur_with = spans[0]
    for start, end, with_ in spans[1:]:
        if start < cur_end:
            cur_end = max(cur_end, end)
            continue
        out.append(text[pos:cur_start])
        out.append(cur_with)
        pos = cur_end
        cur_start, cur_end, cur_with = start, end, with_
    out.append(text[pos:cur_start])
    out.append(cur_with)
    out.append(text[cur_end:])
    return "".join(out)


# --- lines that say what the next lines hold -------------------------------------------------------------------
# A YAML block under a secret key (`credentials:` then indented lines), a Kubernetes env entry (`- name:
# WANDB_API_KEY` then `value: …`), a .netrc entry over several lines, and a private key printed line by line: the
# state is kept from line to line — and, in a stream, from one write to the next — and always bounded in lines.
class _State:
    __slots__ = ("indent", "kind", "left", "marked", "name", "scalar")

    def __init__(self, kind: str, indent: int = -1, left: int = 0, marked: bool = False, scalar: bool = False,
                 name: str = "") -> None:  # fmt: skip
        self.kind = kind
        self.indent = indent
        self.left = left or {"pem": MAX_KEY_LINES, "yaml": 256, "netrc": 8, "env": 4}[kind]
        self.marked = marked
        self.scalar = scalar
        self.name = name


_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
