"""Secret redaction shared by both sides: which names hold secrets (by the word that names the thing, so that
`tokenizer`, `max_tokens` and `key_dim` are left alone), token-looking values, keyed secrets in free text,
records redacted as values (they still parse), and the values of the process's own credential-named variables.
Stdlib only, Python >= 3.9: the rank side imports it lazily (first record written), the host through
blackbox.redact."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, List, Mapping, Optional

REDACTED = "<redacted>"

# --- names ---------------------------------------------------------------------------------------------------
# A name is split into lower-case words (snake, kebab, dotted and camelCase alike); the last word says what the
# thing is. `eos_token_id` is an id, `key_dim` a dimension, `TOKENIZER_NAME` a name: none is a secret.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_DESCRIBES = {"id", "ids", "name", "names", "dir", "dirs", "path", "paths", "file", "files", "type", "types",
              "dim", "dims", "size", "sizes", "len", "length", "count", "num", "index", "idx", "mask", "sock",
              "budget", "limit", "prefix", "suffix", "format", "env", "var", "field", "column", "header",
              "enabled", "required", "mode", "level", "timeout", "ttl", "expiry", "expires", "at",
              "provider"}  # fmt: skip
_ANYWHERE = ("password", "passwd", "passphrase", "secret", "credential", "webhook")  # inside any word
_STRONG = ("password", "passwd", "passphrase", "secret")  # values that may be several words (a passphrase)
_LAST = {"token", "pass", "pwd", "pw", "auth", "authorization", "cookie", "cookies", "session", "sig",
         "signature", "dsn", "pat", "creds", "apikey", "accesskey", "secretkey", "privatekey", "accountkey",
         "authtoken", "accesstoken", "refreshtoken", "sessiontoken", "bearer"}  # fmt: skip
_KEY_QUALIFIERS = {"api", "access", "secret", "private", "account", "client", "ssh", "encryption", "signing",
                   "master", "service", "subscription", "storage", "shared", "app", "license", "deploy",
                   "consumer", "auth", "sas", "gpg", "pgp", "rsa", "jwt", "hmac", "webhook", "wandb"}  # fmt: skip
# special tokens of a tokenizer (`pad_token: <pad>`), not credentials
_ML_TOKENS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "special", "added", "new", "vocab",
              "image", "img", "audio", "video", "vision", "think", "im", "system", "fim", "default", "chat", "boi",
              "eoi", "tool", "next", "prev", "first", "last", "total", "max", "min", "per", "num"}  # fmt: skip
_NOT_SECRET_NAMES = {"PWD", "OLDPWD"}  # the shell's working directories


def _words(name: str) -> List[str]:
    return [w.lower() for w in _WORDS.findall(name)]


def _kind(name: str) -> int:
    """0: not a secret; 1: a secret of one word (a token, a key); 2: a secret that may be several (a password)."""
    if name in _NOT_SECRET_NAMES:
        return 0
    words = _words(name)
    if not words or words[-1] in _DESCRIBES:
        return 0
    for word in words:
        if word.startswith("secretar"):  # secretary
            continue
        for part in _ANYWHERE:
            if part in word:
                return 2 if part in _STRONG else 1
    last = words[-1]
    if last in _LAST:
        if last == "token" and len(words) > 1 and words[-2] in _ML_TOKENS:
            return 0
        return 2 if last in ("pass", "pwd", "pw") else 1
    if last in ("key", "keys") and len(words) > 1 and words[-2] in _KEY_QUALIFIERS:
        return 1
    return 0


def is_secret_name(name: str) -> bool:
    return _kind(name) > 0


_HARMLESS = {"", "true", "false", "none", "null", "nil", "yes", "no", "on", "off", "0", "1", "-", "***",
             REDACTED.lower()}  # fmt: skip
_SPECIAL_TOKEN = re.compile(r"<\|?[^<>|\s]{1,40}\|?>|</?[A-Za-z]{1,12}>|\[[A-Za-z_]{1,20}\]")


def _harmless(name: str, value: str) -> bool:
    """A value that is no secret although its name says so: a flag (`use_auth_token=True`), an empty or already
    redacted value, a reference to a variable, and for tokens a tokenizer's special token or a token id."""
    v = value.strip().strip("\"'")
    if v.lower() in _HARMLESS or v.startswith("${") or v.startswith("os.environ"):
        return True
    if _words(name)[-1:] == ["token"]:
        return bool(_SPECIAL_TOKEN.fullmatch(v)) or (v.isdigit() and len(v) < 10)
    return False


