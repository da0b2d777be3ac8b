"""What a name says: whether `hf_token`, `key_dim` or `PASSWORD` names a secret, and whether a value looks like
one (random, not a word, a number, a path or a call). Stdlib only; imports nothing of blackbox."""

from __future__ import annotations

import functools
import re
from typing import List, Optional

from .common import REDACTED

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
         "identitytoken": SECRET, "registrytoken": SECRET,
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


_YAML_TAG = re.compile(r"^(?:!![a-z]{1,16}|![A-Z][A-Za-z]{1,15})(?:[ \t]+|$)")  # `!!binary`, `!Ref` (not `!x8Kq…`)


worth_knowing = _worth_knowing  # the public name: whether a value is worth scrubbing wherever it shows up
