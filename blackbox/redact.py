"""Secret redaction on the host side: the shared rules (blackbox/_recorder/redact/: known values, token formats,
context rules, records, command lines, environments, config files, streams) plus how a URL may be shown. Pure
functions; imports only the stdlib, the shared rules and the credential stores that feed them."""

from __future__ import annotations

import re

from ._recorder.credentials import add_known_secrets, config_files, stored_secrets
from ._recorder.redact import (
    REDACTED,
    StreamRedactor,
    add_env_secrets,
    add_known_secret,
    is_secret_name,
    redact_argv,
    redact_config,
    redact_env,
    redact_json_text,
    redact_named,
    redact_text,
    redact_value,
)

__all__ = [
    "REDACTED",
    "StreamRedactor",
    "add_env_secrets",
    "add_known_secret",
    "add_known_secrets",
    "config_files",
    "is_secret_name",
    "redact_argv",
    "redact_config",
    "redact_env",
    "redact_json_text",
    "redact_named",
    "redact_text",
    "redact_url",
    "redact_value",
    "stored_secrets",
]  # fmt: skip


def redact_url(url: str) -> str:
    """A URL as it may be shown: its scheme and host, the rest (path, query, user and password) redacted."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)(?:[^/@]*@)?([^/?#]*)", url)
    return f"{m.group(1)}{m.group(2)}/{REDACTED}" if m else REDACTED
