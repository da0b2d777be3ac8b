"""Secret redaction shared by both sides: known values (the job's own credentials, in every form they take), token
formats with anchors, context rules that read what a name names, records redacted as data, command lines, config
files and streams. Stdlib only, Python >= 3.9: the rank side imports it lazily (first record written), the host
through blackbox.redact. Every function is linear in its input and total: it never raises on what it is given."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

REDACTED = "<redacted>"

# --- names ---------------------------------------------------------------------------------------------------
# A name is split into lower-case words (snake, kebab, dotted and camelCase alike); the last word says what the
# thing is: `eos_token_id` is an id, `key_dim` a dimension, `PASSWORD_STORE_CLIP_TIME` a time — none is a secret.
# What a secret-sounding name holds decides how sure we are:
NONE, WEAK, SECRET, PHRASE = 0, 1, 2, 3
# WEAK: a word ML text uses for other things too (`token: 'Paris'`, `session: 3/5`, `signature: forward(...)`,
# `key: input_ids`): its value goes only when it looks random (a key, not a word, a number or a path).
# SECRET: one word of any shape (`hf_token`, `api_key`, `AccountKey`). PHRASE: may be several words (a password).
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_DESCRIBES = {"id", "ids", "name", "names", "dir", "dirs", "path", "paths", "file", "files", "type", "types",
              "dim", "dims", "size", "sizes", "len", "length", "count", "num", "index", "idx", "mask", "sock",
              "budget", "limit", "prefix", "suffix", "format", "env", "var", "field", "column", "header",
              "enabled", "required", "mode", "level", "timeout", "ttl", "expiry", "expires", "at", "provider",
              "time", "seconds", "secs", "ms", "interval", "retries", "attempts", "policy", "strength", "hint",
              "helper", "manager", "backend", "algorithm", "alg", "method", "scheme", "version", "user",
              "username", "email", "region", "scope", "scopes", "endpoint", "host", "port", "location", "kind",
              "label", "description", "help", "lifetime", "duration", "shape", "heads", "proj", "norm", "cache",
              "store", "stores", "rate", "steps", "step", "padding", "embedding", "embeddings", "layer",
              "layers", "weight", "weights", "bias", "ref", "refs", "reference", "selector", "source", "mount",
              "volume", "template", "url", "uri", "issuer", "audience", "subject", "error", "errors", "exception",
              "exceptions", "warning", "warnings", "expiration", "scale", "factor", "ratio", "threshold", "prob",
              "probability", "days", "hours", "minutes", "weeks", "age", "rotation"}  # fmt: skip
_ANYWHERE = ("password", "passwd", "passphrase", "secret", "credential", "webhook")  # inside any word
_PHRASE_WORDS = ("password", "passwd", "passphrase")
_LAST = {"pass": PHRASE, "pwd": PHRASE, "pw": PHRASE, "auth": SECRET, "authorization": SECRET, "cookie": SECRET,
         "cookies": SECRET, "sig": WEAK, "dsn": SECRET, "bearer": SECRET, "jwt": SECRET, "creds": SECRET,
         "apikey": SECRET, "accesskey": SECRET, "secretkey": SECRET, "privatekey": SECRET, "accountkey": SECRET,
         "authkey": SECRET, "authtoken": SECRET, "accesstoken": SECRET, "refreshtoken": SECRET, "apitoken": SECRET,
         "sessiontoken": SECRET, "idtoken": SECRET, "storepass": PHRASE, "keypass": PHRASE, "session": WEAK,
         "sessionid": WEAK, "signature": WEAK, "pat": WEAK, "token": WEAK, "key": WEAK}  # fmt: skip
# a word before `token` / `key` that makes it a credential (`hf_token`, `KAGGLE_KEY`, `B2_APPLICATION_KEY`)
_QUALIFIERS = {"api", "access", "auth", "bearer", "bot", "github", "gh", "gitlab", "hf", "hub", "huggingface",
               "refresh", "slack", "wandb", "oauth", "personal", "service", "secret", "security", "app", "application",
               "client",
               "deploy", "registry", "npm", "pypi", "vault", "discord", "telegram", "sentry", "databricks", "mlflow",
               "tracking", "kaggle", "comet", "neptune", "openai", "anthropic", "cohere", "groq", "mistral",
               "replicate", "together", "pinecone", "jwt", "csrf", "xsrf", "aws", "gcp", "google", "azure", "sas",
               "ci", "job", "runner", "trigger", "upload", "write", "admin", "master", "root", "login", "consumer",
               "private", "shared", "signing", "sign", "webhook", "cloudflare", "doppler", "pulumi", "tf", "heroku",
               "vercel", "netlify", "codecov", "coveralls", "snyk", "notion", "linear", "dropbox", "user", "account",
               "docker", "dockerhub", "ngc", "modal", "runpod", "ssh", "encryption", "decryption", "subscription",
               "storage", "license", "gpg", "pgp", "rsa", "hmac", "fernet", "b2", "stripe", "sendgrid", "twilio",
               "mailgun", "datadog", "session", "cookie", "crypt", "cipher", "aes", "s3", "minio", "r2", "redis",
               "db", "database", "postgres", "pg", "mysql", "smtp", "mail", "firebase", "algolia", "mapbox",
               "serpapi", "tavily", "perplexity", "deepseek", "fireworks", "id"}  # fmt: skip
# special tokens of a tokenizer (`pad_token: <pad>`) and token counts, not credentials
_ML_TOKENS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "special", "added", "new", "vocab",
              "image", "img", "audio", "video", "vision", "think", "im", "system", "fim", "default", "chat", "boi",
              "eoi", "tool", "next", "prev", "first", "last", "total", "max", "min", "per", "num", "input", "output",
              "target", "predicted", "pred", "prompt", "query", "answer", "label", "generated", "decoder",
              "encoder", "eot", "eom", "middle", "control", "reserved", "unused", "word", "sentence", "doc",
              "assistant", "sot", "bpe", "top", "sampled", "current", "stop", "sample", "text", "random",
              "rng", "prng", "seed", "sort", "primary", "partition", "dict", "batch", "loss", "metric", "monitor",
              "cache", "hash", "lookup", "group", "hot", "hotkey", "foreign", "unique", "composite", "column",
              "row", "field", "caption", "data", "dataset", "feature", "features", "model"}  # fmt: skip
_NOT_SECRET_NAMES = {"PWD", "OLDPWD"}  # the shell's working directories
_KEY_ID_QUALIFIERS = {"access", "api", "secret", "private", "application", "app", "signing", "account", "service"}


def _words(name: str) -> List[str]:
    return [w.lower() for w in _WORDS.findall(name)]


@functools.lru_cache(maxsize=4096)
def _kind(name: str) -> int:
    """How sure a name is to hold a secret: NONE, WEAK, SECRET or PHRASE (see above)."""
    if name in _NOT_SECRET_NAMES or len(name) > 128:
        return NONE
    words = _words(name)
    if not words:
        return NONE
    last = words[-1]
    # a credential's id is part of the credential: AWS_ACCESS_KEY_ID, accessKeyId, private_key_id
    if last in ("id", "ids") and len(words) > 2 and words[-2] == "key" and words[-3] in _KEY_ID_QUALIFIERS:
        return SECRET
    if last == "data" and len(words) > 1 and words[-2] == "key":  # kubeconfig client-key-data
        return SECRET
    if last in ("url", "uri") and any("hook" in w for w in words):  # SLACK_WEBHOOK_URL: whoever has it can post
        return SECRET
    if last in _DESCRIBES:
        return NONE
    for word in words:
        if word.startswith("secretar"):  # secretary
            continue
        for part in _ANYWHERE:
            if part in word:
                return PHRASE if part in _PHRASE_WORDS else SECRET
    kind = _LAST.get(last, NONE)
    if kind == NONE and "." in name and len(words) > 2:  # fs.azure.account.key.<host>, spark.….secret.key.<x>
        parts = name.split(".")
        if any(_kind(".".join(parts[:n])) >= SECRET for n in range(2, min(len(parts), 8))):
            return SECRET
    if last in ("token", "key", "keys", "pat") and len(words) > 1:
        if words[-2] in _ML_TOKENS:
            return NONE
        if any(w in _QUALIFIERS for w in words[:-1]):
            return SECRET
    return kind


def is_secret_name(name: str) -> bool:
    """Whether a name holds a secret whatever its value looks like (WEAK names only when the value is random)."""
    return _kind(name) >= SECRET


_HARMLESS = {"", "true", "false", "none", "null", "nil", "yes", "no", "on", "off", "0", "1", "-", "***",
             "required", "optional", "unset", "n/a", "na", REDACTED.lower()}  # fmt: skip
_SPECIAL_TOKEN = re.compile(r"<\|?[^<>|\s]{1,40}\|?>|</?[A-Za-z]{1,12}>|\[[A-Za-z_]{1,20}\]")
_REFERENCE = re.compile(
    r"\$[A-Za-z_][A-Za-z0-9_]*|\$\{[^}]{1,128}\}|\$\([^)]{1,256}\)|`[^`]{1,256}`|\{\{[^}]{1,128}\}\}|%\([A-Za-z_]+\)s|"
    r"\{[A-Za-z_][A-Za-z0-9_.\[\]'\"()]{0,64}\}"
)  # shell, templates, f-string fields
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLOAT = re.compile(r"[+\-]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+\-]?[0-9]+)?|[+\-]?[0-9]+[eE][+\-]?[0-9]+")
_HEX_LITERAL = re.compile(r"0x[0-9a-fA-F]+")
_CALL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\(.*\)")
_PATH = re.compile(r"(?:~|\.{1,2})?/[A-Za-z0-9_.\-@+~%/]*|[A-Za-z]:\\[A-Za-z0-9_.\-\\ ]*")
_NUMBER = re.compile(r"[+\-]?[0-9][0-9_.,:eE+\-/]*[a-zA-Z%]{0,3}")


def _random_part(part: str) -> bool:
    """A piece of a value that reads like a key: letters and digits mixed, or upper and lower case mixed at random."""
    if len(part) < 8:
        return False
    digits = sum(c.isdigit() for c in part)
    letters = sum(c.isalpha() for c in part)
    if letters < 2:
        return False
    if digits >= 2 or (digits and (len(part) >= 16 or (not part.isupper() and not part.islower()))):
        return True
    if digits or letters != len(part):
        return False
    run = max(len(r) for r in _CONSONANTS.findall(part.lower()) or [""])
    if _WORDISH.fullmatch(part):  # `ResNetBackbone`, `tokenizer`, `ALLCAPS`: words, unless unpronounceable
        return len(part) >= 10 and run >= 5
    mixed = not part.isupper() and not part.islower()
    return (mixed and len(part) >= 10) or (len(part) >= 12 and run >= 5)


_PARTS = re.compile(r"[-_./:+=~%]")
_MESSAGE_WORDS = re.compile(
    r"\b(?:token|tokens|password|passwords|authentication|updated|successfully|unchanged|"
    r"changed|required|incorrect|invalid|expired|failed|denied|not)\b"
)
_WORDISH = re.compile(r"(?:[A-Z]?[a-z]+)+|[A-Z]+(?:[A-Z][a-z]+)*[a-z]*")  # camelCase, PascalCase, lower, UPPER
_CONSONANTS = re.compile(r"[bcdfghjklmnpqrstvwxz]+")


def _looks_random(value: str) -> bool:
    """A value that reads like a generated credential: long, no spaces, not a path, and a piece of it that mixes
    letters with digits or cases (a run name `checkpoint_step_100000` or a model `Llama-3-8B` is not)."""
    v = value.strip().strip("\"'")[:512]  # a long value is judged by its beginning
    if len(v) < 8 or any(c.isspace() for c in v) or len(set(v)) < 6:
        return False
    if _is_path(v):
        return False
    return any(_random_part(p) for p in _PARTS.split(v))


def _credential_like(value: str) -> bool:
    """What a password looks like after a password's name: random, or at least three kinds of character
    (`V8Wz-pRp0%i#RCyd`), never a word, a number or a path."""
    v = value.strip().strip("\"'")
    if _looks_random(v):
        return True
    if len(v) < 8 or any(c.isspace() for c in v) or _is_path(v) or _NUMBER.fullmatch(v):
        return False
    return sum((any(c.islower() for c in v), any(c.isupper() for c in v), any(c.isdigit() for c in v),
                any(not c.isalnum() for c in v))) >= 3  # fmt: skip


def _is_path(v: str) -> bool:
    """A file path (`/etc/gcp/sa.json`, `~/.kube/config`), not a key that happens to start with a slash."""
    if not _PATH.fullmatch(v):
        return False
    return not any(len(p) >= 16 and _random_part(p) for p in re.split(r"[/\\.]", v))


def _harmless(name: str, value: str, kind: Optional[int] = None) -> bool:
    """A value that is no secret although its name says so: a flag (`use_auth_token=True`), an empty, masked or
    already redacted value, a reference to a variable or template, a path; for tokens a tokenizer's special token
    or a token id; and for WEAK names anything that does not look random."""
    v = value.strip().strip("\"'").strip()
    if len(v) > 256:  # no flag, reference, path or number is this long
        return (kind if kind is not None else _kind(name)) == WEAK and not _looks_random(v)
    if v.lower() in _HARMLESS or v.startswith(("os.environ", "env:", "file:", "environ[")):
        return True
    if _REFERENCE.fullmatch(v) or (len(set(v)) == 1 and len(v) > 2) or v == REDACTED:
        return True
    if not any(c.isalnum() for c in v):  # punctuation left of a quoted prompt (`"Password: ")`)
        return True
    if _YAML_TAG.fullmatch(v):  # `key: !!binary |`: the block under it is the value
        return True
    if _FLOAT.fullmatch(v) or _HEX_LITERAL.fullmatch(v):  # `secret_scale: 0.5`, an address `0x7f3a9c1b2e40`
        return True
    if _DOTTED.fullmatch(v) and _kind(v.rsplit(".", 1)[1]):  # code: `password = args.password`
        return True
    if _CALL.fullmatch(v):  # code: `api_key = get_api_key()`, `password = getpass.getpass("Password: ")`
        return True
    if _IDENTIFIER.fullmatch(v) and name and _words(v)[-1:] == _words(name)[-1:] and ("_" in v or v.islower()):
        return True  # code: `self.api_key = api_key`, `token = access_token`
    if v.startswith("<") and v.endswith(">") and len(v) <= 48:  # a placeholder or a special token
        return True
    if _is_path(v):
        return True
    if kind is None:
        kind = _kind(name)
    words = _words(name)
    if words[-1:] == ["token"] and (_SPECIAL_TOKEN.fullmatch(v) or (v.isdigit() and len(v) < 10)):
        return True
    if words[-1:] in (["sig"], ["session"]) and _NUMBER.fullmatch(v):
        return True
    if kind == WEAK:
        return not _looks_random(v)
    # `passwd: all authentication tokens updated successfully.`: the tool's message, not a passphrase
    return kind == PHRASE and v.count(" ") >= 2 and bool(_MESSAGE_WORDS.search(v.lower()))


def _worth_knowing(value: str) -> bool:
    """A credential's value worth scrubbing wherever it appears: long and random enough — never a user name, a
    number, a path or a flag, which would destroy ordinary text."""
    v = value.strip()
    if len(v) < 8 or len(v) > 16384 or v.lower() in _HARMLESS or _NUMBER.fullmatch(v) or _is_path(v):
        return False
    if len(set(v)) < 5 or _REFERENCE.fullmatch(v):
        return False
    if " " in v:
        return len(v) >= 16  # a passphrase
    classes = sum((any(c.islower() for c in v), any(c.isupper() for c in v), any(c.isdigit() for c in v),
                   any(not c.isalnum() for c in v)))  # fmt: skip
    return classes >= 2 or len(v) >= 20


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


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


def _trie(words: List[str]) -> str:
    """One regular expression matching any of `words` (sorted, distinct, non-empty), longest first, that tries
    a few characters at each position of the text whatever the number of words."""
    alts = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and words[j][0] == words[i][0]:
            j += 1
        group = words[i:j]
        prefix = _common_prefix(group[0], group[-1])  # the words are sorted: the first and last differ most
        rests = [w[len(prefix) :] for w in group]
        tails = [r for r in rests if r]
        sub = _trie(tails) if tails else ""
        if sub and len(tails) < len(rests):
            sub = "(?:" + sub + ")?"
        alts.append(re.escape(prefix) + sub)
        i = j
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


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


def add_known_secrets(env: Mapping[str, str], argv: Sequence[str] = (), cwd: Optional[str] = None) -> int:
    """Learn the job's credentials so that every text redacted from now on loses them: the values of `env`'s
    credential-named variables, the credentials its user keeps where tools keep them (under `env`'s HOME:
    ~/.netrc, ~/.aws, gcloud, Hugging Face, Kaggle, kubeconfig, Docker, ...; blackbox.\\_recorder.credentials),
    and the secret values of the config files named on `argv`. Returns how many forms are now known."""
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
    try:
        from . import credentials

        for value in credentials.stored_secrets(env, argv, cwd):
            if _worth_knowing(value):
                add_known_secret(value)
    except Exception:  # reading a user's files is best effort: the rules below still apply
        pass
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


# --- token formats with anchors ---------------------------------------------------------------------------------
# Provider prefixes and shapes, learned from gitleaks' rule set (config/gitleaks.toml). Each pattern starts with its
# literal prefix (a fast search) and runs only when its needle is in the text; the word boundary before it is
# checked in Python, never by scanning back.
_E = r"(?![A-Za-z0-9_\-])"
_FORMATS: List[Tuple[Tuple[str, ...], re.Pattern[str]]] = [
    (needles, re.compile(pattern))
    for needles, pattern in (
        (("akia", "asia", "abia", "acca", "a3t"), r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])"),
        (("hf_",), r"hf_[A-Za-z0-9]{30,}" + _E),  # Hugging Face
        (("api_org_",), r"api_org_[A-Za-z0-9]{30,}" + _E),
        (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9]{30,}" + _E),  # GitHub
        (("pat",), r"github_pat_[A-Za-z0-9_]{22,}" + _E),
        (("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "glft-", "glsoat-", "gloas-"),
         r"gl(?:pat|dt|rt|ptt|cbt|ft|soat|oas)-[A-Za-z0-9_\-.]{20,}" + _E),  # GitLab
        (("oxa-", "oxb-", "oxp-", "oxo-", "oxs-", "oxr-", "oxe-", "app-"),
         r"(?:xox[abposre]|xapp)-[A-Za-z0-9\-]{10,}" + _E),  # Slack
        (("sk-",), r"sk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}" + _E),  # OpenAI / Anthropic
        (("sk_", "rk_", "whsec_"), r"(?:(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9+/=]{20,})" + _E),
        (("aiza",), r"AIza[0-9A-Za-z_\-]{35}" + _E),  # Google API key
        (("ya29.",), r"ya29\.[0-9A-Za-z_\-.]{20,}" + _E),  # Google OAuth access token
        (("//",), r"1//0[0-9A-Za-z_\-]{30,}" + _E),  # Google OAuth refresh token
        (("gocspx-",), r"GOCSPX-[A-Za-z0-9_\-]{20,}" + _E),  # Google OAuth client secret
        (("eyj",), r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*" + _E),  # JWT
        (("eyj",), r"eyJhcGlfYWRkcmVzcyI6[A-Za-z0-9+/=]{20,}"),  # Neptune API token (base64 JSON)
        (("_v1_",), r"(?:wandb_v1_[A-Za-z0-9_]{20,}|do[opr]_v1_[a-f0-9]{64})" + _E),  # W&B, DigitalOcean
        (("local-",), r"local-[0-9a-f]{40}" + _E),  # W&B local server key
        (("q~",), r"[A-Za-z0-9_~.]{3}[0-9]Q~[A-Za-z0-9_~.\-]{31,34}" + _E),  # Azure AD client secret
        (("dapi",), r"dapi[a-f0-9]{32}(?:-[0-9])?" + _E),  # Databricks
        (("npm_",), r"npm_[A-Za-z0-9]{36}" + _E),
        (("pypi-",), r"pypi-AgE[A-Za-z0-9_\-]{50,}"),
        (("sg.",), r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}" + _E),  # SendGrid
        (("r8_",), r"r8_[A-Za-z0-9]{30,}" + _E),  # Replicate
        (("gsk_",), r"gsk_[A-Za-z0-9]{40,}" + _E),  # Groq
        (("pplx-",), r"pplx-[A-Za-z0-9]{40,}" + _E),  # Perplexity
        (("hvs.", "hvb."), r"hv[sb]\.[A-Za-z0-9_\-]{24,}" + _E),  # Vault
        (("glc_", "glsa_"), r"gl(?:c|sa)_[A-Za-z0-9+/=_]{32,}" + _E),  # Grafana
        (("pat",), r"dckr_pat_[A-Za-z0-9_\-]{20,}" + _E),  # Docker Hub
        (("lin_api_",), r"lin_api_[A-Za-z0-9]{30,}" + _E),  # Linear
        (("ntn_",), r"ntn_[A-Za-z0-9]{40,}" + _E),  # Notion
        (("age-secret-key-",), r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),
        (("ls0tls1crudjti",), r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]{16,}"),  # base64 of `-----BEGIN`, checked below
    )
]  # fmt: skip
_PRIVATE_B64 = ("UFJJVkFURSBLRV", "BSSVZBVEUgS0VZ", "QUklWQVRFIEtFW")  # "PRIVATE KEY" in base64, each alignment
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")

Span = Tuple[int, int, str]  # (start, end, what replaces text[start:end])


def _format_ok(text: str, m: re.Match[str]) -> bool:
    token = m.group(0)
    if m.start() and text[m.start() - 1] in (_TOKEN_CHARS if token[:1] != "1" else _TOKEN_CHARS | {"/"}):
        return False  # inside a longer word
    if token.startswith("LS0tLS1CRUdJTi"):
        return any(p in token[:120] for p in _PRIVATE_B64)  # a private key, not a certificate or public key
    if token.startswith("sk-"):
        parts = [p for p in re.split(r"[-_]", token[3:]) if p]
        return not (len(parts) >= 2 and all(p.isalpha() and p.islower() and len(p) <= 15 for p in parts))
    return True


def _formats(text: str, found: Set[str]) -> List[Span]:
    spans: List[Span] = []
    for needles, pattern in _FORMATS:
        if any(n in found for n in needles):
            spans.extend((m.start(), m.end(), REDACTED) for m in pattern.finditer(text) if _format_ok(text, m))
    return spans


_AWS_ID = re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")


def _aws_pairs(text: str) -> List[Span]:
    """An AWS key id's secret (40 characters of base64, mixed case) on the id's line or the next."""
    spans: List[Span] = []
    done = 0
    for m in _AWS_ID.finditer(text):
        start = max(done, text.rfind("\n", 0, m.start()) + 1)
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else text.find("\n", end + 1)
        end = len(text) if end < 0 else end
        if start >= end:
            continue
        for s in _AWS_SECRET.finditer(text, start, end):
            if any(c.isupper() for c in s.group()) and any(c.islower() for c in s.group()):
                spans.append((s.start(), s.end(), REDACTED))
        done = end
    return spans


# PEM and OpenSSH private keys, one line per write or JSON-escaped on one line: the markers stay (they say a key
# was there), the body goes. The body is a run of base64 lines (at least 16 characters each, the last may be
# shorter before the END marker) and the headers of encrypted keys — so a BEGIN with no body, in an error
# message about a bad key file, keeps everything after it.
_PEM_SEP = r"(?:[ \t\r\n]|\\[rn])+(?:\[[A-Za-z0-9_,.\- ]{1,32}\]:?[ \t]*)?"  # torchrun's `[rank0]:` prefix
_PEM_BEGIN = r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
_PEM_END = r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
_PEM = re.compile(
    "(" + _PEM_BEGIN + ")"
    "((?:" + _PEM_SEP + r"(?:(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset): ?[^\r\n\\]{0,200}"
    r"|[A-Za-z0-9+/=]{16,}(?=[ \t\r\n\\]|$)))*"
    "(?:" + _PEM_SEP + "[A-Za-z0-9+/=]{1,15}(?=" + _PEM_SEP + _PEM_END + "))?)"
    "(" + _PEM_SEP + _PEM_END + ")?"
)  # fmt: skip
_PEM_END_RE = re.compile(_PEM_END)
_PEM_BODY_LINE = re.compile(
    r"(?:\[[A-Za-z0-9_,.\- ]{1,32}\]:?)?[ \t]*(?:[A-Za-z0-9+/]{16,128}={0,2}|"
    r"[A-Za-z0-9+/]{1,15}={1,2}|(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset):.*)?"
    r"[ \t]*\r?"
)  # a line of base64 (a short one ends with padding), or a header
MAX_KEY_LINES = 256  # a private key printed line by line: beyond this, what follows is output again


def _pem(text: str) -> Tuple[str, Optional[_State]]:
    out: List[str] = []
    pos = 0
    state: Optional[_State] = None
    for m in _PEM.finditer(text):
        body = m.group(2)
        out.append(text[pos : m.start()])
        if body:
            sep = re.match(_PEM_SEP, body)
            out.append(m.group(1) + (sep.group() if sep else "\n") + REDACTED + (m.group(3) or ""))
        else:
            out.append(m.group(0))
        pos = m.end()
        if m.group(3) is None and not text[pos:].strip():  # the key goes on in the next write
            state = _State("pem", marked=bool(body))
    out.append(text[pos:])
    return "".join(out), state


# --- context rules ---------------------------------------------------------------------------------------------
# These match a lower-case copy of the text (`low`, the same length), anchored on the stem of a secret-sounding
# name (a fast literal search); the name's start is found by stepping back over word characters (at most 64),
# and its value is then read in Python from the text, once. A name that is no secret consumes only itself and its
# separator, so a secret name inside its value is still found (`url=https://host/?sig=…`); a secret name's value
# is skipped whole, kept or not: no position of the text is read twice.
_STEM_WORDS = ("pass", "pwd", "pw", "secret", "token", "key", "auth", "cred", "sig", "session", "cookie", "dsn", "pat",
               "bearer", "hook", "jwt")  # fmt: skip
_STEMS = "(?:" + "|".join(_STEM_WORDS) + ")"
_KEYED = re.compile(_STEMS + r"[a-z0-9_.\-]{0,40}(\\?[\"'])?[ \t]*(=>|:=|=|:(?![:/]))[ \t]*")
_CLIENT_ID = re.compile(r"client[_\-.]?id(\\?[\"'])?[ \t]*(=|:(?![:/]))[ \t]*")
_FLAGGED = re.compile("(" + _STEMS + r"[a-z0-9_\-]{0,40})[ \t]+(?:(?:is|was)[ \t]+)?(?=\S)")
_PW_LIKE = re.compile(r"[A-Za-z][^\s]*[0-9]|[0-9][^\s]*[A-Za-z]")  # letters and digits: `hunter2`
_PROSE_VALUE = 20  # a value after a name and a space, in prose, is a secret only when long and random
_PAIR = re.compile(_STEMS + r"[a-z0-9_.\-]{0,40}(\\?[\"'])[ \t]*(?:,|\][ \t]*=|\)[ \t]*=)[ \t]*(?=\\?[\"'])")
_MAX_NAME = 64
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
        name = text[start:name_end].rstrip(" \t").lstrip("-")
        if not name or (start and text[start - 1] == "\\" and not m.group(1)):
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
        value_start, end = _value_span(text, m.end(), name, kind, m.group(2), line_start, before in ("?", "&", ";"))
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
_XML_ELEMENT = re.compile(r"<([a-z0-9_.\-:]{1,64})>([^<>\n]{1,512})</\1>")


def _xml_elements(text: str, low: str) -> List[Span]:
    spans: List[Span] = []
    for m in _XML_ELEMENT.finditer(low):
        name = text[m.start(1) : m.end(1)].rsplit(":", 1)[-1]
        kind = _kind(name)
        if kind and not _harmless(name, text[m.start(2) : m.end(2)], kind):
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


def _pgpass_lines(text: str) -> List[Span]:
    return [(m.start(5), m.end(5), REDACTED) for m in _PGPASS.finditer(text) if not m.group(5).isdigit()]


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


def _apply(text: str, spans: List[Span]) -> str:
    """Replace the spans (overlapping ones merged into one replacement)."""
    if not spans:
        return text
    spans.sort()
    out: List[str] = []
    pos = 0
    cur_start, cur_end, cur_with = spans[0]
    for start, end, with_ in spans[1:]:
        if start < cur_end:
            cur_end = max(cur_end, end)
            continue
        out.append(text[pos:cur_start])
        out.append(cur_with)
        pos = cur_end
        cur_start, cur_end, cur_with = start, end, with_
    out.append(text[pos:cur_start])
    out.append(cur_with)
    out.append(text[cur_end:])
    return "".join(out)


# --- lines that say what the next lines hold -------------------------------------------------------------------
# A YAML block under a secret key (`credentials:` then indented lines), a Kubernetes env entry (`- name:
# WANDB_API_KEY` then `value: …`), a .netrc entry over several lines, and a private key printed line by line: the
# state is kept from line to line — and, in a stream, from one write to the next — and always bounded in lines.
class _State:
    __slots__ = ("indent", "kind", "left", "marked", "name", "scalar")

    def __init__(self, kind: str, indent: int = -1, left: int = 0, marked: bool = False, scalar: bool = False,
                 name: str = "") -> None:  # fmt: skip
        self.kind = kind
        self.indent = indent
        self.left = left or {"pem": MAX_KEY_LINES, "yaml": 256, "netrc": 8, "env": 4}[kind]
        self.marked = marked
        self.scalar = scalar
        self.name = name


_BLOCK_START = re.compile(
    r"(?m)^([ \t]*)(?:-[ \t]+)?([\"']?)([A-Za-z0-9_.\-]{1,64})\2[ \t]*:[ \t]*(?:!!?[A-Za-z0-9]{1,16}[ \t]+)?"
    r"([|>][-+0-9]{0,3})?[ \t]*\r?$"
)
_NETRC_START = re.compile(r"(?m)^[ \t]*(?:machine[ \t]+\S+|default)(?:[ \t]|\r?$)")
_ENV_NAME = re.compile(r"(?m)^[ \t]*(?:-[ \t]+)?name:[ \t]*([\"']?)([A-Za-z_][A-Za-z0-9_.\-]{0,63})\1[ \t]*\r?$")
_NETRC_ITEM = re.compile(r"([ \t]*(login|password|account|port|protocol|machine|default)(?:[ \t]+))(\S*)(.*)")
_ENV_VALUE = re.compile(r"([ \t]*value[ \t]*:[ \t]*)(.*?)([ \t]*\r?)$")
_YAML_ITEM = re.compile(r"([ \t]*-[ \t]+)(\S.*?)([ \t]*\r?)$")
_YAML_PAIR = re.compile(r"([ \t]*(?:-[ \t]+)?[\"']?[A-Za-z0-9_.\-]+[\"']?[ \t]*:[ \t]*)(.*?)([ \t]*\r?)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _state_line(line: str, state: _State) -> Tuple[Optional[str], Optional[_State]]:
    """One line (without its newline) under a state: (what to write instead, or None when the state ends before
    this line and the line is redacted as any other; the state after it)."""
    state.left -= 1
    if state.kind == "pem":
        if _PEM_END_RE.search(line):
            return line, None
        if not _PEM_BODY_LINE.fullmatch(line):
            return None, None  # not a key line: the key ended without its END marker
        nxt: Optional[_State] = state if state.left > 0 else None
        if not line.strip():
            return line, nxt
        if state.marked:
            return "\x00", nxt  # dropped: the marker for the whole key is already written
        state.marked = True
        return REDACTED, nxt
    if state.kind == "netrc":
        m = _NETRC_ITEM.fullmatch(line)
        if not m or m.group(2) in ("machine", "default"):
            return None, None
        nxt = state if state.left > 0 else None
        if m.group(2) in ("password", "account") and m.group(3) and not _harmless("password", m.group(3), PHRASE):
            return m.group(1) + REDACTED + m.group(4), nxt
        return line, nxt
    if state.kind == "env":
        m = _ENV_VALUE.fullmatch(line)
        if m:
            kind = _kind(state.name)
            value = m.group(2)
            if value and not _harmless(state.name, value, kind):
                return m.group(1) + REDACTED + m.group(3), None
            return line, None
        if line.strip().startswith(("valueFrom", "- ")) or state.left <= 0:
            return None, None
        return line, state
    # yaml: the lines indented under a secret key (or list items at its own indentation)
    body = line.rstrip("\r")
    if not body.strip():
        return line, state if state.left > 0 else None
    own = _indent(body)
    if own < state.indent or (own == state.indent and (state.scalar or not body.lstrip().startswith("- "))):
        return None, None
    nxt = state if state.left > 0 else None
    if state.scalar:
        return body[:own] + REDACTED + line[len(body) :], nxt
    item = _YAML_ITEM.fullmatch(line)
    if item and ":" not in item.group(2).split(" ", 1)[0]:
        return item.group(1) + REDACTED + item.group(3), nxt
    pair = _YAML_PAIR.fullmatch(line)
    if pair:
        value = pair.group(2)
        if not value or value in ("|", ">") or not _nested_secret(pair.group(1).strip(" \t-:\"'"), value):
            return line, nxt
        return pair.group(1) + REDACTED + pair.group(3), nxt
    return body[:own] + REDACTED + line[len(body) :], nxt


def _nested_secret(name: str, value: str) -> bool:
    """A field inside a secret table (`credentials:`, `auth:`): its value goes unless the field only names or
    describes (`name`, `type`, `user`, `region`, `key_id` of a secret reference) or the value is harmless."""
    kind = _kind(name)
    if kind >= SECRET:
        return not _harmless(name, value, kind)
    if not kind and _words(name)[-1:] and _words(name)[-1] in _DESCRIBES:
        return False
    return not _harmless("password", value, PHRASE)


def _walk(text: str, pos: int, state: _State, out: List[str]) -> Tuple[int, Optional[_State]]:
    """Lines from `pos` under `state` until it ends: appended to `out`; returns where the rest begins."""
    current: Optional[_State] = state
    while current is not None and pos < len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        line = text[pos:end]
        replaced, current = _state_line(line, current)
        if replaced is None:
            return pos, None
        if replaced != "\x00":
            out.append(replaced + ("\n" if nl >= 0 else ""))
        pos = end + (1 if nl >= 0 else 0)
    return pos, current


def _blocks(text: str) -> Tuple[str, Optional[_State]]:
    """Find the lines that open a block (a secret YAML key, a .netrc machine, a Kubernetes env name) and redact
    what the following lines hold; returns the state still open at the end of the text."""
    starts: List[Tuple[int, int, _State]] = []
    for m in _BLOCK_START.finditer(text):
        if _kind(m.group(3)) >= SECRET:
            indent = len(m.group(1).expandtabs())
            starts.append((m.start(), m.end(), _State("yaml", indent=indent, scalar=m.group(4) is not None)))
    if "machine" in text or "default" in text:
        for m in _NETRC_START.finditer(text):
            starts.append((m.start(), m.end(), _State("netrc")))
    if "name" in text:
        for m in _ENV_NAME.finditer(text):
            if _kind(m.group(2)) >= WEAK:
                starts.append((m.start(), m.end(), _State("env", name=m.group(2))))
    if not starts:
        return text, None
    starts.sort(key=lambda s: s[0])
    out: List[str] = []
    pos = 0
    state: Optional[_State] = None
    for start, end, opened in starts:
        if start < pos:
            continue
        nl = text.find("\n", end)
        if nl < 0:  # the opening line is the last: the block goes on in the next write
            state = opened
            continue
        out.append(text[pos : nl + 1])
        pos, state = _walk(text, nl + 1, opened, out)
    out.append(text[pos:])
    return "".join(out), state


# --- the pipeline ------------------------------------------------------------------------------------------------
# What the rules need in the text, lower-case: one trie of these finds which are there in one pass, and text with
# none of them is left as it is. None starts with `-`, `x` or a digit (a row of dashes, of x's, the numbers of a
# training log pass at full speed: the scan only stops where a needle could start); the one that would (`7z`) is
# looked for on its own.
_STEM_SET = frozenset(_STEM_WORDS)
_NEEDLES = sorted({*_STEM_WORDS, "basic", "//", "begin", "machine", "login", "user", "curl", "account", "name", "set",
                   *(n for f in _FORMATS for n in f[0]), *_TOOL_NEEDLES})  # fmt: skip
_GATE = re.compile(_trie([n for n in _NEEDLES if not n[0].isdigit()]))
_DIGIT_NEEDLES = tuple(n for n in _NEEDLES if n[0].isdigit())
_STEM_RE = re.compile(_trie(sorted(_STEM_WORDS)))
_PIECE = 64 * 1024  # longer texts are redacted in pieces of whole lines: only pieces with a candidate pay
_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


def _lower(text: str) -> str:
    """A lower-case copy of the same length (str.lower() may grow a character such as `İ`)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def _rules(text: str, low: str, found: Set[str], stems: List[int]) -> str:
    """The rules that need no state, each linear in the text and run only when its needle is there; their spans,
    all found on the same text, are merged and replaced at once."""
    spans = _formats(text, found)
    if "akia" in found or "asia" in found:
        spans += _aws_pairs(text)
    if "//" in found:
        spans += _webhooks(low)
        spans += _userinfo(text)
    if "user" in found or "curl" in found:
        spans += _user_flags(text)
    if found.intersection(_TOOL_NEEDLES):
        spans += _tools(text, low, found)
    if "pass" in found or "account" in found:
        spans += _netrc_lines(text)
    if text.count(":") >= 4:
        spans += _pgpass_lines(text)
    if "auth" in found or "login" in found:
        spans += _auth_calls(text, low)
    if "value" in low and ("name" in found or "key" in found):
        spans += _name_values(text, low)
    if "</" in low and stems:
        spans += _xml_elements(text, low)
    if stems:
        if '"' in text or "'" in text:
            spans += _pairs(text, low, stems)
        spans += _keyed(text, low, stems)
        spans += _flagged(text, low, stems)
        if "set" in found:
            spans += _set_values(text, low)
        if "secret" in found and "client" in low:
            spans += _keyed(text, low, (), client_ids=True)
    if "bearer" in found or "basic" in found or "token" in found:
        spans += _scheme_tokens(text, low)
    return _apply(text, spans)


