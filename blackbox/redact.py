"""Secret redaction on the host side: the shared patterns (blackbox/_recorder/redact.py) plus environments,
command lines and config files. Pure functions; imports only the stdlib and the shared patterns."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._recorder.redact import REDACTED, is_secret_name, redact_text, remember_secrets

__all__ = ["REDACTED", "is_secret_name", "redact_argv", "redact_config", "redact_env", "redact_text",
           "remember_secrets"]  # fmt: skip

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
