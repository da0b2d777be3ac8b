"""Values the job is known to hold (its environment's credentials and what blackbox._recorder.credentials feeds
in) and the forms they take on the way, scrubbed in one pass. Stdlib only; imports the names and context rooms."""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Set

from .common import _trie
from .context import _URL_USERINFO
from .names import SECRET, WEAK, _harmless, _kind, _looks_random, _worth_knowing

# --- known values ---------------------------------------------------------------------------------------------
# The job's own credentials (its environment, the stores its tools keep, its config files): scrubbed wherever
# they show up, whatever their format — and in the forms they take on the way (JSON-escaped, URL-encoded,
# base64 at any alignment inside a longer blob) — in one pass of one regular expression (a trie of the forms).
_KNOWN: Set[str] = set()
_known_re: Optional[re.Pattern[str]] = None
_known_built = 0  # len(_KNOWN) when _known_re was built
MIN_KNOWN_LEN = 6  # shorter values ("1", "true") would scrub ordinary words
_MAX_KNOWN = 8192  # forms kept (a few hundred credentials)
_MIN_B64_CORE = 12


def _forms(value: str) -> List[str]:
    from urllib.parse import quote, quote_plus

    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], quote(value, safe=""),
             quote(value), quote_plus(value)}  # fmt: skip
    forms.add(json.dumps(json.dumps(value)[1:-1])[1:-1])  # a JSON string inside a JSON string
    raw = value.encode("utf-8", "surrogateescape")
    for lead in range(3):  # the base64 of the value inside a longer blob, at each alignment: what only it decides
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            enc = encode(b"\0" * lead + raw).decode()
            core = enc[4 if lead else 0 : 4 * ((lead + len(raw)) // 3)]
            if len(core) >= _MIN_B64_CORE:
                forms.add(core)
            if not lead:
                forms.add(enc)  # the value's own base64, padding and all
                forms.add(enc.rstrip("="))
    return [f for f in forms if len(f) >= MIN_KNOWN_LEN]


def add_known_secret(value: str) -> None:
    """Scrub `value` (and its JSON-escaped, URL-encoded and base64 forms) from everything redacted from now on."""
    if not isinstance(value, str) or len(value) < MIN_KNOWN_LEN or len(_KNOWN) >= _MAX_KNOWN:
        return
    _KNOWN.update(_forms(value))
    for line in value.splitlines():  # a multi-line value (a key file) also line by line, as it is printed
        if line != value and _worth_knowing(line) and len(line) >= 16:
            _KNOWN.update(_forms(line))


def _known_pattern() -> Optional[re.Pattern[str]]:
    global _known_re, _known_built
    if _known_built != len(_KNOWN):
        words = sorted(_KNOWN)
        try:
            _known_re = re.compile(_trie(words))
        except (RecursionError, re.error, OverflowError):  # pathologically nested prefixes: a plain alternation
            _known_re = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
        _known_built = len(_KNOWN)
    return _known_re


def add_env_secrets(env: Mapping[str, str]) -> int:
    """Learn the values of `env`'s credential-named variables (a URL's password rather than the URL; an OAuth
    client's id beside its secret), so that every text redacted from now on loses them. The stores a user keeps
    are fed in by blackbox._recorder.credentials.add_known_secrets. Returns how many forms are now known."""
    client_ids = _client_ids_with_secret(env)
    for name, raw in env.items():
        value: Any = raw  # an environment may hold anything when it was not the process's own
        if not isinstance(value, str):
            continue
        kind = _kind(name)
        if name in client_ids or (kind >= SECRET and not _harmless(name, value, kind)):
            for part in _secret_parts(value):
                if _worth_knowing(part):
                    add_known_secret(part)
        elif kind == WEAK and _looks_random(value):
            add_known_secret(value)
    return len(_KNOWN)


def _secret_parts(value: str) -> List[str]:
    """What of a credential-named variable's value is the secret: a URL's password rather than the URL."""
    m = _URL_USERINFO.search(value)
    if m and m.group(2):
        return [m.group(2)[1:]]
    return [value]


def _client_ids_with_secret(names: Iterable[str]) -> Set[str]:
    """`X_CLIENT_ID` beside `X_CLIENT_SECRET` (one OAuth client): the id is part of the credential."""
    names = list(names)
    lowered = {n.lower().replace("-", "_") for n in names}
    out = set()
    for n in names:
        low = n.lower().replace("-", "_")
        if (low.endswith("client_id") and low[: -len("id")] + "secret" in lowered) or (
            low.endswith("clientid") and low[: -len("id")] + "secret" in lowered
        ):
            out.add(n)
    return out


def url_secrets(text: str) -> Iterator[str]:
    """The credentials in the URLs of a text: each password, and a user that looks random (a token as the user)."""
    for m in _URL_USERINFO.finditer(text):
        if m.group(2):
            yield m.group(2)[1:]
        elif _looks_random(m.group(1)):
            yield m.group(1)


def known_count() -> int:
    """How many forms of known values are scrubbed now."""
    return len(_KNOWN)
