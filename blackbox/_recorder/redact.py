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
# `Bearer xyz`, `token=xyz`, `--api-key xyz`, `password: xyz` in free text and command lines. Linear in the text
# whatever it holds (a 64 KiB line, a row of 6,000 dashes): a key is a whole word (it starts where no word character
# stands before it, and is at most 64 long), so no start position is tried twice; which keys are secret is decided
# by a second, small match on the key alone.
_WORD_START = r"(?<![A-Za-z0-9_\-])"
_KEYED_VALUE = re.compile(
    r"(?i)"
    + _WORD_START
    + r"(bearer|basic)(\s+)([^\s\"',;]+)|"  # Authorization: Bearer xyz
    + _WORD_START
    + r"(--?)?([A-Za-z0-9_][A-Za-z0-9_\-]{0,63})"  # a key word: api_key, --hf-token, TOKEN
    r"([\"']?[ \t]*[=:][ \t]*[\"']?(?:(?:bearer|basic|token)[ \t]+)?)([^\s\"',;]+)|"  # = or : and the value
     + _WORD_START + r"(--)([A-Za-z0-9_][A-Za-z0-9_\-]{0,63})([ \t]+)([^\s\"',;\-][^\s\"',;]*)"  # --flag value
)
_SECRET_KEY = re.compile(r"(?i)token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|credential|auth")
_FLAG_ONLY_KEY = re.compile(r"(?i)token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|credential")  # `--x VALUE`


def _keyed(m: re.Match[str]) -> str:
    if m.group(1) is not None:  # Bearer / Basic
        return m.group(1) + m.group(2) + REDACTED
    if m.group(5) is not None:  # key=value, key: value
        dashes, key, sep, pattern = m.group(4) or "", m.group(5), m.group(6), _SECRET_KEY
    else:  # --flag value
        dashes, key, sep, pattern = m.group(8), m.group(9), m.group(10), _FLAG_ONLY_KEY
    return dashes + key + sep + REDACTED if pattern.search(key) else m.group(0)


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]{0,30}://[^/\s:@]{1,256}:)([^/\s@]{1,256})(@)", re.IGNORECASE)


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


# What any match of the patterns above must contain, lower-cased: text with none of them is left as it is after
# one fast substring scan each — a chatty job's output costs no regular expression at all.
_CANDIDATES = ("token", "secret", "passw", "key", "credential", "auth", "bearer", "basic", "-----begin", "akia",
               "asia", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "sk-", "aiza",
               "ya29.", "eyj", "wandb_v1_", "://")  # fmt: skip
_BY_LINE = 4096  # longer texts are matched line by line: only the lines with a candidate pay for the patterns


def _candidate(lower: str) -> bool:
    return any(c in lower for c in _CANDIDATES)


def _patterns(text: str) -> str:
    for pattern in _SECRET_VALUES:
        text = pattern.sub(REDACTED, text)
    text = _KEYED_VALUE.sub(_keyed, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def redact_text(text: str) -> str:
    """Replace known secret values, token-looking values and `key=value` secrets in free text (logs, command
    lines, configs, exception messages). Linear in the text: a scan for candidates first, the patterns only
    where one is (whole, when a PEM block may span lines)."""
    for known in _KNOWN:
        if known in text:
            text = text.replace(known, REDACTED)
    lower = text.lower()
    if not _candidate(lower):
        return text
    if len(text) <= _BY_LINE or "-----begin" in lower or "\n" not in text:
        return _patterns(text)
    return "".join(_patterns(line) if _candidate(line.lower()) else line for line in text.splitlines(keepends=True))
