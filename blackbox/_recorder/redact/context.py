"""Context rules: the value of what a secret-sounding name names (`key=…`, `--token …`, `"password": …`),
URLs' user info, webhooks, .netrc and .pgpass lines, auth calls and tools' password flags. Stdlib only; imports
common and names."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .common import _TOKEN_CHARS, _WORD_CHARS, REDACTED, Span
from .names import NONE, PHRASE, SECRET, WEAK, _credential_like, _harmless, _kind, _looks_random

# --- context rules ---------------------------------------------------------------------------------------------
# These match a lower-case copy of the text (`low`, the same length), anchored on the stem of a secret-sounding
# name (a fast literal search); the name's start is found by stepping back over word characters (at most 64),
# and its value is then read in Python from the text, once. A name that is no secret consumes only itself and its
# separator, so a secret name inside its value is still found (`url=https://host/?sig=…`); a secret name's value
# is skipped whole, kept or not: no position of the text is read twice.
_STEM_WORDS = ("pass", "pwd", "pw", "secret", "token", "key", "auth", "cred", "sig", "session", "cookie", "dsn", "pat",
               "bearer", "hook", "jwt")  # fmt: skip
_STEMS = "(?:" + "|".join(_STEM_WORDS) + ")"
_KEYED = re.compile(
    _STEMS + r"[a-z0-9_.\-]{0,40}(\\?[\"'])?[ \t]*(=>|:=|=|:(?![:/])|\uff1a|\uff1d)[ \t]*"
)  # and full-width : =
_CLIENT_ID = re.compile(r"client[_\-.]?id(\\?[\"'])?[ \t]*(=|:(?![:/]))[ \t]*")
_FLAGGED = re.compile("(" + _STEMS + r"[a-z0-9_\-]{0,40})[ \t]+(?:(?:is|was)[ \t]+)?(?=\S)")
_PW_LIKE = re.compile(r"[A-Za-z][^\s]*[0-9]|[0-9][^\s]*[A-Za-z]")  # letters and digits: `hunter2`
_PROSE_VALUE = 20  # a value after a name and a space, in prose, is a secret only when long and random
_PAIR = re.compile(_STEMS + r"[a-z0-9_.\-]{0,40}(\\?[\"'])[ \t]*(?:,|\][ \t]*=|\)[ \t]*=)[ \t]*(?=\\?[\"'])")
_MAX_NAME = 64
_GUILLEMETS = {
    "\u00ab": "\u00bb",
    "\u00bb": "\u00ab",
    "\u201c": "\u201d",
    "\u2039": "\u203a",
}  # guillemets, curly quotes
_JSON_ESCAPED_SEP = ("u0026", "u003f", "u003d")  # `\u0026`: Go's JSON escapes a URL's & (and ? =)
_DQ = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_SQ = re.compile(r"'((?:[^'\\\n]|\\.)*)'")
_WORD_VALUE = re.compile(r"[^\s\"'`,;(){}\[\]<>\\]+")
_WORD_VALUE_URL = re.compile(r"[^\s\"'`,;(){}\[\]<>&#\\]+")
_REST_OF_LINE = re.compile(r"[^\r\n\"'`\\]*(?:\\(?![nr\"'])[^\r\n\"'`\\]*)*")  # to a quote or a newline
_SCHEME = re.compile(r"(?:bearer|basic|token|digest|bot|negotiate|ntlm|aws4-hmac-sha256|hmac-sha256)[ \t]+")
_WHOLE_LINE_NAMES = {"authorization", "proxy_authorization", "cookie", "set_cookie", "cookies"}
_LINE_START_BACK = 64  # how far back to look for the start of a YAML-like `password: several words` line
_IDENT = re.compile(r"-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*")


def _name_start(text: str, stem: int) -> int:
    """Where the word holding the stem at `stem` begins (-1 when the word is longer than _MAX_NAME)."""
    i = stem
    limit = max(0, stem - _MAX_NAME)
    while i > limit and text[i - 1] in _WORD_CHARS:
        i -= 1
    if i == limit and i > 0 and text[i - 1] in _WORD_CHARS:
        return -1
    if i and text[i - 1] == "\\" and text[i : i + 1] in ("n", "t", "r"):  # `\npassword=` inside a JSON string
        i += 1
    return i


def _quoted(text: str, i: int) -> Optional[Tuple[int, int]]:
    """The span inside the quoted string starting at `i` — plain quotes, or quotes escaped once or more (a JSON
    string inside a JSON string: `\\\"…\\\"`) — or None."""
    c = text[i : i + 1]
    if c in _GUILLEMETS:  # «value», “value”: to the closing mark on the same line
        end = text.find(_GUILLEMETS[c], i + 1, i + 1 + 512)
        newline = text.find("\n", i + 1, end)
        return (i + 1, end) if end > i + 1 and newline < 0 else None
    if c == '"' or c == "'":
        m = (_DQ if c == '"' else _SQ).match(text, i)
        return (m.start(1), m.end(1)) if m else None
    if c != "\\":
        return None
    j = i
    while j < len(text) and j - i < 8 and text[j] == "\\":
        j += 1
    if text[j : j + 1] not in ('"', "'"):
        return None
    delim = text[i : j + 1]
    end = text.find(delim, j + 1)
    newline = text.find("\n", j + 1)
    if end < 0 or (0 <= newline < end):
        return None
    return j + 1, end


def _value_span(text: str, i: int, name: str, kind: int, sep: str, at_line_start: bool, url: bool) -> Tuple[int, int]:
    """Where the value after a name and its separator lies: inside quotes, one word, or (for a header, or a
    `password: several words` line) the rest of the line. Empty when there is none."""
    span = _quoted(text, i)
    if span is None and text[i : i + 1] in ("f", "r", "b", "F", "R", "B") and text[i + 1 : i + 2] in ("'", '"'):
        span = _quoted(text, i + 1)  # a Python string literal with a prefix: f"Bearer {token}"
    if span is not None:
        return span
    if text[i : i + 1] in ("'", '"'):  # an unterminated quote: the word after it
        i += 1
    low = name.lower().replace("-", "_").lstrip("_")
    if low in _WHOLE_LINE_NAMES or (kind == PHRASE and at_line_start and sep.startswith(":")):
        m = _REST_OF_LINE.match(text, i)
        end = m.end() if m else i
        while end > i and text[end - 1] in " \t,":
            end -= 1
        return i, end
    m = (_WORD_VALUE_URL if url or kind == WEAK else _WORD_VALUE).match(text, i)
    return (i, m.end()) if m else (i, i)


def _at_line_start(text: str, start: int) -> bool:
    line_start = text.rfind("\n", max(0, start - _LINE_START_BACK), start)
    if line_start < 0 and start >= _LINE_START_BACK:
        return False
    return not text[line_start + 1 : start].strip(" \t-\"'")


_MAX_STRUCTURE = 65536


def _balanced_end(text: str, start: int) -> int:
    """The end of the table or list that opens at `start` (strings inside skipped over); at most
    _MAX_STRUCTURE characters, else the end of the line."""
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


def _keyed(text: str, low: str, stems: Sequence[int], client_ids: bool = False) -> List[Span]:
    """`name=value`, `name: value`, `"name": "value"`, `--name=value`: the value of a secret-named key. `stems`:
    where a stem of a secret-sounding name starts (for client ids, every `client_id`)."""
    spans: List[Span] = []
    i = 0
    pattern = _CLIENT_ID if client_ids else _KEYED
    for stem in stems if not client_ids else [m.start() for m in _CLIENT_ID.finditer(low)]:
        if stem < i:
            continue
        m = pattern.match(low, stem)
        if m is None:
            continue
        i = m.end()
        start = _name_start(low, m.start())
        if start < 0:
            continue
        name_end = m.start(1) if m.group(1) else m.start(2)
        escaped = start and text[start - 1] == "\\" and low.startswith(_JSON_ESCAPED_SEP, start)
        if escaped:  # `…\u0026X-Amz-Signature=…` in a URL that Go's JSON escaped
            start += 5
        name = text[start:name_end].rstrip(" \t").lstrip("-")
        if not name or (start and text[start - 1] == "\\" and not m.group(1) and not escaped):
            continue
        kind = SECRET if client_ids else _kind(name)
        if kind == NONE:
            continue
        if kind >= SECRET and text[m.end() : m.end() + 1] in ("{", "["):  # `"credentials": {...}`: all of it
            end = _balanced_end(text, m.end())
            quote = '"' if m.group(1) and m.group(1).endswith('"') else ""
            spans.append((m.end(), end, quote + REDACTED + quote))
            i = end
            continue
        before = text[start - 1 : start]
        line_start = _at_line_start(text, start) or (before in ("'", '"') and not m.group(1))
        url = before in ("?", "&", ";") or bool(escaped)
        value_start, end = _value_span(text, m.end(), name, kind, m.group(2), line_start, url)
        value_start = _skip_scheme(low, value_start, end)
        i = max(i, end)
        if text[end : end + 1] in ("(", "[") and text[value_start - 1 : value_start] not in ("'", '"'):
            continue  # code: `api_key = get_api_key()`, `token = config["token"]`
        if end > value_start and not _harmless(name, text[value_start:end], kind):
            spans.append((value_start, end, REDACTED))
    return spans


def _skip_scheme(low: str, start: int, end: int) -> int:
    m = _SCHEME.match(low, start, end)
    return m.end() if m and m.end() < end else start


def _flagged(text: str, low: str, stems: Sequence[int]) -> List[Span]:
    """`--hf-token abc`: a secret-named flag and the word after it (`--token` is a credential on a command line);
    and a secret name with its value after a space: quoted (`invalid api_key 'x'`) or random-looking (`login
    failed for token abc987xyz`)."""
    spans: List[Span] = []
    done = 0
    for stem in stems:
        m = _FLAGGED.match(low, stem) if stem >= done else None
        if m is None:
            continue
        done = m.end()
        start = _name_start(low, m.start())
        if start < 0 or (start and text[start - 1] not in " \t\n\"'[(,="):
            continue
        flag = text[start : start + 1] == "-"
        name = text[start : m.end(1)].lstrip("-")
        kind = _flag_kind(name) if flag else _kind(name)
        if not kind:
            continue
        span = _quoted(text, m.end())
        if span is not None and not flag:
            quoted = text[span[0] : span[1]]
            if not (_credential_like(quoted) or (len(quoted) >= 6 and _PW_LIKE.search(quoted))):
                continue  # `secret "wandb" not found`: a name in prose, not a value
        if span is None:
            v = _WORD_VALUE.match(text, m.end())
            if v is None or (v.group().startswith("-") and not _credential_like(v.group())):
                continue  # no value, or the next flag
            span = (v.start(), v.end())
            if not flag and not (_looks_random(v.group()) and len(v.group()) >= _PROSE_VALUE if kind == WEAK
                                 else _credential_like(v.group())):  # fmt: skip
                continue  # `token budget exhausted`, `password reset required`: prose, not a value
        if not _harmless(name, text[span[0] : span[1]], kind):
            spans.append((span[0], span[1], REDACTED))
    return spans


def _flag_kind(name: str) -> int:
    return SECRET if name.lower() == "token" else _kind(name)


def _pairs(text: str, low: str, stems: Sequence[int]) -> List[Span]:
    """`("password", "x")`, `os.environ["HF_TOKEN"] = "x"`, `setdefault("WANDB_API_KEY", "x")`,
    `["--hf-token", "x"]`: a quoted secret name, then a quoted value."""
    spans: List[Span] = []
    done = 0
    for stem in stems:
        m = _PAIR.match(low, stem) if stem >= done else None
        if m is None:
            continue
        done = m.end()
        start = _name_start(low, m.start())
        quote = m.group(1)[-1]
        if start <= 0 or text[start - 1] != quote:
            continue
        raw = text[start : m.start(1)]
        name = raw.lstrip("-")
        kind = _flag_kind(name) if raw.startswith("-") else _kind(name)
        span = _quoted(text, m.end())
        if not kind or span is None:
            continue
        value = text[span[0] : span[1]]
        after = text[span[1] : span[1] + 4].lstrip("\\\"' \t")
        if after.startswith(":") or _harmless(name, value, kind) or (_IDENT.fullmatch(value) and _kind(value)):
            continue  # the next key of a mapping, or a list of names (`["api_key", "secret_key"]`), not a value
        spans.append((span[0], span[1], REDACTED))
    return spans


# Kubernetes and ECS environment entries on one line: `{"name": "WANDB_API_KEY", "value": "…"}`
_NAME_VALUE = re.compile(
    r"(?:name|key)\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?([a-z_][a-z0-9_.\-]{0,63})\\?[\"']?[ \t]*(?:,|\\[nr]|\r?\n|[ \t])"
    r"[ \t]*\\?[\"']?value\\?[\"']?"
    r"[ \t]*[:=][ \t]*"
)  # fmt: skip


def _name_values(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _NAME_VALUE.finditer(low):
        name = text[m.start(1) : m.end(1)]
        kind = _kind(name)
        span = _quoted(text, m.end())
        if span is None:
            v = _WORD_VALUE.match(text, m.end())
            span = (v.start(), v.end()) if v else None
        if kind and span is not None and not _harmless(name, text[span[0] : span[1]], kind):
            spans.append((span[0], span[1], REDACTED))
    return spans


# `<password>x</password>` in XML (a Maven or NuGet settings file, a SOAP log)
_XML_SECRETS = {"signatureprovided"}  # S3's SignatureDoesNotMatch body
_XML_ELEMENT = re.compile(r"<([a-z0-9_.\-:]{1,64})>([^<>\n]{1,512})</\1>")


def _xml_elements(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _XML_ELEMENT.finditer(low):
        name = text[m.start(1) : m.end(1)].rsplit(":", 1)[-1]
        kind = SECRET if name.lower() in _XML_SECRETS else _kind(name)
        if kind and not _harmless(name, text[m.start(2) : m.end(2)], kind):
            spans.append((m.start(2), m.end(2), REDACTED))
    return spans


# a row of a table: `│ api_key │ value │` (rich), `| apikey | value |` (NGC's CLI, Markdown): a secret name's cell
# and the cell after it
_BAR = "[|\u2502\u2503]"  # | and the box-drawing bars
_TABLE_CELL = re.compile(
    r"([a-z0-9_.\-]{1,64})[ \t]*" + _BAR + r"[ \t]*([^|\u2502\u2503\r\n]{1,512}?)[ \t]*(?=" + _BAR + ")"
)
_BARS = "|\u2502\u2503"


def _table_cells(text: str, low: str, stems: Sequence[int]) -> List[Span]:
    """From each stem: a name that opens a cell (a bar before it), its bar, and the next cell."""
    spans: List[Span] = []
    done = 0
    for stem in stems:
        start = _name_start(low, stem) if stem >= done else -1
        if start <= 0:
            continue
        bar = start - 1
        while bar > 0 and start - bar < 16 and low[bar] in " \t":
            bar -= 1
        m = _TABLE_CELL.match(low, start) if low[bar] in _BARS else None
        if m is None:
            continue
        done = m.end()
        name, value = text[m.start(1) : m.end(1)], text[m.start(2) : m.end(2)]
        kind = _kind(name)
        if (kind >= SECRET and not _harmless(name, value, kind)) or (kind == WEAK and _looks_random(value)):
            spans.append((m.start(2), m.end(2), REDACTED))
    return spans


# `requests.get(url, auth=("trainer", "pw"))`, `HTTPBasicAuth(user, "pw")`, `smtp.login("me", "pw")`
_QUOTED_ARG = r"(?:\\?\"(?:[^\"\\\n]|\\[^\"\n]){0,256}\\?\"|'(?:[^'\\\n]|\\.){0,256}')"
_AUTH_CALL = re.compile(
    r"(?:auth[ \t]*=[ \t]*[(\[]|(?:httpbasicauth|httpdigestauth|httpproxyauth|basicauth|digestauth|login)[ \t]*\()"
    r"[ \t]*(?:" + _QUOTED_ARG + r"|[a-z_][a-z0-9_.]{0,64}(?:\[[^\]\n]{0,64}\])?)[ \t]*,[ \t]*(?=\\?[\"'])"
)  # fmt: skip


def _auth_calls(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _AUTH_CALL.finditer(low):
        if m.start() and low[m.start() - 1] in _TOKEN_CHARS and low[m.start() - 1] != "_":
            continue
        span = _quoted(text, m.end())
        if span is not None and not _harmless("password", text[span[0] : span[1]], PHRASE):
            spans.append((span[0], span[1], REDACTED))
    return spans


# `Bearer xyz` and `Basic dXNlcjpwYXNz` without a header name: a credential only when it looks like one
# (`Basic sanity check passed`, `Bearer token expired` are words)
_SCHEME_TOKEN = re.compile(r"(bearer|basic|token)[ \t]+([a-z0-9\-._~+/]{8,}=*)")


def _scheme_tokens(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _SCHEME_TOKEN.finditer(low):
        if m.start() and low[m.start() - 1] in _TOKEN_CHARS:
            continue
        cred = text[m.start(2) : m.end(2)]
        if m.group(1) == "basic":
            try:
                decoded = base64.b64decode(cred + "=" * (-len(cred) % 4), validate=True)
            except (binascii.Error, ValueError):
                continue
            if b":" not in decoded:
                continue
        elif not (_looks_random(cred) or cred.count(".") >= 2):  # a key, or a JWT-like dotted token
            continue
        spans.append((m.start(2), m.end(2), REDACTED))
    return spans


# passwords in URLs (`postgres://u:pw@db`, `redis://:pw@cache`) and tokens used as the user (`https://ghp_…@github.com`)
_URL_USERINFO = re.compile(r"://([^\s/@:?#\[\]\"'<>]{0,256})(:[^\s/@\"'<>]{0,512})?@")


def _userinfo(text: str) -> List[Span]:
    spans: List[Span] = []
    for m in _URL_USERINFO.finditer(text):
        user, password = m.group(1), m.group(2)
        if password and len(password) > 1 and not _harmless("password", password[1:], PHRASE):
            spans.append((m.start(2) + 1, m.end(2), REDACTED))
        elif not password and _looks_random(user):
            spans.append((m.start(1), m.end(1), REDACTED))
    return spans


# webhook URLs are credentials: whoever has one can post as you. The host stays (it says where alerts went).
_WEBHOOK = re.compile(
    r"(https?://(?:hooks\.slack\.com|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks|"
    r"[a-z0-9.\-]{1,100}\.webhook\.office\.com|[a-z0-9.\-]{1,100}/[^\s\"'<>/]{0,64}/?webhooks?\b))"
    r"/[^\s\"'<>]{1,500}"
)


def _webhooks(low: str) -> List[Span]:
    return [(m.end(1) + 1, m.end(), REDACTED) for m in _WEBHOOK.finditer(low)]


# One-line .netrc entries (`machine h login u password p`) and .pgpass lines (`host:port:db:user:password`)
_NETRC_LINE = re.compile(
    r"(?:(?:machine[ \t]+\S+|default)(?:[ \t]+(?:login|port|protocol)[ \t]+\S+)*|login[ \t]+\S+)"
    r"[ \t]+(?:password|account)[ \t]+(\S+)"
)  # fmt: skip
_PGPASS = re.compile(
    r"(?m)(?:^|(?<=[\"']))([^:\s#\"']+):([0-9]{1,5}|\*):([^:\s\"']*[A-Za-z*][^:\s\"']*):"
    r"([^:\s\"']*[A-Za-z*][^:\s\"']*):([^\s\"']+?)[ \t]*(?=[\"']|\r?$)"
)


def _netrc_lines(text: str) -> List[Span]:
    return [(m.start(1), m.end(1), REDACTED) for m in _NETRC_LINE.finditer(text)
            if not (m.start() and text[m.start() - 1] in _TOKEN_CHARS)]  # fmt: skip


# the port field and the three after it (NCCL's `host:pid:tid [0] NCCL INFO …` has the port but not the rest): only
# lines with them are read (a fast search)
_PGPASS_HINT = re.compile(r":(?:[0-9]{1,5}|\*):[^:\s\"']+:[^:\s\"']+:[^\s\"']")


def _pgpass_lines(text: str) -> List[Span]:
    spans: List[Span] = []
    end = 0
    for hint in _PGPASS_HINT.finditer(text):
        if hint.start() < end:
            continue
        start = text.rfind("\n", end, hint.start()) + 1 or end
        end = text.find("\n", hint.end())
        end = len(text) if end < 0 else end
        spans += [
            (m.start(5), m.end(5), REDACTED) for m in _PGPASS.finditer(text, start, end) if not m.group(5).isdigit()
        ]
    return spans


# `curl -u user:password`, `--user user:password`
_USER_FLAG = re.compile(r"(?:-u|--user)[ \t]+[^\s:\"']{1,256}:([^\s@\"']+)")


def _user_flags(text: str) -> List[Span]:
    return [(m.start(1), m.end(1), REDACTED) for m in _USER_FLAG.finditer(text)
            if not m.start() or text[m.start() - 1] in " \t\n\"'"]  # fmt: skip


# `config set NAME VALUE` (`aws configure set`, `npm config set //host/:_authToken X`) and csh's `setenv NAME VALUE`
_SET_NAME_VALUE = re.compile(r"(?:set|setenv|set-credentials)[ \t]+([^\s=]{1,128})[ \t]+(?=[^\s\-])")


def _set_values(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _SET_NAME_VALUE.finditer(low):
        if m.start() and low[m.start() - 1] in _TOKEN_CHARS:
            continue
        name = text[m.start(1) : m.end(1)]
        kind = _kind(name)
        if kind < SECRET or not (name.isupper() or any(c in name for c in "_./:")):
            continue  # `set password to continue` is prose; `set aws_secret_access_key X` is not
        v = _WORD_VALUE.match(text, m.end())
        if v is not None and not _harmless(name, v.group(), kind):
            spans.append((v.start(), v.end(), REDACTED))
    return spans


# Tools that take a password as a flag's value: `-p` is a password only where the tool says so (`mkdir -p dir`,
# `pytest -p plugin`, `ssh -p 2222` are not). tool -> (subcommand it needs, flags with the next word, flags with
# the value attached, how the value holds the secret)
_TOOLS: Dict[str, Tuple[str, Tuple[str, ...], Tuple[str, ...], str]] = {}
for _tool in ("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck", "mysqlpump", "mysqlsh",
              "mariadb", "mariadb-dump", "mariadb-admin", "mariadb-import", "mariadb-check"):  # fmt: skip
    _TOOLS[_tool] = ("", ("-p",), ("-p",), "")
_TOOLS["sshpass"] = ("", ("-p",), ("-p",), "")
for _tool in ("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport", "mongoimport", "mongostat", "mongotop"):
    _TOOLS[_tool] = ("", ("-p",), (), "")
for _tool in ("docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras", "crane", "regctl"):
    _TOOLS[_tool] = ("login", ("-p",), (), "")
for _tool in ("7z", "7za", "7zz", "7zr", "rar", "unrar"):
    _TOOLS[_tool] = ("", (), ("-p",), "")
for _tool in ("zip", "unzip", "zipcloak"):
    _TOOLS[_tool] = ("", ("-P",), (), "")
_TOOLS["redis-cli"] = ("", ("-a",), (), "")
for _tool in ("ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldapwhoami", "ldappasswd"):
    _TOOLS[_tool] = ("", ("-w",), (), "")
for _tool in ("sqlcmd", "bcp"):
    _TOOLS[_tool] = ("", ("-P",), (), "")
_TOOLS["openssl"] = ("", ("-passin", "-passout", "-pass", "-k"), (), "pass:")
for _tool in ("smbclient", "rpcclient", "smbmap"):
    _TOOLS[_tool] = ("", ("-U",), (), "%")
_TOOLS["wandb"] = ("login", (), (), "positional")
_TOOLS["aws"] = ("configure", (), (), "set")
_TOOLS["mc"] = ("alias", (), (), "mc")  # MinIO: mc alias set NAME URL ACCESS_KEY SECRET_KEY
# each tool is found from the needle its name starts with: a literal search, then the whole word looked up
_TOOL_NEEDLES = ("mysql", "mariadb", "sshpass", "mongo", "docker", "podman", "nerdctl", "buildah", "skopeo", "helm",
                 "oras", "crane", "regctl", "7z", "rar", "unrar", "zip", "unzip", "redis-cli", "ldap", "sqlcmd", "bcp",
                 "openssl", "smb", "rpcclient", "wandb", "aws", "mc")  # fmt: skip
_TOOL_WORDS = {n: re.compile(re.escape(n) + r"[a-z0-9\-]*") for n in _TOOL_NEEDLES}
_WANDB_FLAGS_WITH_VALUE = {"--host", "--key", "--entity", "--project"}
_SEGMENT_END = re.compile(r"[|;&\n]")
_SHELL_WORD = re.compile(r"[^\s|;&]+")


def tool_secrets(words: Sequence[str]) -> Dict[int, int]:
    """In a command line split into words: {index of a word holding a password: how many of its leading
    characters to keep} for the tools of _TOOLS (`mysql -pX`, `docker login -p X`, `wandb login KEY`,
    `aws configure set aws_secret_access_key X`, `openssl … -passin pass:X`)."""
    found: Dict[int, int] = {}
    spec: Optional[Tuple[str, Tuple[str, ...], Tuple[str, ...], str]] = None
    sub_seen = positional_done = False
    i = 0
    while i < len(words):
        word = words[i]
        base = word.rsplit("/", 1)[-1]
        if base in _TOOLS:
            spec, sub_seen, positional_done = _TOOLS[base], not _TOOLS[base][0], False
            i += 1
            continue
        if spec is None:
            i += 1
            continue
        sub, with_next, attached, how = spec
        if not sub_seen:
            sub_seen = word == sub
            i += 1
            continue
        if how == "positional":  # wandb login [--relogin] [--host H] KEY
            if word.startswith("-"):
                i += 2 if word in _WANDB_FLAGS_WITH_VALUE else 1
                continue
            if not positional_done and len(word) >= 20:
                found[i] = 0
            positional_done = True
        elif how == "mc":  # mc alias set NAME URL ACCESS_KEY SECRET_KEY
            if word == "set" and i + 4 < len(words):
                found.update({j: 0 for j in (i + 3, i + 4) if not words[j].startswith("-")})
                i += 4
        elif how == "set":  # aws configure set NAME VALUE
            if word == "set" and i + 2 < len(words) and _kind(words[i + 1]) >= SECRET:
                found[i + 2] = 0
                i += 2
        elif word in with_next and i + 1 < len(words):
            keep = _tool_value_keep(words[i + 1], how)
            if keep is not None:
                found[i + 1] = keep
            i += 1
        else:
            for flag in attached:
                if word.startswith(flag) and len(word) > len(flag) and (
                        word[len(flag)] != "-" or _credential_like(word[len(flag) :])):  # fmt: skip
                    found[i] = len(flag)
                    break
        i += 1
    return found


def _tool_value_keep(value: str, how: str) -> Optional[int]:
    """How much of a password flag's value to keep (None: the value is no password — a number, another flag)."""
    if not value or (value.startswith("-") and not _credential_like(value)) or value.isdigit():
        return None  # a number (a port), another flag
    if how == "pass:":  # openssl: pass:X is the password, env:/file:/fd:/stdin name where it is
        return len("pass:") if value.startswith("pass:") else None
    if how == "%":  # smbclient -U user%password
        return value.index("%") + 1 if "%" in value else None
    return 0


def _tools(text: str, low: str, found: Set[str]) -> List[Span]:
    starts: List[int] = []
    for needle in found.intersection(_TOOL_NEEDLES):
        starts.extend(m.start() for m in _TOOL_WORDS[needle].finditer(low)
                      if m.group() in _TOOLS and (not m.start() or low[m.start() - 1] not in _WORD_CHARS)
                      and low[m.end() : m.end() + 1] not in _WORD_CHARS)  # fmt: skip
    spans: List[Span] = []
    scanned = 0
    for start in sorted(starts):
        if start < scanned:
            continue
        end = _SEGMENT_END.search(text, start)
        seg_end = min(end.start() if end else len(text), start + 4096)
        scanned = seg_end
        words = [(w.start(), w.end()) for w in _SHELL_WORD.finditer(text, start, seg_end)]
        for index, keep in tool_secrets([text[s:e].strip("\"'") for s, e in words]).items():
            s, e = words[index]
            raw = text[s:e]
            lead = len(raw) - len(raw.lstrip("\"'"))
            trail = len(raw) - len(raw.rstrip("\"'"))
            if s + lead + keep < e - trail:
                spans.append((s + lead + keep, e - trail, REDACTED))
    return spans
