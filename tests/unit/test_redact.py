"""Redaction of secrets in names, values, free text and command lines."""

from __future__ import annotations

from blackbox.redact import REDACTED, redact_argv, redact_env, redact_text

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
