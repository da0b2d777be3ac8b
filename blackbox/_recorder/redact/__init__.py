"""Secret redaction shared by both sides, one room per kind of knowledge: what a name says (names), values the job
is known to hold and their encoded forms (known), provider formats (formats), key blocks (keys), context rules
(context), lines that say what the next lines hold (lines), the pipeline for free text (text), the stream state
(stream), records and command lines (records), config files (config). Stdlib only, Python >= 3.9: the rank side
imports it lazily (first record written), the host through blackbox.redact; blackbox._recorder.credentials feeds it
the job's stored credentials and is never imported from here. Every function is linear in its input and total."""

from __future__ import annotations

from .common import MAX_KEY_LINES, REDACTED
from .config import CONFIG_SUFFIXES, redact_config
from .known import add_env_secrets, add_known_secret, known_count
from .names import WEAK, is_secret_name, worth_knowing
from .records import redact_argv, redact_env, redact_json_text, redact_named, redact_value
from .stream import StreamRedactor
from .text import redact_text

__all__ = [
    "CONFIG_SUFFIXES",
    "MAX_KEY_LINES",
    "REDACTED",
    "WEAK",
    "StreamRedactor",
    "add_env_secrets",
    "add_known_secret",
    "is_secret_name",
    "known_count",
    "redact_argv",
    "redact_config",
    "redact_env",
    "redact_json_text",
    "redact_named",
    "redact_text",
    "redact_value",
    "worth_knowing",
]
