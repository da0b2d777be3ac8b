"""Secret redaction shared by both sides: credential-looking names, token-looking values, `key=value` secrets
in free text, and the values of the process's own credential-named variables. Stdlib only, Python >= 3.9:
the rank side imports it lazily (first record written), the host side through blackbox.redact."""

from __future__ import annotations

import re
from typing import Mapping

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


# Values of the job's credential-named environment variables: scrubbed wherever they show up (a job that prints
# its own password, an exception message holding a token), whatever their format.
_KNOWN: list[str] = []
MIN_KNOWN_LEN = 6  # shorter values ("1", "true") would scrub ordinary words


def remember_secrets(env: Mapping[str, str]) -> int:
    """Remember the values of `env`'s credential-named variables so redact_text removes them anywhere.
    Returns how many are now known."""
    for name, value in env.items():
        if is_secret_name(name) and len(value) >= MIN_KNOWN_LEN and value not in _KNOWN:
            _KNOWN.append(value)
    _KNOWN.sort(key=len, reverse=True)  # a longer secret first, in case one contains another
    return len(_KNOWN)


def redact_text(text: str) -> str:
    """Replace known secret values, token-looking values and `key=value` secrets in free text (logs, command
    lines, configs, exception messages)."""
    for known in _KNOWN:
        if known in text:
            text = text.replace(known, REDACTED)
    for pattern in _SECRET_VALUES:
        text = pattern.sub(REDACTED, text)
    text = _KEYED_VALUE.sub(lambda m: m.group(1) + REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
