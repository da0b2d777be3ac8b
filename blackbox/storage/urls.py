"""Storage URLs: which backend a URL needs (an optional extra each), opening it through fsspec, and how a URL or a
backend's error may be shown (no credentials: a URL's user part and query, keys and signatures in an error, are
scrubbed). Never prints. Imports the stdlib, blackbox.errors and blackbox.redact; fsspec and the backends lazily."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import parse_qsl, urlsplit

from ..errors import BlackboxError
from ..redact import add_env_secrets, add_known_secret, redact_text


@dataclass(frozen=True)
class Backend:
    protocol: str  # fsspec's name
    module: str  # the package that implements it
    extra: str  # pip install 'torch-blackbox[EXTRA]'
    what: str  # in a sentence


BACKENDS: dict[str, Backend] = {
    "s3": Backend("s3", "s3fs", "s3", "S3"),
    "s3a": Backend("s3", "s3fs", "s3", "S3"),
    "gs": Backend("gcs", "gcsfs", "gcs", "Google Cloud Storage"),
    "gcs": Backend("gcs", "gcsfs", "gcs", "Google Cloud Storage"),
    "az": Backend("abfs", "adlfs", "azure", "Azure Blob Storage"),
    "abfs": Backend("abfs", "adlfs", "azure", "Azure Blob Storage"),
    "abfss": Backend("abfs", "adlfs", "azure", "Azure Blob Storage"),
    "file": Backend("file", "fsspec", "", "a shared filesystem"),
}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

# the environment variables the backends take credentials from: their values are scrubbed from every message
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                  "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING",
                  "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_OAUTH_ACCESS_TOKEN")  # fmt: skip


_ENDPOINT_PATH = re.compile(r"(https?://[^/\s\"']+)/[^\s\"']*")


def scheme(url: str) -> Optional[str]:
    m = _SCHEME.match(url)
    return m.group(1).lower() if m else None


def is_url(text: str) -> bool:
    """A storage URL blackbox knows (s3://, gs://, az://, file://…), not a local path."""
    return scheme(text) in BACKENDS


def parse_target(value: str) -> str:
    """--upload's value: a known storage URL (without a trailing slash) or a local directory path (made absolute);
    ValueError for anything else (http://, an empty string)."""
    text = str(value).strip()
    if not text:
        raise ValueError(value)
    found = scheme(text)
    if found is None:
        return os.path.abspath(os.path.expanduser(text))
    if found not in BACKENDS or len(text) <= len(found) + 3:
        raise ValueError(value)
    return text.rstrip("/") if not text.endswith(":///") else text


def display(url: str) -> str:
    """The URL as it may be shown and logged: no user part, no query (an Azure SAS token lives there)."""
    if not is_url(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{parts.path}"


def add_url_secrets(url: str) -> None:
    """A URL's password and query values are credentials: scrubbed from everything blackbox writes from now on."""
    if not is_url(url):
        return
    parts = urlsplit(url)
    if parts.password:
        add_known_secret(parts.password)
    for _, value in parse_qsl(parts.query):
        add_known_secret(value)


def join(root: str, key: str) -> str:
    return root.rstrip("/") + "/" + key.lstrip("/")


def scrub(message: str, env: Optional[dict[str, str]] = None) -> str:
    """A backend's error as one short line without credentials, through the one redaction path: the backends' own
    credential variables become known values, and signed request fields (botocore and azure echo them) and anything
    that looks like a secret go by the shared rules."""
    source = os.environ if env is None else env
    add_env_secrets({name: source[name] for name in CREDENTIAL_ENV if source.get(name)})  # the one path: known values
    line = " ".join(redact_text(message).split())
    return line[:300] + ("…" if len(line) > 300 else "")


def describe_error(exc: BaseException) -> str:
    """What went wrong, in words a user acts on, scrubbed."""
    if isinstance(exc, PermissionError):
        kind = "access refused (credentials or permissions)"
    elif isinstance(exc, FileNotFoundError):
        kind = "not found (no such bucket or container?)"
    elif isinstance(exc, TimeoutError):
        kind = "timed out"
    else:
        kind = type(exc).__name__
    text = _ENDPOINT_PATH.sub(r"\1", str(exc)).strip().rstrip(".") or kind  # the endpoint says enough
    return scrub(f"{kind}: {text}" if text != kind else kind)


def permanent(exc: BaseException) -> bool:
    """Errors a retry will not mend: refused credentials, a missing bucket, a missing backend."""
    return isinstance(exc, (PermissionError, FileNotFoundError, ImportError, NotADirectoryError, IsADirectoryError))


def open_fs(url: str, timeout: Optional[float] = None) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for a storage URL or a local path. `timeout`: seconds a connection or
    a read may take (S3), so that an unanswering server fails within the caller's bound. A missing backend is a
    BlackboxError with the extra to install."""
    found = scheme(url)
    backend = BACKENDS.get(found or "file")
    if backend is None:
        raise BlackboxError(f"`{display(url)}` is not a storage URL blackbox knows (s3://, gs://, az://, file:// "
                            "or a path).")  # fmt: skip
    try:
        import fsspec.core
    except ImportError:
        raise BlackboxError("Shared storage needs fsspec, which is not installed here.",
                            hint="pip install 'torch-blackbox[s3]' (or [gcs], [azure]).") from None  # fmt: skip
    options: dict[str, Any] = {}
    if backend.protocol == "s3":
        options["skip_instance_cache"] = True
        if timeout is not None:
            t = max(1.0, timeout)
            options["config_kwargs"] = {"connect_timeout": min(t, 10.0), "read_timeout": t,
                                        "retries": {"max_attempts": 1}}  # fmt: skip
    target = url if found else os.path.abspath(url)
    try:
        fs, path = fsspec.core.url_to_fs(target, **options)
    except ImportError:
        extra = f"pip install 'torch-blackbox[{backend.extra}]'" if backend.extra else "pip install fsspec"
        raise BlackboxError(
            f"`{found}://` storage needs the {backend.what} backend ({backend.module}), which is not installed here.",
            hint=f"{extra}",
        ) from None
    except (ValueError, TypeError) as exc:
        raise BlackboxError(f"`{display(url)}` cannot be opened: {scrub(str(exc))}.") from None
    if backend.protocol == "s3":
        fs.retries = 1  # blackbox retries, within its own bound
    return fs, str(path)