def _piece(text: str, state: Optional[_State]) -> Tuple[str, Optional[_State]]:
    head: List[str] = []
    if state is not None:
        pos, state = _walk(text, 0, state, head)
        if state is not None or pos >= len(text):
            return "".join(head), state
        text = text[pos:]
    low = _lower(text)
    found = set(_GATE.findall(low))
    found.update(n for n in _DIGIT_NEEDLES if n in low)
    if not found and low.count(":") < 4:
        return "".join(head) + text, None
    if "begin" in found and "-----BEGIN" in text:
        text, state = _pem(text)
        low = _lower(text)
    stems = [m.start() for m in _STEM_RE.finditer(low)] if found & _STEM_SET else []
    text = _rules(text, low, found, stems)
    if stems or "machine" in found or "name" in found:
        text, block = _blocks(text)
        state = state or block
    return "".join(head) + text, state


def _scrub(text: str, state: Optional[_State]) -> Tuple[str, Optional[_State]]:
    pattern = _known_pattern()
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    if len(text) <= _PIECE:
        return _piece(text, state)
    out: List[str] = []
    i = 0
    while i < len(text):
        j = text.find("\n", i + _PIECE)
        j = len(text) if j < 0 else j + 1
        piece, state = _piece(text[i:j], state)
        out.append(piece)
        i = j
    return "".join(out), state


