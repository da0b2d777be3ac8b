"""The pipeline for free text: known values, then a gate that finds which rules' needles are in the text, then
the rules, in linear time; `redact_text`. Stdlib only; imports the rooms beside it."""

from __future__ import annotations

import re
from typing import Any, List, Optional, Set, Tuple

from .common import REDACTED, _apply, _State, _trie
from .context import (
    _STEM_WORDS,
    _TOOL_NEEDLES,
    _auth_calls,
    _flagged,
    _keyed,
    _name_start,
    _name_values,
    _netrc_lines,
    _pairs,
    _pgpass_lines,
    _scheme_tokens,
    _set_values,
    _table_cells,
    _tools,
    _user_flags,
    _userinfo,
    _webhooks,
    _xml_elements,
)
from .formats import _FORMATS, _aws_pairs, _formats
from .keys import _pem
from .known import _known_pattern
from .lines import _blocks, _walk
from .names import NONE, SECRET, _kind

# --- the pipeline ------------------------------------------------------------------------------------------------
# What the rules need in the text, lower-case: one trie of these finds which are there in one pass, and text with
# none of them is left as it is. None starts with `-`, `x` or a digit (a row of dashes, of x's, the numbers of a
# training log pass at full speed: the scan only stops where a needle could start); the one that would (`7z`) is
# looked for on its own.
_STEM_SET = frozenset(_STEM_WORDS)
_NEEDLES = sorted({*_STEM_WORDS, "basic", "//", "begin", "machine", "login", "user", "curl", "account", "name", "set",
                   "private-lines",
                   *(n for f in _FORMATS for n in f[0]), *_TOOL_NEEDLES})  # fmt: skip
_GATE = re.compile(_trie([n for n in _NEEDLES if not n[0].isdigit()]))
_DIGIT_NEEDLES = tuple(n for n in _NEEDLES if n[0].isdigit())
_STEM_RE = re.compile(_trie(sorted(_STEM_WORDS)))
_PIECE = 64 * 1024  # longer texts are redacted in pieces of whole lines: only pieces with a candidate pay
_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


def _lower(text: str) -> str:
    """A lower-case copy of the same length (str.lower() may grow a character such as `İ`)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


_SCHEME_WORD = re.compile(r"(?:bearer|basic|token)[ \t]")
_WORD_REST = re.compile(r"[a-z0-9_.\-]*")
_DENSE = 16  # a stem every 16 characters or more often: no filter (it would cost more than it saves)
_MAX_WORD = 64  # a longer word is left to the rules (they read at most so far)


def _live(text: str, low: str, stems: List[int]) -> Tuple[List[int], bool]:
    """The stems whose whole word may name a secret: `tokens_per_sec`, `key_dim` (most of a training log's stems)
    are dropped here once, not by each rule that reads a name and its value; and whether a word may name a
    SECRET (only then can a line open a YAML block of secrets)."""
    if len(stems) * _DENSE > len(text):  # `token:token:…`, not a log: the rules read every stem as they would
        return stems, True
    out = []
    end = -1
    keep = strong = False
    for stem in stems:
        if stem >= end:  # a new word: read once, however many stems it holds (a long base64 blob holds many)
            word = _WORD_REST.match(low, stem)
            end = word.end() if word else stem + 1
            start = _name_start(low, stem)
            kind = SECRET if start < 0 or end - start > _MAX_WORD else _kind(text[start:end].lstrip("-"))
            keep = kind != NONE
            strong = strong or kind >= SECRET
        if keep:
            out.append(stem)
    return out, strong


def _rules(text: str, low: str, found: Set[str], stems: List[int], live: List[int]) -> str:
    """The rules that need no state, each linear in the text and run only when its needle is there; their spans,
    all found on the same text, are merged and replaced at once."""
    spans = _formats(text, found)
    if "akia" in found or "asia" in found:
        spans += _aws_pairs(text)
    if "//" in found:
        spans += _webhooks(low)
        spans += _userinfo(text)
    if "user" in found or "curl" in found:
        spans += _user_flags(text)
    if found.intersection(_TOOL_NEEDLES):
        spans += _tools(text, low, found)
    if "pass" in found or "account" in found:
        spans += _netrc_lines(text)
    if text.count(":") >= 4:
        spans += _pgpass_lines(text)
    if "auth" in found or "login" in found:
        spans += _auth_calls(text, low)
    if "value" in low and ("name" in found or "key" in found):
        spans += _name_values(text, low)
    if live and ("|" in text or "\u2502" in text or "\u2503" in text):
        spans += _table_cells(text, low, live)
    if "</" in low and stems:
        spans += _xml_elements(text, low)
    if live:
        if '"' in text or "'" in text:
            spans += _pairs(text, low, live)
        spans += _keyed(text, low, live)
        spans += _flagged(text, low, live)
    if stems:
        if "set" in found:
            spans += _set_values(text, low)
        if "secret" in found and "client" in low:
            spans += _keyed(text, low, (), client_ids=True)
    if ("bearer" in found or "basic" in found or "token" in found) and _SCHEME_WORD.search(low):
        spans += _scheme_tokens(text, low)
    return _apply(text, spans)


def _piece(text: str, state: Optional[_State]) -> Tuple[str, Optional[_State]]:
    head: List[str] = []
    if state is not None:
        pos, state = _walk(text, 0, state, head)
        if state is not None or pos >= len(text):
            return "".join(head), state
        text = text[pos:]
    low = _lower(text)
    found = set(_GATE.findall(low))
    found.update(n for n in _DIGIT_NEEDLES if n in low)
    if not found and low.count(":") < 4:
        return "".join(head) + text, None
    if "begin" in found and "-----BEGIN" in text:
        text, state = _pem(text)
        low = _lower(text)
    stems = [m.start() for m in _STEM_RE.finditer(low)] if found & _STEM_SET else []
    live, strong = _live(text, low, stems) if stems else (stems, False)
    text = _rules(text, low, found, stems, live)
    if strong or "machine" in found or "name" in found or "private-lines" in found:
        text, block = _blocks(text)
        state = state or block
    return "".join(head) + text, state


def _scrub(text: str, state: Optional[_State]) -> Tuple[str, Optional[_State]]:
    pattern = _known_pattern()
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    if len(text) <= _PIECE:
        return _piece(text, state)
    out: List[str] = []
    i = 0
    while i < len(text):
        j = text.find("\n", i + _PIECE)
        j = len(text) if j < 0 else j + 1
        piece, state = _piece(text[i:j], state)
        out.append(piece)
        i = j
    return "".join(out), state


def _failed(exc: BaseException) -> str:
    return f"{REDACTED} (blackbox could not redact this text: {type(exc).__name__}; it is left out)\n"


def redact_text(text: str) -> str:
    """Replace known secret values, token formats and the values of secret-named keys, flags and arguments in
    free text (logs, command lines, configs, exception messages). Linear in the text; never raises (a bug here
    leaves the text out, and says so, rather than write it unredacted)."""
    given: Any = text
    try:
        return _scrub(given if isinstance(given, str) else str(given), None)[0]
    except Exception as exc:  # pragma: no cover - the corpus and the fuzz tests keep this unreached
        return _failed(exc)
