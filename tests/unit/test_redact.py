"""Redaction's mechanisms: known values in every form they take, the credential stores they are learned from,
names and the values they make secret, command lines, streams split across writes and private keys in them,
and totality (deep nesting, any input) — the corpus of cases is tests/unit/test_redaction_corpus.py."""

from __future__ import annotations

import base64
import json
import os
import random
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from blackbox._recorder import redact as R
from blackbox._recorder.redact import names as RN
from blackbox.redact import (
    REDACTED,
    StreamRedactor,
    add_known_secrets,
    is_secret_name,
    redact_argv,
    redact_config,
    redact_env,
    redact_json_text,
    redact_named,
    redact_text,
    redact_value,
    stored_secrets,
)

FAILED = "could not redact"


def test_token_formats_anywhere() -> None:
    for token in ["hf_" + "a" * 34, "ghp_" + "b" * 36, "AKIA" + "C" * 16, "sk-" + "d" * 40, "xoxb-" + "1" * 20,
                  "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"]:  # fmt: skip
        out = redact_text(f"loading with {token} now")
        assert token not in out and REDACTED in out


def test_known_values_are_scrubbed_in_every_form() -> None:
    # GIVEN a credential of no known format, learned from the job's environment
    secret = "Zq8/w+Tr0ub4dor&3-xy zzy"
    add_known_secrets({"DB_PASSWORD": secret, "HOME_DIR": "/root", "SHORT_TOKEN": "1"})
    user_pw = base64.b64encode(b"trainer:" + secret.encode()).decode()
    forms = {
        "raw": f"connecting as admin:{secret}@db",
        "JSON": json.dumps({"m": f"bad login {secret}"}),
        "URL-encoded": f"https://host/login?pw={quote(secret, safe='')}",
        "form-encoded": f"pw={quote_plus(secret)}",
        "base64": f"blob {base64.b64encode(secret.encode()).decode()} end",
        "base64 inside a longer blob": f"Authorization: X-Custom {user_pw}",
    }
    for how, text in forms.items():
        out = redact_text(text)
        assert REDACTED in out, how
        for form in (secret, quote(secret, safe=""), base64.b64encode(secret.encode()).decode()[:-4]):
            assert form not in out, (how, out)
    # AND ordinary text is left alone
    assert redact_text("HOME is /root, flag 1") == "HOME is /root, flag 1"


@pytest.mark.parametrize(
    ("name", "value"),
    [("DESKTOP_SESSION", "ubuntu"), ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/sa.json"), ("DB_PASSWORD", "12345678"),
     ("API_TOKEN", "true"), ("WANDB_SESSION", "2"), ("HF_TOKEN", "${HF_TOKEN}"), ("DB_PASSWORD", "ubuntu")],
)  # fmt: skip
def test_a_known_value_must_be_worth_scrubbing(name: str, value: str) -> None:
    # GIVEN a credential-named variable whose value is a user name, a number, a path, a flag or a reference
    add_known_secrets({name: value})
    # THEN that value is not scrubbed from every later line (`/home/ubuntu/...` stays)
    line = f"saving to /home/{value}/ckpt at step {value}"
    assert redact_text(line) == line


