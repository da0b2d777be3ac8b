"""The redaction corpus: every secret a row that must vanish, every ML look-alike a row that must survive intact,
through each path text takes to disk (free text and console lines, command lines, config files, JSON records,
the environment)."""

from __future__ import annotations

import json

import pytest

from blackbox.redact import (
    REDACTED,
    StreamRedactor,
    add_known_secrets,
    is_secret_name,
    redact_argv,
    redact_config,
    redact_env,
    redact_text,
    redact_value,
)

# (text, the secret in it): free text, as a job prints it or an exception says it
SECRETS_IN_TEXT = [
    ("mysql -u root -p hunter2 -h db", "hunter2"),
    ("login --pass s3cr3tvalue --verbose", "s3cr3tvalue"),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0a2V5Zm9yYXp1cmU9PQ==;EndpointSuffix=core",
        "c2VjcmV0a2V5Zm9yYXp1cmU9PQ==",
    ),
    ("https://acct.blob.core.windows.net/c?sv=2022-11-02&sr=b&sig=abcDEF123%2Bxyz%3D&se=2027", "abcDEF123%2Bxyz%3D"),
    ("SharedAccessSignature=sv=2021&sig=qwertyuiop12345", "qwertyuiop12345"),
    ("cache at redis://:redispass99@cache:6379/0", "redispass99"),
    (
        "posting to https://hooks.slack.com/services/T0123ABCD/B0123ABCD/abcdefghijklmnopqrstuvwx",
        "abcdefghijklmnopqrstuvwx",
    ),
    (
        "posting to https://discord.com/api/webhooks/123456789012345678/AbCdEf-GhIjKl_MnOpQrStUv",
        "AbCdEf-GhIjKl_MnOpQrStUv",
    ),
    (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBGN0bW9yZXNlY3JldA\n-----END PGP PRIVATE KEY BLOCK-----",
        "lQOYBGN0bW9yZXNlY3JldA",
    ),
    ("curl -u alice:curlpass77 https://api.example.com", "curlpass77"),
    ("curl --user alice:curlpass78 https://api.example.com", "curlpass78"),
    ("password: correct horse battery staple", "horse battery staple"),
    ('password="correct horse battery"', "horse battery"),
    ("pass: passvalue42", "passvalue42"),
    ("pwd: pwdvalue42", "pwdvalue42"),
    ("db_passwd=pw-value-9", "pw-value-9"),
    ("PGPASSWORD=pgpass123 psql", "pgpass123"),
    ("hf_token: abcdef123456", "abcdef123456"),
    ("apiKey: camelcase-key-1", "camelcase-key-1"),
    ("client_secret = 'quoted secret value'", "secret value"),
    ("Authorization: Bearer eyJraWQ.abc.def", "eyJraWQ.abc.def"),
    ('{"credentials": {"user": "alice", "refresh": "r3fr3sh-value"}}', "r3fr3sh-value"),
    ("auth: user:authpass5", "authpass5"),
    ("SENTRY_DSN=https://k3y@o1.ingest.sentry.io/1", "k3y"),
    ("session_cookie=c00kievalue", "c00kievalue"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
]

# text that holds no secret and must come out exactly as it went in
LOOKALIKES = [
    "tokenizer: gpt2",
    "max_tokens: 4096",
    "eos_token_id=2",
    "token_type_ids: [0, 0, 1]",
    "tokens_per_sec: 1234.5",
    '{"step": 10, "tokens_per_sec": 51234.2, "loss": 1.25}',
    "key_dim: 64",
    "num_key_value_heads: 8",
    "past_key_values=None",
    "key_padding_mask: true",
    "--session-dir /tmp/sess",
    "use_auth_token=True",
    "AuthenticationError: Incorrect label shape",
    "TOKENIZER_NAME=meta-llama/Llama-3-8B",
    "KEY_DIR=/data/imagenet",
    "MAX_TOKENS=2048",
    "pad_token: <pad>",
    'eos_token: "</s>"',
    "bos_token=<|begin_of_text|>",
    "mask_token: [MASK]",
    "keys: [a, b]",
    "monkey: george",
    "passes: 3",
    "bypass_cache: true",
    "compass=north",
    "secretary: bob",
    "SSH_AUTH_SOCK=/tmp/ssh-agent.sock",
    "AWS_ACCESS_KEY_ID=dummy-id",
    "Authentication failed for user bob",
    "token budget exhausted at step 10",
    "mkdir -p /tmp/out",
    "ssh -p 2222 host",
    "token_budget: 100000",
    "GOOGLE_APPLICATION_CREDENTIALS_PATH=/etc/creds.json",
]


@pytest.mark.parametrize(("text", "secret"), SECRETS_IN_TEXT, ids=[s for _, s in SECRETS_IN_TEXT])
def test_secret_in_text_is_gone(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out, out
    assert REDACTED in out


@pytest.mark.parametrize("text", LOOKALIKES)
def test_lookalike_is_kept_intact(text: str) -> None:
    assert redact_text(text) == text
    assert redact_config(text + "\n") == text + "\n"


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
     "SLACK_WEBHOOK_URL", "SENTRY_DSN", "GITHUB_PAT", "apiKey", "AccountKey", "client_secret", "pass", "pwd",
     "auth", "session_cookie", "private_key", "Authorization"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["tokenizer", "max_tokens", "eos_token_id", "token_type_ids", "tokens_per_sec", "key_dim", "session_dir",
     "TOKENIZER_NAME", "KEY_DIR", "MAX_TOKENS", "AuthenticationError", "PWD", "OLDPWD", "SSH_AUTH_SOCK",
     "num_key_value_heads", "keys", "pad_token", "eos_token", "passes", "bypass"],
)  # fmt: skip
def test_lookalike_names(name: str) -> None:
    assert not is_secret_name(name)