# --- values that are secrets whatever their name ---------------------------------------------------------------
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_SECRET_VALUES = [
    re.compile(p)
    for p in (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|$)",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
        r"\bhf_[A-Za-z0-9]{30,}\b",  # Hugging Face
        r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",  # GitHub
        r"\bgithub_pat_[A-Za-z0-9_]{40,}\b",
        r"\bglpat-[A-Za-z0-9_\-]{20,}\b",  # GitLab
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b",  # Slack
        r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b",  # OpenAI / Anthropic style
        r"\bAIza[0-9A-Za-z_\-]{35}\b",  # Google API key
        r"\bya29\.[0-9A-Za-z_\-]{20,}\b",  # Google OAuth
        r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\b",  # JWT
        r"\bwandb_v1_[A-Za-z0-9_]{20,}\b",
    )
]
# webhook URLs are credentials: whoever has one can post as you. The host stays (it says where alerts went).
_WEBHOOK = re.compile(
    r"(?i)(https?://(?:hooks\.slack\.com|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks|"
    r"[a-z0-9.\-]{1,100}\.webhook\.office\.com|[a-z0-9.\-]{1,100}/[^\s\"'<>]{0,200}?webhooks?\b))"
    r"/[^\s\"'<>]{1,500}"
)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]{0,30}://[^/\s:@]{0,256}:)([^/\s@]{1,256})(@)", re.IGNORECASE)

# --- keyed secrets in free text ----------------------------------------------------------------------------------
# `token=xyz`, `password: two words`, `"api_key": "quoted"`, `Bearer xyz`, `--hf-token xyz`, `-p xyz`, `-u user:pw`.
# Linear in the text whatever it holds (a 64 KiB line, a row of 6,000 dashes): a key is a whole word (no word
# character stands before it, and it is at most 64 long), so no start position is tried twice; which keys are
# secret is decided in Python, on the key alone.
_WORD_START = r"(?<![A-Za-z0-9_\-.])"
_KEY = r"([A-Za-z0-9_][A-Za-z0-9_.\-]{0,63})"
# The value is read in a lookahead: a key that is no secret consumes only itself and its separator, so a secret key
# inside its value (`url=https://host/?sig=…`) is still found.
_KEYED = re.compile(
    _WORD_START + r"(--?)?" + _KEY + r"([\"']?[ \t]*[=:][ \t]*)"  # g1 dashes, g2 key, g3 separator
    r"(?=\"((?:[^\"\\\n]|\\.)*)\"|'((?:[^'\\\n]|\\.)*)'|"  # g4 "double", g5 'single'
    r"((?:(?:bearer|basic|token)[ \t]+)?[^\s\"',;{\[][^\s\"',;]*))",  # g6 unquoted: one word
    re.IGNORECASE,
)
_BEARER = re.compile(_WORD_START + r"(bearer|basic)(\s+)([^\s\"',;]+)", re.IGNORECASE)
_FLAG = re.compile(r"(?<!\S)(--?)" + _KEY + r"([ \t]+)([^\s\"',;\-][^\s\"',;]*)")  # --flag value
_P_FLAG = re.compile(r"(?<!\S)(-p[ \t]+)([^\s\-/.~][^\s]*)")  # mysql -p secret (not a port, not a path)
_USER_FLAG = re.compile(r"(?<!\S)((?:-u|--user)[ \t]+[^\s:]{1,256}:)([^\s@]+)")  # curl -u user:password
# a secret key whose value is a table or a list (`"credentials": {...}`): the whole structure goes
_STRUCTURE = re.compile(_WORD_START + r"([\"']?)" + _KEY + r"\1[ \t]*[=:][ \t]*([{\[])")
_MAX_STRUCTURE = 65536


def _keyed(text: str) -> str:
    out: List[str] = []
    pos = 0
    for m in _KEYED.finditer(text):
        if m.start() < pos:
            continue
        key = m.group(2)
        kind = _kind(key)
        value = next((g for g in (m.group(4), m.group(5), m.group(6)) if g is not None), "")
        if not kind or _harmless(key, value):
            continue
        out.append(text[pos : m.end()])
        quoted = m.group(4) is not None or m.group(5) is not None
        end = m.end() + len(value) + (2 if quoted else 0)
        if quoted:
            quote = text[m.end()]
            out.append(quote + REDACTED + quote)
        elif kind == 2 and ":" in m.group(3):  # `password: correct horse battery staple`
            newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline
            out.append(REDACTED)
        else:
            out.append(REDACTED)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _flag(m: re.Match[str]) -> str:
    if _kind(m.group(2)) and not _harmless(m.group(2), m.group(4)):
        return m.group(1) + m.group(2) + m.group(3) + REDACTED
    return m.group(0)


def _structures(text: str) -> str:
    """`"credentials": {...}` and `api_keys = [...]`: the balanced structure after a secret key, replaced whole
    (strings inside it are skipped over; at most _MAX_STRUCTURE characters, else to the end of the line)."""
    out: List[str] = []
    pos = 0
    for m in _STRUCTURE.finditer(text):
        if m.start() < pos or not _kind(m.group(2)):
            continue
        start = m.end() - 1
        end = _balanced_end(text, start)
        out.append(text[pos:start])
        out.append('"' + REDACTED + '"' if m.group(1) == '"' else REDACTED)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _balanced_end(text: str, start: int) -> int:
    depth, i, quote = 0, start, ""
    limit = min(len(text), start + _MAX_STRUCTURE)
    while i < limit:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    newline = text.find("\n", start)
    return len(text) if newline < 0 else newline