def test_names_read_what_a_name_names() -> None:
    secret = ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_ACCESS_KEY_ID", "B2_APPLICATION_KEY_ID", "accessKeyId", "private_key_id", "KAGGLE_KEY",
              "B2_APPLICATION_KEY", "FERNET_KEY", "client-key-data", "SLACK_WEBHOOK_URL", "SENTRY_DSN", "GITHUB_PAT",
              "apiKey", "AccountKey", "client_secret", "pass", "pwd", "auth", "session_cookie", "Authorization",
              "SLURM_JWT", "MLFLOW_TRACKING_TOKEN"]  # fmt: skip
    plain = ["tokenizer", "max_tokens", "eos_token_id", "token_type_ids", "tokens_per_sec", "key_dim", "session_dir",
             "TOKENIZER_NAME", "KEY_DIR", "MAX_TOKENS", "AuthenticationError", "PWD", "OLDPWD", "SSH_AUTH_SOCK",
             "num_key_value_heads", "pad_token", "eos_token", "passes", "bypass", "PASSWORD_STORE_CLIP_TIME",
             "secretKeyRef", "NoCredentialsError", "HF_TOKEN_PATH", "WANDB_IDENTITY_TOKEN_FILE",
             "secretary"]  # fmt: skip
    weak = ["token", "key", "session", "DESKTOP_SESSION", "signature", "bucket_key", "MY_TOKEN"]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if RN._kind(n)] == []
    assert [n for n in weak if RN._kind(n) != R.WEAK] == []


def test_a_weak_name_loses_only_a_random_value() -> None:
    assert redact_text("token: Paris") == "token: Paris"
    assert redact_text("session: 3/5 key: input_ids") == "session: 3/5 key: input_ids"
    assert redact_text("token: 8f3a9c1b7e2d4f6a") == f"token: {REDACTED}"
    assert redact_text("key=ZmDfcTF7_60GrrY167zsiPd67pEvs") == f"key={REDACTED}"


def test_a_credential_id_is_part_of_the_credential() -> None:
    # issue 26, item 5: the AWS key id, *_ACCESS_KEY_ID, *_CLIENT_ID beside a client secret, AKIA/ASIA anywhere
    env = {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "MINIO_ACCESS_KEY_ID": "minio-trainer-01",
           "AZURE_CLIENT_ID": "6f2d1a3b-0000-4000-a000-000000000000", "AZURE_CLIENT_SECRET": "abc8Q~xyz",
           "GITHUB_CLIENT_ID": "Iv1.0123456789abcdef", "APP_NAME": "trainer"}  # fmt: skip
    out = redact_env(env)
    assert [k for k, v in out.items() if v != REDACTED] == ["GITHUB_CLIENT_ID", "APP_NAME"]
    assert redact_text("s3://bucket/keys/ASIAY34FZKBOKMUTVV7A/x") == f"s3://bucket/keys/{REDACTED}/x"
    record = redact_value({"client_id": "1234abcd", "client_secret": "s3cr3t-value", "name": "app"})
    assert record == {"client_id": REDACTED, "client_secret": REDACTED, "name": "app"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["mysql", "-p", "hunter2"], ["mysql", "-p", REDACTED]),
        (["mysql", "-uroot", "-phunter2"], ["mysql", "-uroot", f"-p{REDACTED}"]),
        (["app", "--pass", "x1y2z3"], ["app", "--pass", REDACTED]),
        (["curl", "-u", "alice:pw99", "url"], ["curl", "-u", f"alice:{REDACTED}", "url"]),
        (["ssh", "-p", "2222", "host"], ["ssh", "-p", "2222", "host"]),
        (["mkdir", "-p", "checkpoints/run1"], ["mkdir", "-p", "checkpoints/run1"]),
        (["pytest", "-p", "no:cacheprovider"], ["pytest", "-p", "no:cacheprovider"]),
        (["python", "job.py", "-p", "mysqlpass77"], ["python", "job.py", "-p", "mysqlpass77"]),
        (["wandb", "login", "--relogin", "0123456789abcdef0123456789abcdef01234567"],
         ["wandb", "login", "--relogin", REDACTED]),
        (["train.py", "--hf-token", "abc123", "--api_key=xyz", "--lr", "0.1"],
         ["train.py", "--hf-token", REDACTED, f"--api_key={REDACTED}", "--lr", "0.1"]),
        (["train.py", "--tokenizer", "gpt2", "--max-tokens", "4096", "--session-dir", "/s", "--session", "2"],
         ["train.py", "--tokenizer", "gpt2", "--max-tokens", "4096", "--session-dir", "/s", "--session", "2"]),
        (["train.py", "--use-auth-token", "True", "--token", "abc"], ["train.py", "--use-auth-token", "True", "--token",
                                                                      REDACTED]),
    ],
)  # fmt: skip
def test_command_lines(argv: list[str], expected: list[str]) -> None:
    # `-p` is a password only where the tool takes one that way
    assert redact_argv(argv) == expected


