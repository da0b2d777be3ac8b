"""Redaction is linear in its input: time per KB stays flat from 16 KiB to 1 MiB on lines built to make a regular
expression backtrack or a rule re-read the text (issue 35). Best of three, with a generous bound, so a loaded
machine does not fail it; a quadratic pattern is 64 times slower per KB at 1 MiB and fails it whatever the load."""

from __future__ import annotations

import base64
import json
import time
from typing import Callable, Dict

import pytest

from blackbox._recorder.redact import StreamRedactor, redact_text

SMALL = 16 * 1024
MEDIUM = 128 * 1024
LARGE = 1024 * 1024
BOUND = 6.0  # per-KB time at 1 MiB over that at 16 KiB


def _record(i: int) -> str:
    return json.dumps({"step": i, "loss": round(1 / (i + 1), 5), "text": "the quick brown fox jumps " * 2})


def _b64_jsonl(n: int) -> str:
    return base64.b64encode("\n".join(_record(i) for i in range(n // 60)).encode()).decode()[:n]


def _b64_records(n: int) -> str:
    return " ".join(base64.b64encode(_record(i).encode()).decode() for i in range(n // 90))[:n]


def _times(unit: str) -> Callable[[int], str]:
    return lambda n: (unit * (n // len(unit) + 1))[:n]


CASES: Dict[str, Callable[[int], str]] = {
    "runs of a JWT's opening": _times("eyJ"),
    "JWT-like segments": _times("eyJhbGciOi."),
    "base64 of JSON lines": _b64_jsonl,
    "base64 JSON records on one line": _b64_records,
    "runs of a provider prefix": _times("hf_"),
    "private key openings": _times("-----BEGIN PRIVATE KEY-----"),
    "secret names without values": _times("token="),
    "secret names with colons": _times("key: "),
    "open quoted secrets": _times('"password": "'),
    "URL user info": _times("://a"),
}


def _per_kb(redact: Callable[[str], str], text: str, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        redact(text)
        best = min(best, time.perf_counter() - t)
    return best / (len(text) / 1024)


def _stream(text: str) -> str:
    r = StreamRedactor()
    out = [r.feed(text[i : i + 4096]) for i in range(0, len(text), 4096)]
    return "".join(out) + r.flush()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("redact", [redact_text, _stream], ids=["text", "stream"])
def test_time_per_kb_is_flat_from_16_kib_to_1_mib(case: str, redact: Callable[[str], str]) -> None:
    base = _per_kb(redact, CASES[case](SMALL), tries=5)
    for size in (MEDIUM, LARGE):  # a quadratic pattern fails at the middle size, before 1 MiB takes minutes
        text = CASES[case](size)
        assert len(text) >= size - 200
        ratio = _per_kb(redact, text, tries=1) / base
        if ratio > BOUND:  # a loaded machine: best of three before judging
            base = min(base, _per_kb(redact, CASES[case](SMALL), tries=5))
            ratio = min(ratio, _per_kb(redact, text, tries=2) / base)
        assert ratio <= BOUND, f"{case}: {ratio:.1f}x slower per KB at {size // 1024} KiB than at 16 KiB"
