"""Config files (YAML, TOML, INI, .env, JSON): each `key: value` line by what its key says. Stdlib only;
imports the rooms beside it."""

from __future__ import annotations

import json
import re
from typing import Any, List, Optional

from .common import REDACTED
from .known import _client_ids_with_secret
from .lines import _indent, _nested_secret
from .names import _YAML_TAG, NONE, SECRET, _harmless, _kind
from .records import redact_json_text
from .text import _failed, redact_text

# --- config files --------------------------------------------------------------------------------------------
# one `key: value` / `key = value` / `"key": value` line of YAML, TOML, INI, .env or JSON
_CONFIG_LINE = re.compile(r"^(\s*(?:export\s+)?[\"']?)([A-Za-z0-9_.\-]+)([\"']?\s*[:=]\s*)(.*?)(\s*,?\s*)$")
_LIST_ITEM = re.compile(r"^(\s*-\s+)(\S.*)$")
_COMMENT = re.compile(r"[ \t]+[#;]")  # an inline comment after a config value
_TOML_MULTILINE = ('"""', "'''")


def _redact_nested(line: str, found: Optional[List[str]]) -> str:
    """A line inside the block of a secret key: its value goes, its key or list dash stays (the file still
    parses, and says which fields there were)."""
    body = line.rstrip("\r\n")
    end = line[len(body) :]
    item = _LIST_ITEM.match(body)
    if item:
        _found(found, item.group(2))
        return item.group(1) + REDACTED + end
    m = _CONFIG_LINE.match(body)
    if m and m.group(4):
        if m.group(4) in ("|", ">") or not _nested_secret(m.group(2), m.group(4)):
            return line
        _found(found, m.group(4))
        return m.group(1) + m.group(2) + m.group(3) + REDACTED + m.group(5) + end
    if m or not body.strip():
        return line
    _found(found, body.strip())
    return body[: _indent(body)] + REDACTED + end


def _found(found: Optional[List[str]], value: str) -> None:
    if found is not None:
        found.append(value.strip().strip("\"'"))


def redact_config(text: str, found: Optional[List[str]] = None) -> str:
    """A config file (YAML, TOML, INI, JSON, .env): JSON is redacted as data (it still parses); the others line
    by line: the value of a credential-named key replaced, and with it a YAML block scalar (`key: |`), the list
    or table indented under the key, or a TOML multi-line string; then every rule of free text. The lines stay
    where they were. The secret values replaced by the line rules are appended to `found` (to learn them)."""
    try:
        return _config(text, found)
    except Exception as exc:  # pragma: no cover
        return _failed(exc)


def _config(text: str, found: Optional[List[str]]) -> str:
    if text.lstrip().startswith(("{", "[")):
        redacted = redact_json_text(text)
        if redacted is not None:
            if found is not None:
                _json_secrets(json.loads(text), found)
            return redacted
    lines = text.splitlines(keepends=True)
    client_secret = "client" in text.lower() and "secret" in text.lower()
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.rstrip("\r\n")
        m = _CONFIG_LINE.match(body) if len(body) < 4096 else None
        i += 1
        name = m.group(2) if m else ""
        kind = _kind(name) if m else NONE
        if m and client_secret and name.lower().replace("-", "_").endswith("client_id"):
            kind = SECRET
        if not kind:
            out.append(line)
            continue
        value = m.group(4)  # type: ignore[union-attr]
        head = m.group(1) + name + m.group(3)  # type: ignore[union-attr]
        closing = next((q for q in _TOML_MULTILINE if value.startswith(q)), None)
        if closing and closing not in value[3:] and kind >= SECRET:  # TOML: password = """ … """
            out.append(head + value[:3] + REDACTED + line[len(body) :])
            while i < len(lines) and closing not in lines[i]:
                _found(found, lines[i])
                i += 1
            if i < len(lines):
                out.append(lines[i][lines[i].index(closing) :])
                i += 1
            continue
        value = _YAML_TAG.sub("", value)  # `key: !!binary |`
        if value in ("", "|", ">") or (value[:1] in ("|", ">") and len(value) <= 3):  # a YAML block under the key
            out.append(line)
            own = _indent(body)
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > own):
                nested = lines[i]
                if kind < SECRET:
                    out.append(nested)
                elif value and nested.strip():  # a block scalar: every line of it is the value
                    _found(found, nested)
                    out.append(nested[: _indent(nested)] + REDACTED + nested[len(nested.rstrip("\r\n")) :])
                else:
                    out.append(_redact_nested(nested, found) if not value else nested)
                i += 1
            continue
        if _harmless(name, _COMMENT.split(value, 1)[0], kind) or value[:1] in ("{", "["):
            out.append(line)  # a flag, or a table / list on one line: the free-text pass redacts those whole
            continue
        _found(found, value)
        out.append(head + REDACTED + m.group(5) + line[len(body) :])  # type: ignore[union-attr]
    return redact_text("".join(out))


def _json_secrets(data: Any, found: List[str]) -> None:
    """The values of a parsed JSON document's secret-named keys (without recursion), to learn them."""
    stack = [data]
    while stack and len(found) < 1024:
        item = stack.pop()
        if isinstance(item, dict):
            client_ids = _client_ids_with_secret([str(k) for k in item])
            for k, v in item.items():
                kind = SECRET if k in client_ids else _kind(str(k))
                if isinstance(v, str) and kind and not _harmless(str(k), v, kind):
                    found.append(v)
                elif isinstance(v, (dict, list)):
                    if kind >= SECRET and isinstance(v, dict):
                        found.extend(x for x in v.values() if isinstance(x, str))
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf", ".env")
