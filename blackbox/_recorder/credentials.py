"""Where a job's user already keeps credentials (~/.netrc, ~/.aws, gcloud, Hugging Face, Kaggle, kubeconfig, Docker,
Databricks, MLflow, .pgpass, .my.cnf, git, gh, PyPI, npm) and the config files named on its command line: read only
to learn the values to scrub, never copied anywhere. Stdlib only (it runs in the ranks too); each read is bounded,
never blocks and never reads what is not a regular file of the job's user. Feeds blackbox._recorder.redact (which
never imports it back): `add_known_secrets` is where the job's credentials are learnt."""

from __future__ import annotations

import base64
import binascii
import glob
import json
import os
import stat
from typing import Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import redact
from .redact.known import url_secrets

MAX_FILE = 1024 * 1024  # bytes read of one store
MAX_FILES = 64
MAX_CONFIGS = 16


def _read(path: str, owners: Sequence[int]) -> Optional[str]:
    """A regular file owned by the job's user (or by us), at most MAX_FILE bytes; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
            return None
        chunks: List[bytes] = []
        left = MAX_FILE
        while left > 0:
            data = os.read(fd, min(left, 65536))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _netrc(text: str) -> Iterator[str]:
    words = text.split()
    for i, word in enumerate(words[:-1]):
        if word in ("password", "account"):
            yield words[i + 1].strip("\"'")


def _pgpass(text: str) -> Iterator[str]:
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            fields = line.replace("\\:", "\x00").split(":")
            if len(fields) == 5:
                yield fields[4].replace("\x00", ":").replace("\\\\", "\\")


def _config(text: str) -> Iterator[str]:
    found: List[str] = []
    redact.redact_config(text, found)
    yield from found
    yield from url_secrets(text)


def _docker(text: str) -> Iterator[str]:
    """Docker's config.json: `auths.<registry>.auth` is base64 of `user:password`; identity tokens too."""
    yield from _config(text)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return
    auths = data.get("auths") if isinstance(data, dict) else None
    for entry in (auths or {}).values() if isinstance(auths, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user_pw = base64.b64decode(entry["auth"], validate=True).decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                continue
            if ":" in user_pw:
                yield user_pw.split(":", 1)[1]


def _plain(text: str) -> Iterator[str]:
    """A file holding just a token (Hugging Face's `token`), or `name=token` lines (its `stored_tokens`)."""
    for line in text.splitlines():
        value = line.split("=", 1)[1] if "=" in line and not line.startswith("hf_") else line
        if value.strip():
            yield value.strip()


def _sqlite(path: str, owners: Sequence[int]) -> Iterator[str]:
    """gcloud's credentials.db and access_tokens.db: opened read-only and immutable, never locked or written."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners or st.st_size > 16 * MAX_FILE:
        return
    try:
        import sqlite3
        from urllib.parse import quote

        con = sqlite3.connect(f"file:{quote(path)}?mode=ro&immutable=1", uri=True, timeout=0.5)
    except Exception:
        return
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()]
        for table in tables[:8]:
            cur = con.execute(f'SELECT * FROM "{table}" LIMIT 256')
            names = [d[0] for d in cur.description or ()]
            for row in cur.fetchall():
                for name, value in zip(names, row):
                    if not isinstance(value, str):
                        continue
                    if value.lstrip().startswith("{"):
                        yield from _config(value)
                    elif redact.is_secret_name(name):
                        yield value
    except Exception:
        return
    finally:
        con.close()


def _home(env: Mapping[str, str]) -> Optional[str]:
    home = env.get("HOME")
    return home if home and os.path.isabs(home) else None


Parser = Union[Callable[[str], Iterator[str]], str]  # a function of the file's text, or "sqlite"


def _stores(env: Mapping[str, str], home: str) -> Iterator[Tuple[str, Parser]]:
    """(path, parser) for every place a tool keeps credentials, the tool's own variables first."""

    def under(*parts: str) -> str:
        return os.path.join(home, *parts)

    xdg_config = env.get("XDG_CONFIG_HOME") or under(".config")
    xdg_cache = env.get("XDG_CACHE_HOME") or under(".cache")
    yield env.get("NETRC") or under(".netrc"), _netrc
    yield under("_netrc"), _netrc
    yield env.get("AWS_SHARED_CREDENTIALS_FILE") or under(".aws", "credentials"), _config
    yield env.get("AWS_CONFIG_FILE") or under(".aws", "config"), _config
    gcloud = env.get("CLOUDSDK_CONFIG") or os.path.join(xdg_config, "gcloud")
    yield os.path.join(gcloud, "application_default_credentials.json"), _config
    for adc in sorted(glob.glob(os.path.join(gcloud, "legacy_credentials", "*", "adc.json")))[:8]:
        yield adc, _config
    for boto in sorted(glob.glob(os.path.join(gcloud, "legacy_credentials", "*", ".boto")))[:8]:
        yield boto, _config
    yield os.path.join(gcloud, "credentials.db"), "sqlite"
    yield os.path.join(gcloud, "access_tokens.db"), "sqlite"
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        yield env["GOOGLE_APPLICATION_CREDENTIALS"], _config
    hf_home = env.get("HF_HOME") or os.path.join(xdg_cache, "huggingface")
    yield env.get("HF_TOKEN_PATH") or os.path.join(hf_home, "token"), _plain
    yield os.path.join(hf_home, "stored_tokens"), _plain
    yield under(".huggingface", "token"), _plain
    kaggle = env.get("KAGGLE_CONFIG_DIR")
    yield os.path.join(kaggle, "kaggle.json") if kaggle else under(".kaggle", "kaggle.json"), _config
    yield os.path.join(xdg_config, "kaggle", "kaggle.json"), _config
    for kubeconfig in (env.get("KUBECONFIG") or under(".kube", "config")).split(os.pathsep)[:8]:
        if kubeconfig:
            yield kubeconfig, _config
    yield os.path.join(env.get("DOCKER_CONFIG") or under(".docker"), "config.json"), _docker
    yield env.get("DATABRICKS_CONFIG_FILE") or under(".databrickscfg"), _config
    yield under(".mlflow", "credentials"), _config
    yield env.get("PGPASSFILE") or under(".pgpass"), _pgpass
    yield under(".my.cnf"), _config
    yield under(".git-credentials"), url_secrets
    yield os.path.join(xdg_config, "git", "credentials"), url_secrets
    yield os.path.join(env.get("GH_CONFIG_DIR") or os.path.join(xdg_config, "gh"), "hosts.yml"), _config
    yield under(".pypirc"), _config
    yield under(".npmrc"), _config
    yield os.path.join(xdg_config, "pip", "pip.conf"), url_secrets
    yield under(".modal.toml"), _config
    yield under(".ngc", "config"), _config
    yield under(".comet.config"), _config
    yield under(".azure", "msal_token_cache.json"), _config
    yield under(".azure", "accessTokens.json"), _config


def config_files(argv: Sequence[str], cwd: str) -> List[str]:
    """Config files named on a command line (`--config x.yaml`, `--cfg=x.toml`, `x.json`), existing ones only."""
    out: List[str] = []
    for arg in list(argv)[1:]:
        value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
        if not value.lower().endswith(redact.CONFIG_SUFFIXES):
            continue
        path = os.path.normpath(os.path.join(cwd, value))
        if os.path.isfile(path) and path not in out:
            out.append(path)
    return out[:MAX_CONFIGS]


def stored_secrets(env: Mapping[str, str], argv: Sequence[str] = (), cwd: Optional[str] = None) -> List[str]:
    """The secret values kept in the stores of `env`'s user (its HOME) and in the config files named on
    `argv` (relative to `cwd`). Best effort: what cannot be read is skipped."""
    home = _home(env)
    owners = [os.geteuid()]
    values: List[str] = []
    if home:
        try:
            owners.append(os.stat(home).st_uid)
        except OSError:
            home = None
    paths_seen = 0
    if home:
        for path, parse in _stores(env, home):
            if paths_seen >= MAX_FILES or not path:
                break
            paths_seen += 1
            if isinstance(parse, str):  # "sqlite"
                values.extend(_sqlite(path, owners))
                continue
            text = _read(path, owners)
            if text:
                values.extend(parse(text))
    for path in config_files(argv, cwd or os.getcwd()) if argv else ():
        text = _read(path, owners)
        if text:
            values.extend(_config(text))
    return [v for v in values if isinstance(v, str)]


def add_known_secrets(env: Mapping[str, str], argv: Sequence[str] = (), cwd: Optional[str] = None) -> int:
    """Learn the job's credentials so that every text redacted from now on loses them: the values of `env`'s
    credential-named variables, the credentials its user keeps where tools keep them (under `env`'s HOME:
    ~/.netrc, ~/.aws, gcloud, Hugging Face, Kaggle, kubeconfig, Docker, ...), and the secret values of the config
    files named on `argv`. Returns how many forms are now known."""
    redact.add_env_secrets(env)
    try:
        for value in stored_secrets(env, argv, cwd):
            if redact.worth_knowing(value):
                redact.add_known_secret(value)
    except Exception:  # reading a user's files is best effort: the rules still apply
        pass
    return redact.known_count()
