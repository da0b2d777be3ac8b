"""`--format json`: the report model as versioned JSON. Imports the stdlib only."""

from __future__ import annotations

import json
from typing import TextIO

from ..analyze.model import Report


def render_json(report: Report, out: TextIO) -> None:
    json.dump(report.to_json(), out, indent=2)
    out.write("\n")