def _failed(exc: BaseException) -> str:
    return f"{REDACTED} (blackbox could not redact this text: {type(exc).__name__}; it is left out)\n"


def redact_text(text: str) -> str:
    """Replace known secret values, token formats and the values of secret-named keys, flags and arguments in
    free text (logs, command lines, configs, exception messages). Linear in the text; never raises (a bug here
    leaves the text out, and says so, rather than write it unredacted)."""
    given: Any = text
    try:
        return _scrub(given if isinstance(given, str) else str(given), None)[0]
    except Exception as exc:  # pragma: no cover - the corpus and the fuzz tests keep this unreached
        return _failed(exc)


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


class StreamRedactor:
    """redact_text for a stream read in pieces (a job's console), keeping what a line says about the next ones: a
    private key whose lines arrive in separate writes loses its body from BEGIN to END (the markers and one
    `<redacted>` line stay, so nothing goes silently; a BEGIN with no body, or a key cut short, never swallows
    what follows — at most MAX_KEY_LINES), a YAML block under a secret key, a .netrc entry, a Kubernetes env entry.

    `feed(text)` returns what is complete and holds back a partial last line (at most MAX_LINE characters) so
    that a secret split across writes is caught; `flush()` returns the rest. Calling the object
    (`redactor(text)`) redacts `text` whole, holding nothing back (for callers that cut at line ends themselves)."""

    MAX_LINE = 64 * 1024  # a partial line longer than this is redacted and passed on in pieces

    def __init__(self, redact: Optional[Callable[[str], str]] = None) -> None:
        self._redact = redact
        self._state: Optional[_State] = None
        self._partial = ""

    def _run(self, text: str) -> str:
        if not text:
            return ""
        try:
            if self._redact is not None and self._redact is not redact_text:
                return self._redact(text)
            out, self._state = _scrub(text, self._state)
            return out
        except Exception as exc:  # pragma: no cover
            self._state = None
            return _failed(exc)

    def __call__(self, text: str) -> str:
        return self._run(self.flush_raw() + text)

    def feed(self, text: str) -> str:
        buf = self._partial + text
        cut = buf.rfind("\n") + 1
        if not cut and len(buf) > self.MAX_LINE:  # one endless line: cut at a space near the end if there is one
            space = max(buf.rfind(" ", len(buf) - 4096), buf.rfind("\t", len(buf) - 4096))
            cut = space + 1 if space > 0 else len(buf)
        self._partial = buf[cut:]
        return self._run(buf[:cut])

    def flush(self) -> str:
        return self._run(self.flush_raw())

    def flush_raw(self) -> str:
        partial, self._partial = self._partial, ""
        return partial


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


