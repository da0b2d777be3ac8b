"""Secret redaction: credential-looking variable names and token-looking values are replaced before
anything reaches disk. Pure functions; imports only the stdlib."""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|(^|_)KEY($|_)|APIKEY|API_KEY|CREDENTIAL|AUTH|COOKIE|SESSION|"
    r"PRIVATE|SIGNATURE|(^|_)PAT($|_)|WEBHOOK|DSN)",
    re.IGNORECASE,
)
# Values that are secrets whatever their name: known token formats.
_SECRET_VALUES = [
    re.compile(p)
    for p in (
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
        r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
        r"\bhf_[A-Za-z0-9]{30,}\b",  # Hugging Face
        r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",  # GitHub
        r"\bgithub_pat_[A-Za-z0-9_]{40,}\b",
        r"\bglpat-[A-Za-z0-9_\-]{20,}\b",  # GitLab
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b",  # Slack
        r"\bsk-(proj-|ant-)?[A-Za-z0-9_\-]{20,}\b",  # OpenAI / Anthropic style
        r"\bAIza[0-9A-Za-z_\-]{35}\b",  # Google API key
        r"\bya29\.[0-9A-Za-z_\-]{20,}\b",  # Google OAuth
        r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\b",  # JWT
        r"\bwandb_v1_[A-Za-z0-9_]{20,}\b",
    )
]
# `Bearer xyz`, `token=xyz`, `--api-key xyz`, `password: xyz` in free text and command lines.
_KEYED_VALUE = re.compile(
    r"(?i)(\bbearer\s+|\bbasic\s+|"
    r"(?:--?|\b)[a-z0-9_\-]*(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|credential|auth)"
    r"[a-z0-9_\-]*[\"']?\s*[=:]\s*[\"']?(?:(?:bearer|basic|token)\s+)?|"
    r"--[a-z0-9_\-]*(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|credential)[a-z0-9_\-]*\s+)"
    r"([^\s\"',;]+)"
)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^/\s@]+)(@)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    """Replace token-looking values and `key=value` secrets in free text (logs, command lines, configs)."""
    for pattern in _SECRET_VALUES:
        text = pattern.sub(REDACTED, text)
    text = _KEYED_VALUE.sub(lambda m: m.group(1) + REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


_CONFIG_LINE = re.compile(r"^(\s*[\"']?)([A-Za-z0-9_.\-]+)([\"']?\s*[:=]\s*)(\S.*?)(\s*,?\s*)$")


def redact_config(text: str) -> str:
    """A config file (YAML, TOML, INI, JSON, .env): values of credential-named keys replaced, then the
    token formats and `key=value` secrets of free text."""
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _CONFIG_LINE.match(body)
        if m and is_secret_name(m.group(2)) and m.group(4) not in ("{", "[", "|", ">"):
            body = m.group(1) + m.group(2) + m.group(3) + REDACTED + m.group(5)
            line = body + line[len(line.rstrip("\r\n")) :]
        lines.append(line)
    return redact_text("".join(lines))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v)) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with secret values replaced, the flag that names them kept."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-").replace("-", "_")):
            out.append(arg)
            hide_next = True
            continue
        if arg.startswith("-") and "=" in arg:
            flag, _, value = arg.partition("=")
            if is_secret_name(flag.lstrip("-").replace("-", "_")) and value:
                out.append(flag + "=" + REDACTED)
                continue
        out.append(redact_text(arg))
    return out