def test_config_files_keep_their_shape_and_lose_their_secrets() -> None:
    text = (
        "model: gpt\n"
        "wandb_api_key: 0123456789abcdef\n"  # YAML
        'password = "hunter2hunter2"\n'  # TOML / INI
        '  "session_cookie": "c00k1e-value",\n'  # JSON
        "export HF_TOKEN=plainvalue99\n"  # .env
        "keys: [a, b]\n"
        "private_key: |\n  line-one-of-the-key\n  line-two-of-the-key\n"
        "auth:\n  type: basic\n  username: bob\n  password: nested-pass\n"
        "api_keys:\n  - listed-key-1\n  - listed-key-2\n"
        "tokenizer: gpt2\n"
    )
    found: list[str] = []
    out = redact_config(text, found)
    for secret in ("0123456789abcdef", "hunter2hunter2", "c00k1e-value", "plainvalue99", "line-one", "nested-pass",
                   "listed-key"):  # fmt: skip
        assert secret not in out, out
        assert any(secret in f for f in found), secret  # learned, to be scrubbed elsewhere too
    assert "model: gpt\n" in out and "keys: [a, b]\n" in out and "tokenizer: gpt2\n" in out
    assert "  type: basic\n" in out and "  username: bob\n" in out  # what only names or describes stays
    assert out.count("\n") == text.count("\n")


def test_json_configs_still_parse_and_keep_what_only_describes() -> None:
    text = json.dumps({"model": "gpt2", "tokens_per_sec": 5, "credentials": {"type": "oauth", "key": "k3y-v4lue-0042",
                                                                               "refresh": "r3fr3sh"}})  # fmt: skip
    data = json.loads(redact_config(text))
    assert data == {"model": "gpt2", "tokens_per_sec": 5, "credentials": {"type": "oauth", "key": REDACTED,
                                                                          "refresh": REDACTED}}  # fmt: skip


def test_records_are_redacted_as_values_and_still_parse() -> None:
    record = {"metrics": {"tokens_per_sec": 51234.5, "max_tokens": 4096}, "password": 'pw"with\\quote',
              "argv": ["--hf-token", "abc123def"], "message": "failed with token=abc987xyz1"}  # fmt: skip
    text = json.dumps(redact_value(record))
    assert json.loads(text)["metrics"] == {"tokens_per_sec": 51234.5, "max_tokens": 4096}
    for secret in ('pw\\"with', "abc123def", "abc987xyz1"):
        assert secret not in text


def test_named_values_from_py_spy_locals() -> None:
    assert redact_named("api_key", "'sk-xyz'") == REDACTED
    assert redact_named("key", "'model.layers.3.weight'") == "'model.layers.3.weight'"
    assert redact_named("key", "'8f3a9c1b7e2d4f6a9b0c'") == REDACTED


