"""`--format json`: the report model as versioned JSON. Imports the stdlib only."""

from __future__ import annotations

import json
from typing import TextIO

from ..analyze.model import Report

INDENT_UP_TO_RANKS = 512  # bigger reports are written compact: the C encoder only runs without indentation


def render_json(report: Report, out: TextIO) -> None:
    indent = 2 if len(report.ranks) <= INDENT_UP_TO_RANKS else None
    out.write(json.dumps(report.to_json(), indent=indent) + "\n")