def _patterns(text: str) -> str:
    for pattern in _SECRET_VALUES:
        text = pattern.sub(REDACTED, text)
    text = _WEBHOOK.sub(lambda m: m.group(1) + "/" + REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _USER_FLAG.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    if "{" in text or "[" in text:
        text = _structures(text)
    text = _keyed(text)
    text = _FLAG.sub(_flag, text)
    return _P_FLAG.sub(lambda m: m.group(0) if m.group(2).isdigit() else m.group(1) + REDACTED, text)


# --- the process's own secrets -----------------------------------------------------------------------------------
# Values of the job's credential-named environment variables: scrubbed wherever they show up (a job that prints
# its own password, an exception message holding a token), whatever their format — and in the forms JSON gives
# them (a record is often encoded before it is written: `"` becomes `\"`, `é` becomes `\u00e9`).
_KNOWN: List[str] = []
MIN_KNOWN_LEN = 6  # shorter values ("1", "true") would scrub ordinary words


def add_known_secret(value: str) -> None:
    """Scrub `value` (and its JSON-escaped forms) from everything redacted from now on."""
    if len(value) < MIN_KNOWN_LEN:
        return
    for form in (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        if form not in _KNOWN:
            _KNOWN.append(form)
    _KNOWN.sort(key=len, reverse=True)  # a longer secret first, in case one contains another


def add_known_secrets(env: Mapping[str, str]) -> int:
    """Remember the values of `env`'s credential-named variables so redact_text removes them anywhere.
    Returns how many forms are now known."""
    for name, value in env.items():
        if is_secret_name(name) and not _harmless(name, value):
            add_known_secret(value)
    return len(_KNOWN)


# What any match of the patterns above must contain, lower-cased: text with none of them is left as it is after
# one fast substring scan each — a chatty job's output costs no regular expression at all.
_CANDIDATES = ("token", "secret", "pass", "pwd", "pw", "key", "credential", "creds", "auth", "bearer", "basic",
               "cookie", "session", "sig", "dsn", "pat", "hook", "-----begin", "akia", "asia", "hf_", "ghp_", "gho_",
               "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "sk-", "aiza", "ya29.", "eyj", "wandb_v1_",
               "://", "-p", "-u", "--user")  # fmt: skip
_BY_LINE = 4096  # longer texts are matched line by line: only the lines with a candidate pay for the patterns


# A needle holding `-` is slow to search in a row of dashes (every dash is a possible start), so its dash-free
# core is searched first: a 6,000-dash line then costs a few fast scans, not one slow one per such needle.
_CORED = [(c.replace("-", "") or c, c) for c in _CANDIDATES]


def _candidate(lower: str) -> bool:
    return any(core in lower and needle in lower for core, needle in _CORED)


def redact_text(text: str) -> str:
    """Replace known secret values, token-looking values and keyed secrets in free text (logs, command lines,
    configs, exception messages). Linear in the text: a scan for candidates first, the patterns only where one
    is (whole, when a key block or a structure may span lines)."""
    for known in _KNOWN:
        if known in text:
            text = text.replace(known, REDACTED)
    lower = text.lower()
    if not _candidate(lower):
        return text
    if len(text) <= _BY_LINE or "-----begin" in lower or "\n" not in text:
        return _patterns(text)
    return "".join(_patterns(line) if _candidate(line.lower()) else line for line in text.splitlines(keepends=True))


def redact_value(value: Any, name: str = "") -> Any:
    """A record redacted as data, not as its encoded text: the value of a secret-named key replaced whole (a
    table of credentials too), every string redacted as text, anything else as its repr. The result encodes to
    JSON that still parses, with every number and harmless name intact."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = str(k)
            secret = _kind(key) and not (isinstance(v, (str, bool, int, float)) and _harmless(key, str(v)))
            out[redact_text(key) if isinstance(k, str) else k] = REDACTED if secret else redact_value(v, key)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_value(v, name) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return redact_text(repr(value))


class StreamRedactor:
    """redact_text for a stream read in pieces (a job's console): a private key whose lines arrive in separate
    writes is dropped from its BEGIN line to its END line, whichever piece each is in."""

    def __init__(self, redact: Callable[[str], str] = redact_text) -> None:
        self._redact = redact
        self._in_key = False

    def __call__(self, text: str) -> str:
        if not self._in_key and "-----BEGIN" not in text:  # the common case: one substring scan
            return self._redact(text)
        out: List[str] = []
        while text:
            if self._in_key:
                end = _PEM_END.search(text)
                if end is None:
                    return "".join(out)
                text, self._in_key = text[end.end() :], False
                continue
            begin = _PEM_BEGIN.search(text)
            if begin is None or _PEM_END.search(text, begin.end()):
                out.append(self._redact(text))
                break
            out.append(self._redact(text[: begin.start()]) + REDACTED + "\n")
            text, self._in_key = text[begin.end() :], True
        return "".join(out)


def redact_json_text(text: str) -> Optional[str]:
    """A JSON document redacted as data: the text itself when nothing in it is secret, else the redacted data
    encoded again (it still parses); None when it is not JSON."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    redacted = redact_value(data)
    return text if redacted == data else json.dumps(redacted, indent=1) + ("\n" if text.endswith("\n") else "")