# --- credential stores ---------------------------------------------------------------------------------------
def _home(tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A HOME holding the stores tools keep, and {store: the secret it holds}."""
    home = tmp_path / "home"
    s = {name: base64.b32encode(os.urandom(15)).decode().lower() + "X9" for name in (
        "netrc", "netrc2", "aws", "aws_session", "gcloud", "hf", "kaggle", "kube", "kubedata", "docker", "pgpass",
        "git", "databricks", "config", "gcloud_db")}  # fmt: skip
    files = {
        ".netrc": f"machine api.wandb.ai login user password {s['netrc']}\n"
                  f"machine h\n  login u\n  password {s['netrc2']}\n",
        ".aws/credentials": f"[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = {s['aws']}\n"
                            f"aws_session_token = {s['aws_session']}\nregion = us-east-1\n",
        ".config/gcloud/application_default_credentials.json": json.dumps(
            {"client_id": "764086051850.apps.googleusercontent.com", "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty",
             "refresh_token": s["gcloud"], "type": "authorized_user"}),
        ".cache/huggingface/token": s["hf"] + "\n",
        ".kaggle/kaggle.json": json.dumps({"username": "trainer", "key": s["kaggle"]}),
        ".kube/config": f"users:\n- name: sa\n  user:\n    token: {s['kube']}\n    client-key-data: {s['kubedata']}\n",
        ".docker/config.json": json.dumps({"auths": {"r.example.com": {
            "auth": base64.b64encode(f"trainer:{s['docker']}".encode()).decode()}}}),
        ".pgpass": f"db.internal:5432:runs:trainer:{s['pgpass']}\n",
        ".git-credentials": f"https://trainer:{s['git']}@git.example.com\n",
        ".databrickscfg": f"[DEFAULT]\nhost = https://dbc.cloud.databricks.com\ntoken = {s['databricks']}\n",
    }  # fmt: skip
    for rel, content in files.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    db = sqlite3.connect(home / ".config/gcloud/credentials.db")
    db.execute("CREATE TABLE credentials (account_id TEXT PRIMARY KEY, value BLOB)")
    db.execute(
        "INSERT INTO credentials VALUES (?, ?)", ("me@example.com", json.dumps({"refresh_token": s["gcloud_db"]}))
    )
    db.commit()
    db.close()
    (tmp_path / "train.yaml").write_text(f"lr: 0.1\nwandb:\n  api_key: {s['config']}\n")
    return {"HOME": str(home)}, s


def test_the_credentials_the_user_already_has_are_learned(tmp_path: Path) -> None:
    # GIVEN a HOME holding the stores of the usual tools, and a config file named on the command line
    env, secrets = _home(tmp_path)
    # WHEN the job's credentials are learned
    values = stored_secrets(env, ["python", "train.py", "--config", "train.yaml"], str(tmp_path))
    # THEN every store's secret is known, and no user name or path is
    assert sorted(k for k, v in secrets.items() if v not in values) == []
    assert "trainer" not in values and "user" not in values
    add_known_secrets(env, ["python", "train.py", "--config", "train.yaml"], str(tmp_path))
    for value in secrets.values():
        assert value not in redact_text(f"oops, printed {value} in a log line")


def test_a_store_that_is_not_a_regular_file_of_the_user_is_never_read(tmp_path: Path) -> None:
    env, secrets = _home(tmp_path)
    home = Path(env["HOME"])
    (home / ".netrc").unlink()
    os.mkfifo(home / ".netrc")  # a FIFO: reading it would block forever
    os.chown(home / ".pgpass", 65534, 65534)  # another user's file
    values = stored_secrets(env)
    assert secrets["netrc"] not in values and secrets["pgpass"] not in values
    assert secrets["aws"] in values
    assert stat.S_ISFIFO(os.stat(home / ".netrc").st_mode)


# --- streams ---------------------------------------------------------------------------------------------------
def test_a_secret_split_across_writes_is_caught() -> None:
    stream = StreamRedactor()
    writes = [
        "step 1\npassword=hun",
        "ter2-",
        "xyz\nAuthorization: Bearer eyJhbGciOiJIUzI1Ni",
        "J9.eyJzdWIiOiIx.c2ln\n",
    ]
    out = "".join(stream.feed(w) for w in writes) + stream.flush()
    assert out == f"step 1\npassword={REDACTED}\nAuthorization: Bearer {REDACTED}\n"


def test_calling_the_stream_redactor_holds_nothing_back() -> None:
    # the call form (what console_log uses today, cutting at line ends itself) returns all it is given
    stream = StreamRedactor()
    assert stream("no newline yet") == "no newline yet"
    assert stream("step 2\n") == "step 2\n"


def test_a_key_printed_line_by_line_keeps_its_markers_and_loses_its_body() -> None:
    stream = StreamRedactor()
    body = ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAABlwAAAAdzc2gtcn", "NhAAAAAwEAAQAAAYEAxQ=="]
    writes = ["starting\n-----BEGIN OPENSSH PRIVATE KEY-----\n", *[b + "\n" for b in body],
              "-----END OPENSSH PRIVATE KEY-----\nstep 1 loss 2.0\n"]  # fmt: skip
    out = "".join(stream(w) for w in writes)
    assert out == ("starting\n-----BEGIN OPENSSH PRIVATE KEY-----\n" + REDACTED + "\n"
                   "-----END OPENSSH PRIVATE KEY-----\nstep 1 loss 2.0\n")  # fmt: skip


def test_an_unterminated_begin_never_swallows_what_follows() -> None:
    stream = StreamRedactor()
    writes = ["ValueError: bad key file, it starts with -----BEGIN PRIVATE KEY-----\n", "Killed\n", "Done\n",
              "Traceback (most recent call last):\n", '  File "train.py", line 3, in <module>\n',
              "RuntimeError: NCCL error\n"]  # fmt: skip
    assert "".join(stream(w) for w in writes) == "".join(writes)
    # AND a key cut short loses its body, not the crash after it
    stream = StreamRedactor()
    writes = [
        "-----BEGIN PRIVATE KEY-----\n",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n",
        "Traceback (most recent call last):\n",
    ]
    assert (
        "".join(stream(w) for w in writes)
        == f"-----BEGIN PRIVATE KEY-----\n{REDACTED}\nTraceback (most recent call last):\n"
    )


def test_a_key_state_is_bounded() -> None:
    stream = StreamRedactor()
    lines = [f"AAAA{i:04d}BBBBCCCCDDDD" for i in range(R.MAX_KEY_LINES + 20)]
    out = stream("-----BEGIN PRIVATE KEY-----\n") + "".join(stream(line + "\n") for line in lines)
    assert lines[R.MAX_KEY_LINES + 5] in out and lines[10] not in out


def test_an_endless_line_is_passed_on_in_pieces() -> None:
    stream = StreamRedactor()
    out = stream.feed("x" * (StreamRedactor.MAX_LINE + 10))
    assert len(out) >= StreamRedactor.MAX_LINE and out + stream.flush() == "x" * (StreamRedactor.MAX_LINE + 10)


# --- totality -------------------------------------------------------------------------------------------------
def test_deep_nesting_never_raises() -> None:
    deep = "[" * 5000 + "]" * 5000
    assert redact_json_text(deep) is None  # too deep to redact as data: redacted as text
    assert redact_config(deep) == deep
    nested: object = "x"
    for _ in range(5000):
        nested = [nested]
    assert isinstance(redact_value(nested), list)
    obj = '{"a": ' * 300 + '{"password": "deep-secret-99"}' + "}" * 300
    assert "deep-secret-99" not in redact_config(obj)


def test_any_input_is_redacted_without_an_exception() -> None:
    rng = random.Random(7)
    atoms = ["password", "token", "key", "=", ":", " ", "\n", '"', "'", "\\", "\\n", "-----BEGIN PRIVATE KEY-----",
             "-----END PRIVATE KEY-----", "AKIA", "{", "}", "[", "]", "(", ")", "--", "-p", "mysql", "wandb login",
             "://", "@", "a", "Z9", "é", "İ", "\r", "\t", "machine", "- name: X_TOKEN", "value:", "&", "?"]  # fmt: skip
    for _ in range(1500):
        text = "".join(rng.choice(atoms) for _ in range(rng.randrange(1, 60)))
        for out in (redact_text(text), redact_config(text), " ".join(redact_argv(text.split())),
                    json.dumps(redact_value({"k": text, text: [text]})), StreamRedactor()(text)):  # fmt: skip
            assert FAILED not in out, text