def test_environment_keeps_ml_values() -> None:
    env = {"TOKENIZER_NAME": "meta-llama/Llama-3-8B", "KEY_DIR": "/data/imagenet", "MAX_TOKENS": "2048",
           "PWD": "/work", "HF_TOKEN": "hf_" + "x" * 34, "PGPASSWORD": "pw123456"}  # fmt: skip
    out = redact_env(env)
    assert out["TOKENIZER_NAME"] == "meta-llama/Llama-3-8B" and out["KEY_DIR"] == "/data/imagenet"
    assert out["MAX_TOKENS"] == "2048" and out["PWD"] == "/work"
    assert out["HF_TOKEN"] == REDACTED and out["PGPASSWORD"] == REDACTED


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["mysql", "-p", "hunter2"], ["mysql", "-p", REDACTED]),
        (["app", "--pass", "x1y2z3"], ["app", "--pass", REDACTED]),
        (["curl", "-u", "alice:pw99", "url"], ["curl", "-u", f"alice:{REDACTED}", "url"]),
        (["ssh", "-p", "2222", "host"], ["ssh", "-p", "2222", "host"]),
        (["train.py", "--tokenizer", "gpt2", "--max-tokens", "4096", "--session-dir", "/s"],
         ["train.py", "--tokenizer", "gpt2", "--max-tokens", "4096", "--session-dir", "/s"]),
        (["train.py", "--use-auth-token", "True"], ["train.py", "--use-auth-token", "True"]),
    ],
)  # fmt: skip
def test_command_lines(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


def test_yaml_block_scalars_lists_and_maps_under_a_secret_key() -> None:
    text = (
        "model: gpt2\n"
        "private_key: |\n"
        "  line-one-of-the-key\n"
        "  line-two-of-the-key\n"
        "api_keys:\n"
        "  - listed-key-1\n"
        "  - listed-key-2\n"
        "auth:\n"
        "  type: basic\n"
        "  password: nested-pass\n"
        "tokenizer: gpt2\n"
        "pass: p4ss-w0rd\n"
    )
    out = redact_config(text)
    for secret in ("line-one", "line-two", "listed-key", "basic", "nested-pass", "p4ss-w0rd"):
        assert secret not in out, out
    assert "model: gpt2\n" in out and "tokenizer: gpt2\n" in out  # the keys after the blocks are kept
    assert "  type: " in out and "  - " in out  # the structure is kept: it still parses
    assert out.count("\n") == text.count("\n")


def test_toml_multiline_strings() -> None:
    text = 'name = "run"\npassword = """\nmulti-line-secret\nsecond-line\n"""\nbatch_size = 8\n'
    out = redact_config(text)
    assert "multi-line-secret" not in out and "second-line" not in out
    assert 'name = "run"\n' in out and "batch_size = 8\n" in out


def test_json_config_still_parses_and_loses_credential_objects() -> None:
    text = json.dumps({"model": "gpt2", "tokens_per_sec": 5, "credentials": {"user": "a", "key": "k3y-value"},
                       "eos_token_id": 2})  # fmt: skip
    out = redact_config(text)
    data = json.loads(out)
    assert data["credentials"] == REDACTED and data["tokens_per_sec"] == 5 and data["eos_token_id"] == 2


def test_records_are_redacted_as_values_and_still_parse() -> None:
    record = {"metrics": {"tokens_per_sec": 51234.5, "max_tokens": 4096}, "password": "pw\"with\\quote",
              "argv": ["--hf-token", "abc123def"], "message": "failed with token=abc987xyz"}  # fmt: skip
    out = redact_value(record)
    text = json.dumps(out)
    assert json.loads(text)["metrics"] == {"tokens_per_sec": 51234.5, "max_tokens": 4096}
    for secret in ('pw"with', "abc987xyz"):
        assert secret not in json.dumps(out) and secret not in str(out)


def test_known_values_with_quotes_backslashes_and_non_ascii_are_scrubbed_in_json_too() -> None:
    secret = 'p"ä\\ss-wörd-42'
    add_known_secrets({"SERVICE_PASSWORD": secret})
    assert secret not in redact_text(f"connecting with {secret}")
    encoded = json.dumps({"message": f"bad login {secret}"})
    out = redact_text(encoded)
    assert json.dumps(secret)[1:-1] not in out
    assert json.loads(out)["message"].startswith("bad login ")
    assert json.dumps(secret, ensure_ascii=False)[1:-1] not in redact_text(
        json.dumps({"m": secret}, ensure_ascii=False)
    )


def test_a_key_block_split_over_writes_is_gone() -> None:
    stream = StreamRedactor()
    chunks = ["starting\n-----BEGIN OPENSSH PRIVATE KEY-----\n", "b3BlbnNzaC1rZXktdjEAAAAA\n", "AAAABG5vbmUAAAAE\n",
              "-----END OPENSSH PRIVATE KEY-----\nstep 1 loss 2.0\n"]  # fmt: skip
    out = "".join(stream(c) for c in chunks)
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in out and "AAAABG5vbmUAAAAE" not in out
    assert out.startswith("starting\n") and out.endswith("step 1 loss 2.0\n")
