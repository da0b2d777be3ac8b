"""Records, command lines and environments: redacted as data, by what their names say. Stdlib only; imports
the rooms beside it."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .common import REDACTED
from .context import _flag_kind, tool_secrets
from .known import _client_ids_with_secret
from .lines import _nested_secret
from .names import NONE, PHRASE, SECRET, WEAK, _credential_like, _harmless, _kind
from .text import _failed, redact_text

# --- records, command lines, environments ------------------------------------------------------------------
MAX_DEPTH = 64  # a record nested deeper is redacted as its text


def redact_value(value: Any, name: str = "", _depth: int = 0) -> Any:
    """A record redacted as data, not as its encoded text: the value of a secret-named key replaced whole (a
    table of credentials too), a command line (a list of strings with flags) as a command line, every string
    redacted as text, anything else as its repr. The result encodes to JSON that still parses, with every number
    and harmless name intact. Nested deeper than MAX_DEPTH, a part is redacted as text (and says so)."""
    try:
        return _value(value, _depth)
    except RecursionError:
        return REDACTED + " (nested too deep to redact as data)"
    except Exception as exc:  # pragma: no cover
        return _failed(exc)


def _value(value: Any, depth: int, inside: bool = False) -> Any:
    """`inside`: a part of a secret-named table, whose fields are secret unless they only name or describe."""
    if depth > MAX_DEPTH:
        try:
            text = json.dumps(value, default=repr)
        except (RecursionError, ValueError, TypeError):
            return REDACTED + " (nested too deep to redact as data)"
        return redact_text(text)
    if isinstance(value, dict):
        names = [str(k) for k in value]
        client_ids = _client_ids_with_secret(names)
        env_name = _env_entry_name(value)
        out = {}
        for k, v in value.items():
            key = str(k)
            kind = SECRET if key in client_ids else _kind(key)
            scalar = isinstance(v, (str, bool, int, float)) or v is None
            if env_name is not None and key.lower() == "value" and scalar:
                kind = max(_kind(env_name), NONE)
            if kind >= SECRET and isinstance(v, (dict, list, tuple)):
                out[redact_text(key) if isinstance(k, str) else k] = _value(v, depth + 1, inside=True)
                continue
            if inside and kind <= WEAK and isinstance(v, str):
                secret = _nested_secret(key, v)
            elif kind == WEAK:
                secret = isinstance(v, str) and not _harmless(key, v, WEAK)
            else:
                secret = kind >= SECRET and not (scalar and _harmless(key, str(v), kind))
            nested = inside and isinstance(v, (dict, list, tuple))
            out[redact_text(key) if isinstance(k, str) else k] = REDACTED if secret else _value(v, depth + 1, nested)
        return out
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, str) for v in value) and any(v.startswith("-") for v in value):
            return redact_argv(list(value))
        return [_value(v, depth + 1, inside) for v in value]
    if isinstance(value, str):
        if inside and not _harmless("password", value, PHRASE):
            return REDACTED
        return redact_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        return redact_text(repr(value))
    except RecursionError:
        return REDACTED + " (nested too deep to redact as data)"


def _env_entry_name(value: Dict[Any, Any]) -> Optional[str]:
    """A Kubernetes / ECS environment entry ({"name": "WANDB_API_KEY", "value": …}): its variable's name."""
    if len(value) > 4:
        return None
    for k in ("name", "Name"):
        if isinstance(value.get(k), str) and ("value" in value or "Value" in value):
            return str(value[k])
    return None


_USER_FLAGS = ("-u", "--user")  # curl -u user:password


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with secret values replaced, the flag that names them kept: `--hf-token X`,
    `--api_key=X`, `-u user:X`, and the passwords the tools of _TOOLS take (`mysql -pX`, `docker login -p X`,
    `wandb login KEY`); `-p` of any other program (`mkdir -p`, `pytest -p`, `ssh -p 2222`) is left alone."""
    try:
        return _argv([str(a) for a in argv])
    except Exception as exc:  # pragma: no cover
        return [_failed(exc)]


def _argv(argv: List[str]) -> List[str]:
    secret = tool_secrets(argv)
    out: List[str] = []
    flag = ""  # a flag whose value is the next word: a secret (`--hf-token`) or a user (`-u`)
    kind = NONE
    for i, arg in enumerate(argv):
        if i in secret:
            out.append(arg[: secret[i]] + REDACTED)
            flag = ""
            continue
        if flag and (not arg.startswith("-") or (flag not in _USER_FLAGS and _credential_like(arg))):
            if flag in _USER_FLAGS:
                out.append(arg.split(":", 1)[0] + ":" + REDACTED if ":" in arg else redact_text(arg))
            else:
                out.append(redact_text(arg) if _harmless(flag.lstrip("-"), arg, kind) else REDACTED)
            flag = ""
            continue
        flag = ""
        key, eq, value = arg.partition("=")
        name = key.lstrip("-")
        if arg.startswith("-") and not eq and (arg in _USER_FLAGS or _flag_kind(name)):
            kind = _flag_kind(name)
            out.append(arg)
            flag = arg
        elif arg.startswith("-") and eq and _flag_kind(name) and not _harmless(name, value, _flag_kind(name)):
            out.append(key + "=" + REDACTED)
        else:
            out.append(redact_text(arg))
    return out


def redact_named(name: str, value: str) -> str:
    """One named value (a variable, a field): gone when the name holds a secret (for WEAK names, when the value
    looks random), else redacted as text."""
    kind = _kind(name)
    return REDACTED if kind and not _harmless(name, value, kind) else redact_text(value)


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    """An environment with the values of its credential-named variables replaced (and `X_CLIENT_ID` beside
    `X_CLIENT_SECRET`), the others redacted as text."""
    client_ids = _client_ids_with_secret(env)
    out = {}
    for k, v in env.items():
        kind = SECRET if k in client_ids else _kind(k)
        out[k] = REDACTED if kind and not _harmless(k, v, kind) else redact_text(v)
    return out


def redact_json_text(text: str) -> Optional[str]:
    """A JSON document redacted as data: the text itself when nothing in it is secret, else the redacted data
    encoded again (it still parses); None when it is not JSON, or nested deeper than MAX_DEPTH (redact it as
    text then)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if _depth(data) > MAX_DEPTH:
        return None
    redacted = redact_value(data)
    try:
        same = redacted == data
    except RecursionError:  # pragma: no cover
        same = False
    return text if same else json.dumps(redacted, indent=1) + ("\n" if text.endswith("\n") else "")


def _depth(data: Any) -> int:
    """How deep a parsed JSON document nests (without recursion)."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest
