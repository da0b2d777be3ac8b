"""Redaction of secrets in names, values, free text and command lines."""

from __future__ import annotations

from blackbox.redact import REDACTED, add_known_secrets, redact_argv, redact_config, redact_env, redact_text

TOKENS = [
    "hf_" + "a" * 34,
    "ghp_" + "b" * 36,
    "AKIA" + "C" * 16,
    "sk-" + "d" * 40,
    "xoxb-" + "1" * 20,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ",
]


def test_token_values_anywhere() -> None:
    for token in TOKENS:
        out = redact_text(f"loading with {token} now")
        assert token not in out and REDACTED in out


def test_keyed_values_and_urls() -> None:
    text = "Authorization: Bearer abc.def.ghi password=hunter2 url=https://user:pa55@host/db"
    out = redact_text(text)
    for secret in ("abc.def.ghi", "hunter2", "pa55"):
        assert secret not in out


def test_env_by_name() -> None:
    env = redact_env({"WANDB_API_KEY": "x1", "MY_SECRET": "x2", "HOME": "/root", "NCCL_DEBUG": "INFO"})
    assert env == {"WANDB_API_KEY": REDACTED, "MY_SECRET": REDACTED, "HOME": "/root", "NCCL_DEBUG": "INFO"}


def test_argv() -> None:
    argv = ["train.py", "--hf-token", "abc123", "--api_key=xyz", "--lr", "0.1"]
    assert redact_argv(argv) == ["train.py", "--hf-token", REDACTED, f"--api_key={REDACTED}", "--lr", "0.1"]


def test_config_files_lose_credential_values_whatever_the_syntax() -> None:
    text = (
        "model: gpt\n"
        "wandb_api_key: 0123456789abcdef\n"  # YAML
        'password = "hunter2hunter2"\n'  # TOML / INI
        '  "session_cookie": "c00k1e-value",\n'  # JSON
        "export HF_TOKEN=plainvalue99\n"  # .env
        "keys: [a, b]\n"
    )
    out = redact_config(text)
    for secret in ("0123456789abcdef", "hunter2hunter2", "c00k1e-value", "plainvalue99"):
        assert secret not in out
    assert "model: gpt\n" in out and "keys: [a, b]\n" in out and out.count("\n") == text.count("\n")


def test_known_secret_values_are_scrubbed_anywhere() -> None:
    # GIVEN a job environment whose credential-named variable holds a value of no known token format
    add_known_secrets({"DB_PASSWORD": "Tr0ub4dor&3-xyzzy", "HOME": "/root", "SHORT_TOKEN": "1"})
    # THEN that value is removed from any text, and ordinary values are left alone
    assert redact_text("connecting as admin:Tr0ub4dor&3-xyzzy@db") == f"connecting as admin:{REDACTED}@db"
    assert redact_text("HOME is /root, flag 1") == "HOME is /root, flag 1"