# --- config files --------------------------------------------------------------------------------------------
# one `key: value` / `key = value` / `"key": value` line of YAML, TOML, INI, .env or JSON
_CONFIG_LINE = re.compile(r"^(\s*(?:export\s+)?[\"']?)([A-Za-z0-9_.\-]+)([\"']?\s*[:=]\s*)(.*?)(\s*,?\s*)$")
_LIST_ITEM = re.compile(r"^(\s*-\s+)(\S.*)$")
_COMMENT = re.compile(r"[ \t]+[#;]")  # an inline comment after a config value
_YAML_TAG = re.compile(r"^(?:!![a-z]{1,16}|![A-Z][A-Za-z]{1,15})(?:[ \t]+|$)")  # `!!binary`, `!Ref` (not `!x8Kq…`)
_TOML_MULTILINE = ('"""', "'''")


def _redact_nested(line: str, found: Optional[List[str]]) -> str:
    """A line inside the block of a secret key: its value goes, its key or list dash stays (the file still
    parses, and says which fields there were)."""
    body = line.rstrip("\r\n")
    end = line[len(body) :]
    item = _LIST_ITEM.match(body)
    if item:
        _found(found, item.group(2))
        return item.group(1) + REDACTED + end
    m = _CONFIG_LINE.match(body)
    if m and m.group(4):
        if m.group(4) in ("|", ">") or not _nested_secret(m.group(2), m.group(4)):
            return line
        _found(found, m.group(4))
        return m.group(1) + m.group(2) + m.group(3) + REDACTED + m.group(5) + end
    if m or not body.strip():
        return line
    _found(found, body.strip())
    return body[: _indent(body)] + REDACTED + end


