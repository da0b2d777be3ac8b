"""The redaction corpus (tests/unit/redaction_cases.py) measured like a classifier: every secret, through the path
it reaches disk by (free text, command line, environment, config file, record, a stream of writes), must be gone;
every ML look-alike must come out unchanged. Prints the table (recall and false-positive rate per path); the totals
are stated in docs/bundle.md, and every look-alike still changed is a known limit in docs/limits.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from blackbox.redact import (
    REDACTED,
    StreamRedactor,
    redact_argv,
    redact_config,
    redact_env,
    redact_text,
    redact_value,
)
from tests.unit.redaction_cases import KNOWN_LIMITS, Case, cases

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
SECRETS, LOOKALIKES = cases()
PATHS = ("text", "env", "argv", "config", "record", "stream")


def run(case: Case) -> tuple[Any, str]:
    """(what the path gives back, the same as one text to search for secrets)."""
    given = case.given
    if case.path == "text":
        out: Any = redact_text(given)
        return out, out
    if case.path == "env":
        out = redact_env(given)
        return out, json.dumps(out, ensure_ascii=False)
    if case.path == "argv":
        out = redact_argv(given)
        return out, " ".join(out)
    if case.path == "config":
        out = redact_config(given)
        return out, out
    if case.path == "record":
        out = redact_value(given)
        return out, json.dumps(out) + json.dumps(out, ensure_ascii=False)
    stream = StreamRedactor()
    out = "".join(stream.feed(piece) for piece in given) + stream.flush()
    return out, out


def unchanged(case: Case, out: Any) -> bool:
    if case.path == "stream":
        return bool(out == "".join(case.given))
    return bool(out == case.given)


def leaks(case: Case, text: str) -> list[str]:
    return [s for s in case.secrets if s in text or json.dumps(s)[1:-1] in text]


def measure() -> dict[str, Any]:
    rows: dict[str, dict[str, int]] = {p: {"secrets": 0, "leaked": 0, "lookalikes": 0, "changed": 0} for p in PATHS}
    leaked: list[tuple[Case, list[str], str]] = []
    changed: list[tuple[Case, Any]] = []
    for case in SECRETS:
        _, text = run(case)
        rows[case.path]["secrets"] += 1
        found = leaks(case, text)
        if found or REDACTED not in text:
            rows[case.path]["leaked"] += 1
            leaked.append((case, found, text))
    for case in LOOKALIKES:
        out, _ = run(case)
        rows[case.path]["lookalikes"] += 1
        if not unchanged(case, out):
            rows[case.path]["changed"] += 1
            changed.append((case, out))
    return {"rows": rows, "leaked": leaked, "changed": changed}


def table(result: dict[str, Any]) -> str:
    lines = ["| path | secrets | leaked | recall | look-alikes | changed | false-positive rate |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    total = {"secrets": 0, "leaked": 0, "lookalikes": 0, "changed": 0}
    for path, row in [*result["rows"].items(), ("all", total)]:
        if path != "all":
            for k in total:
                total[k] += row[k]
        recall = 100.0 * (row["secrets"] - row["leaked"]) / max(1, row["secrets"])
        fpr = 100.0 * row["changed"] / max(1, row["lookalikes"])
        lines.append(f"| {path} | {row['secrets']} | {row['leaked']} | {recall:.1f} % | {row['lookalikes']} | "
                     f"{row['changed']} | {fpr:.1f} % |")  # fmt: skip
    return "\n".join(lines)


def summary(result: dict[str, Any]) -> str:
    """The sentence docs/bundle.md states."""
    secrets = sum(r["secrets"] for r in result["rows"].values())
    leaked = sum(r["leaked"] for r in result["rows"].values())
    looks = sum(r["lookalikes"] for r in result["rows"].values())
    changed = sum(r["changed"] for r in result["rows"].values())
    recall, fpr = 100.0 * (secrets - leaked) / secrets, 100.0 * changed / looks
    return (f"recall {recall:.1f} % ({secrets - leaked} of {secrets} secrets caught), "
            f"false-positive rate {fpr:.1f} % ({changed} of {looks} look-alikes changed)")  # fmt: skip


RESULT = measure()


def test_the_corpus_is_large_enough_and_covers_every_path() -> None:
    assert len(SECRETS) >= 150 and len(LOOKALIKES) >= 150
    for path in PATHS:
        assert RESULT["rows"][path]["secrets"] and RESULT["rows"][path]["lookalikes"], path


def test_no_secret_leaks(capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + table(RESULT) + "\n" + summary(RESULT))
    detail = [f"{case.label}: {found or 'no marker'} -> {text[:300]!r}" for case, found, text in RESULT["leaked"]]
    assert not detail, "\n".join(detail)


def test_lookalikes_come_out_unchanged_but_the_known_limits() -> None:
    changed = {json.dumps(case.given) if not isinstance(case.given, str) else case.given: out
               for case, out in RESULT["changed"]}  # fmt: skip
    surprises = {k: v for k, v in changed.items() if k not in KNOWN_LIMITS}
    assert not surprises, "\n".join(f"{k!r}\n  -> {v!r}" for k, v in surprises.items())
    assert len(KNOWN_LIMITS) <= 5
    assert set(KNOWN_LIMITS) <= set(changed), "a known limit that no longer happens: drop it from the list"


def test_docs_state_the_measured_numbers_and_the_known_limits() -> None:
    assert summary(RESULT) in " ".join((DOCS / "bundle.md").read_text().split()), summary(RESULT)
    limits = (DOCS / "limits.md").read_text()
    for text in KNOWN_LIMITS:
        assert text in limits, f"{text!r} is a look-alike still changed: list it in docs/limits.md"


@pytest.mark.parametrize("case", [c for c in SECRETS if c.path == "text" and "\n" not in c.given.rstrip("\n")],
                         ids=lambda c: c.shape)  # fmt: skip
def test_secret_text_is_gone_also_when_json_encoded(case: Case) -> None:
    # GIVEN a one-line secret inside a JSON string (a structured log line the job printed, a record read as text)
    encoded = json.dumps({"line": case.given})
    out = redact_text(encoded)
    # THEN no secret remains in its JSON-escaped form either
    for secret in case.secrets:
        assert json.dumps(secret)[1:-1] not in out, out


@pytest.mark.parametrize("text", [c.given for c in LOOKALIKES if c.path == "text"])
def test_lookalike_text_survives_as_a_config_line_and_in_a_stream(text: str) -> None:
    if text in KNOWN_LIMITS:
        pytest.skip("a known limit")
    assert redact_config(text + "\n") == text + "\n"
    stream = StreamRedactor()
    half = len(text) // 2
    assert stream.feed(text[:half]) + stream.feed(text[half:] + "\n") + stream.flush() == text + "\n"
