"""Lines that say what the next lines hold (a YAML block under a secret key, a .netrc entry, a Kubernetes env
entry, a key printed line by line), kept from line to line and bounded. Stdlib only; imports common, names, keys."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from .common import REDACTED, _State
from .keys import _PEM_BODY_LINE, _PEM_END_RE
from .names import _DESCRIBES, PHRASE, SECRET, WEAK, _harmless, _kind, _words

_BLOCK_START = re.compile(
    r"(?m)^([ \t]*)(?:-[ \t]+)?([\"']?)([A-Za-z0-9_.\-]{1,64})\2[ \t]*:[ \t]*(?:!!?[A-Za-z0-9]{1,16}[ \t]+)?"
    r"([|>][-+0-9]{0,3})?[ \t]*\r?$"
)
_PPK_START = re.compile(r"(?m)^[ \t]*Private-Lines:[ \t]*([0-9]{1,3})[ \t]*\r?$")  # PuTTY .ppk
_NETRC_START = re.compile(r"(?m)^[ \t]*(?:machine[ \t]+\S+|default)(?:[ \t]|\r?$)")
_ENV_NAME = re.compile(r"(?m)^[ \t]*(?:-[ \t]+)?name:[ \t]*([\"']?)([A-Za-z_][A-Za-z0-9_.\-]{0,63})\1[ \t]*\r?$")
_NETRC_ITEM = re.compile(r"([ \t]*(login|password|account|port|protocol|machine|default)(?:[ \t]+))(\S*)(.*)")
_ENV_VALUE = re.compile(r"([ \t]*value[ \t]*:[ \t]*)(.*?)([ \t]*\r?)$")
_YAML_ITEM = re.compile(r"([ \t]*-[ \t]+)(\S.*?)([ \t]*\r?)$")
_YAML_PAIR = re.compile(r"([ \t]*(?:-[ \t]+)?[\"']?[A-Za-z0-9_.\-]+[\"']?[ \t]*:[ \t]*)(.*?)([ \t]*\r?)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _state_line(line: str, state: _State) -> Tuple[Optional[str], Optional[_State]]:
    """One line (without its newline) under a state: (what to write instead, or None when the state ends before
    this line and the line is redacted as any other; the state after it)."""
    state.left -= 1
    if state.kind == "pem":
        if _PEM_END_RE.search(line):
            return line, None
        if not _PEM_BODY_LINE.fullmatch(line):
            return None, None  # not a key line: the key ended without its END marker
        nxt: Optional[_State] = state if state.left > 0 else None
        if not line.strip():
            return line, nxt
        if state.marked:
            return "\x00", nxt  # dropped: the marker for the whole key is already written
        state.marked = True
        return REDACTED, nxt
    if state.kind == "netrc":
        m = _NETRC_ITEM.fullmatch(line)
        if not m or m.group(2) in ("machine", "default"):
            return None, None
        nxt = state if state.left > 0 else None
        if m.group(2) in ("password", "account") and m.group(3) and not _harmless("password", m.group(3), PHRASE):
            return m.group(1) + REDACTED + m.group(4), nxt
        return line, nxt
    if state.kind == "env":
        m = _ENV_VALUE.fullmatch(line)
        if m:
            kind = _kind(state.name)
            value = m.group(2)
            if value and not _harmless(state.name, value, kind):
                return m.group(1) + REDACTED + m.group(3), None
            return line, None
        if line.strip().startswith(("valueFrom", "- ")) or state.left <= 0:
            return None, None
        return line, state
    # yaml: the lines indented under a secret key (or list items at its own indentation)
    body = line.rstrip("\r")
    if not body.strip():
        return line, state if state.left > 0 else None
    own = _indent(body)
    if own < state.indent or (own == state.indent and (state.scalar or not body.lstrip().startswith("- "))):
        return None, None
    nxt = state if state.left > 0 else None
    if state.scalar:
        return body[:own] + REDACTED + line[len(body) :], nxt
    item = _YAML_ITEM.fullmatch(line)
    if item and ":" not in item.group(2).split(" ", 1)[0]:
        return item.group(1) + REDACTED + item.group(3), nxt
    pair = _YAML_PAIR.fullmatch(line)
    if pair:
        value = pair.group(2)
        if not value or value in ("|", ">") or not _nested_secret(pair.group(1).strip(" \t-:\"'"), value):
            return line, nxt
        return pair.group(1) + REDACTED + pair.group(3), nxt
    return body[:own] + REDACTED + line[len(body) :], nxt


def _nested_secret(name: str, value: str) -> bool:
    """A field inside a secret table (`credentials:`, `auth:`): its value goes unless the field only names or
    describes (`name`, `type`, `user`, `region`, `key_id` of a secret reference) or the value is harmless."""
    kind = _kind(name)
    if kind >= SECRET:
        return not _harmless(name, value, kind)
    if not kind and _words(name)[-1:] and _words(name)[-1] in _DESCRIBES:
        return False
    return not _harmless("password", value, PHRASE)


def _walk(text: str, pos: int, state: _State, out: List[str]) -> Tuple[int, Optional[_State]]:
    """Lines from `pos` under `state` until it ends: appended to `out`; returns where the rest begins."""
    current: Optional[_State] = state
    while current is not None and pos < len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        line = text[pos:end]
        replaced, current = _state_line(line, current)
        if replaced is None:
            return pos, None
        if replaced != "\x00":
            out.append(replaced + ("\n" if nl >= 0 else ""))
        pos = end + (1 if nl >= 0 else 0)
    return pos, current


def _blocks(text: str) -> Tuple[str, Optional[_State]]:
    """Find the lines that open a block (a secret YAML key, a .netrc machine, a Kubernetes env name) and redact
    what the following lines hold; returns the state still open at the end of the text."""
    starts: List[Tuple[int, int, _State]] = []
    for m in _BLOCK_START.finditer(text):
        if _kind(m.group(3)) >= SECRET:
            indent = len(m.group(1).expandtabs())
            starts.append((m.start(), m.end(), _State("yaml", indent=indent, scalar=m.group(4) is not None)))
    if "Private-Lines" in text:
        for m in _PPK_START.finditer(text):
            if int(m.group(1)):
                starts.append((m.start(), m.end(), _State("pem", left=int(m.group(1)))))
    if "machine" in text or "default" in text:
        for m in _NETRC_START.finditer(text):
            starts.append((m.start(), m.end(), _State("netrc")))
    if "name" in text:
        for m in _ENV_NAME.finditer(text):
            if _kind(m.group(2)) >= WEAK:
                starts.append((m.start(), m.end(), _State("env", name=m.group(2))))
    if not starts:
        return text, None
    starts.sort(key=lambda s: s[0])
    out: List[str] = []
    pos = 0
    state: Optional[_State] = None
    for start, end, opened in starts:
        if start < pos:
            continue
        nl = text.find("\n", end)
        if nl < 0:  # the opening line is the last: the block goes on in the next write
            state = opened
            continue
        out.append(text[pos : nl + 1])
        pos, state = _walk(text, nl + 1, opened, out)
    out.append(text[pos:])
    return "".join(out), state