def _found(found: Optional[List[str]], value: str) -> None:
    if found is not None:
        found.append(value.strip().strip("\"'"))


def redact_config(text: str, found: Optional[List[str]] = None) -> str:
    """A config file (YAML, TOML, INI, JSON, .env): JSON is redacted as data (it still parses); the others line
    by line: the value of a credential-named key replaced, and with it a YAML block scalar (`key: |`), the list
    or table indented under the key, or a TOML multi-line string; then every rule of free text. The lines stay
    where they were. The secret values replaced by the line rules are appended to `found` (to learn them)."""
    try:
        return _config(text, found)
    except Exception as exc:  # pragma: no cover
        return _failed(exc)


def _config(text: str, found: Optional[List[str]]) -> str:
    if text.lstrip().startswith(("{", "[")):
        redacted = redact_json_text(text)
        if redacted is not None:
            if found is not None:
                _json_secrets(json.loads(text), found)
            return redacted
    lines = text.splitlines(keepends=True)
    client_secret = "client" in text.lower() and "secret" in text.lower()
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.rstrip("\r\n")
        m = _CONFIG_LINE.match(body) if len(body) < 4096 else None
        i += 1
        name = m.group(2) if m else ""
        kind = _kind(name) if m else NONE
        if m and client_secret and name.lower().replace("-", "_").endswith("client_id"):
            kind = SECRET
        if not kind:
            out.append(line)
            continue
        value = m.group(4)  # type: ignore[union-attr]
        head = m.group(1) + name + m.group(3)  # type: ignore[union-attr]
        closing = next((q for q in _TOML_MULTILINE if value.startswith(q)), None)
        if closing and closing not in value[3:] and kind >= SECRET:  # TOML: password = """ … """
            out.append(head + value[:3] + REDACTED + line[len(body) :])
            while i < len(lines) and closing not in lines[i]:
                _found(found, lines[i])
                i += 1
            if i < len(lines):
                out.append(lines[i][lines[i].index(closing) :])
                i += 1
            continue
        value = _YAML_TAG.sub("", value)  # `key: !!binary |`
        if value in ("", "|", ">") or (value[:1] in ("|", ">") and len(value) <= 3):  # a YAML block under the key
            out.append(line)
            own = _indent(body)
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > own):
                nested = lines[i]
                if kind < SECRET:
                    out.append(nested)
                elif value and nested.strip():  # a block scalar: every line of it is the value
                    _found(found, nested)
                    out.append(nested[: _indent(nested)] + REDACTED + nested[len(nested.rstrip("\r\n")) :])
                else:
                    out.append(_redact_nested(nested, found) if not value else nested)
                i += 1
            continue
        if _harmless(name, _COMMENT.split(value, 1)[0], kind) or value[:1] in ("{", "["):
            out.append(line)  # a flag, or a table / list on one line: the free-text pass redacts those whole
            continue
        _found(found, value)
        out.append(head + REDACTED + m.group(5) + line[len(body) :])  # type: ignore[union-attr]
    return redact_text("".join(out))


def _json_secrets(data: Any, found: List[str]) -> None:
    """The values of a parsed JSON document's secret-named keys (without recursion), to learn them."""
    stack = [data]
    while stack and len(found) < 1024:
        item = stack.pop()
        if isinstance(item, dict):
            client_ids = _client_ids_with_secret([str(k) for k in item])
            for k, v in item.items():
                kind = SECRET if k in client_ids else _kind(str(k))
                if isinstance(v, str) and kind and not _harmless(str(k), v, kind):
                    found.append(v)
                elif isinstance(v, (dict, list)):
                    if kind >= SECRET and isinstance(v, dict):
                        found.extend(x for x in v.values() if isinstance(x, str))
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf", ".env")
