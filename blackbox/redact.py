"""Secret redaction on the host side: the shared rules (blackbox/_recorder/redact.py) plus environments, command
lines and config files. Pure functions; imports only the stdlib and the shared rules."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._recorder.redact import (
    REDACTED,
    StreamRedactor,
    _harmless,
    _kind,
    add_known_secret,
    add_known_secrets,
    is_secret_name,
    redact_json_text,
    redact_text,
    redact_value,
)

__all__ = [
    "REDACTED",
    "StreamRedactor",
    "add_known_secret",
    "add_known_secrets",
    "is_secret_name",
    "redact_argv",
    "redact_config",
    "redact_env",
    "redact_json_text",
    "redact_text",
    "redact_url",
    "redact_value",
]  # fmt: skip

# one `key: value` / `key = value` / `"key": value` line of YAML, TOML, INI, .env or JSON
_CONFIG_LINE = re.compile(r"^(\s*(?:export\s+)?[\"']?)([A-Za-z0-9_.\-]+)([\"']?\s*[:=]\s*)(.*?)(\s*,?\s*)$")
_LIST_ITEM = re.compile(r"^(\s*-\s+)(\S.*)$")
_TOML_MULTILINE = ('"""', "'''")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _redact_nested(line: str) -> str:
    """A line inside the block of a secret key: its value goes, its key or list dash stays (the file still
    parses, and says which fields there were)."""
    body = line.rstrip("\r\n")
    end = line[len(body) :]
    item = _LIST_ITEM.match(body)
    if item:
        return item.group(1) + REDACTED + end
    m = _CONFIG_LINE.match(body)
    if m and m.group(4):
        return m.group(1) + m.group(2) + m.group(3) + REDACTED + m.group(5) + end
    if m or not body.strip():
        return line
    return body[: _indent(body)] + REDACTED + end


def redact_config(text: str) -> str:
    """A config file (YAML, TOML, INI, JSON, .env): JSON is redacted as data (it still parses); the others line
    by line: the value of a credential-named key replaced, and with it a YAML block scalar (`key: |`), the list
    or table indented under the key, or a TOML multi-line string; then the token formats and keyed secrets of
    free text. The lines stay where they were."""
    if text.lstrip().startswith(("{", "[")):
        redacted = redact_json_text(text)
        if redacted is not None:
            return redacted
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.rstrip("\r\n")
        m = _CONFIG_LINE.match(body)
        i += 1
        if not m or not _kind(m.group(2)):
            out.append(line)
            continue
        value = m.group(4)
        head = m.group(1) + m.group(2) + m.group(3)
        closing = next((q for q in _TOML_MULTILINE if value.startswith(q)), None)
        if closing and closing not in value[3:]:  # TOML: password = """ … """
            out.append(head + value[:3] + REDACTED + line[len(body) :])
            while i < len(lines) and closing not in lines[i]:
                i += 1
            if i < len(lines):
                out.append(lines[i][lines[i].index(closing) :])
                i += 1
            continue
        if value in ("", "|", ">") or (value[:1] in ("|", ">") and len(value) <= 3):  # a YAML block under the key
            out.append(line)
            own = _indent(body)
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > own):
                nested = lines[i]
                if value and nested.strip():  # a block scalar: every line of it is the value
                    nested = nested[: _indent(nested)] + REDACTED + nested[len(nested.rstrip("\r\n")) :]
                out.append(_redact_nested(nested) if not value else nested)
                i += 1
            continue
        if _harmless(m.group(2), value) or value[:1] in ("{", "["):
            out.append(line)  # a flag, or a table / list on one line: the free-text pass redacts those whole
            continue
        out.append(head + REDACTED + m.group(5) + line[len(body) :])
    return redact_text("".join(out))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and not _harmless(k, v) else redact_text(v)) for k, v in env.items()}


def redact_url(url: str) -> str:
    """A URL as it may be shown: its scheme and host, the rest (path, query, user and password) redacted."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)(?:[^/@]*@)?([^/?#]*)", url)
    return f"{m.group(1)}{m.group(2)}/{REDACTED}" if m else REDACTED


_PASSWORD_FLAGS = ("-p",)  # mysql, and others: a password in the next word unless it is a number (a port)
_USER_FLAGS = ("-u", "--user")  # curl -u user:password


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with secret values replaced, the flag that names them kept (a number after `-p` is a
    port, `True` after a token flag a switch: both kept)."""
    out: list[str] = []
    flag = ""  # the flag whose value is the next word: a secret (`--hf-token`, `-p`) or a user (`-u`)
    for arg in argv:
        key, eq, value = arg.partition("=")
        name = key.lstrip("-")
        if flag in _USER_FLAGS:
            out.append(arg.split(":", 1)[0] + ":" + REDACTED if ":" in arg else redact_text(arg))
        elif flag:
            harmless = (flag in _PASSWORD_FLAGS and arg.isdigit()) or _harmless(flag.lstrip("-"), arg)
            out.append(arg if harmless else REDACTED)
        elif arg.startswith("-") and not eq and (arg in _USER_FLAGS or arg in _PASSWORD_FLAGS or _kind(name)):
            out.append(arg)
            flag = arg
            continue
        elif arg.startswith("-") and eq and _kind(name) and not _harmless(name, value):
            out.append(key + "=" + REDACTED)
        else:
            out.append(redact_text(arg))
        flag = ""
    return out
