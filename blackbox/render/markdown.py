"""`--format markdown`: the report as Markdown to paste into an issue tracker. Bundle text is written inert: control
characters made printable, HTML escaped, code spans unable to close early. Imports the stdlib, the model and render."""

from __future__ import annotations

import html
from typing import TextIO

from ..analyze.model import Report, describe_seen
from . import printable, time_rows

MAX_ROWS = 64


def _t(text: object) -> str:
    """Bundle text in running Markdown: printable, with HTML escaped."""
    return html.escape(printable(text), quote=False)


def _cell(text: object) -> str:
    return _t(text).replace("|", "\\|")


def _code(text: object) -> str:
    """Bundle text inside a code span or block: printable, and no backtick to end it early."""
    return printable(text).replace("`", "'")


def render_markdown(report: Report, out: TextIO) -> None:
    v = report.verdict
    suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
    w = out.write
    w(f"## blackbox: `{_code(v.category)}` — suspect rank(s) {suspects}\n\n")
    w(f"**Phase:** {_t(v.phase or '?')} · **confidence:** {_t(v.confidence)} · **run:** `{_code(report.run_id)}` · "
      f"**node:** {_t(report.node)} · **trigger:** {_t(report.trigger)}\n\n")  # fmt: skip
    w(f"{_t(v.summary)}\n\n")
    if report.similar_incidents:
        w("### Seen before\n\n" + "".join(f"- {_t(describe_seen(e))}\n" for e in report.similar_incidents) + "\n")
    if report.next_actions:
        w("### Next actions\n\n")
        for i, action in enumerate(report.next_actions, 1):
            w(f"{i}. {_t(action)}\n")
        w("\n")
    w("### Ranks\n\n| rank | node | pid | state | step | phase | where (main thread) |\n")
    w("| ---: | --- | ---: | --- | ---: | --- | --- |\n")
    rows = report.ranks
    if len(rows) > MAX_ROWS:
        rows = [r for r in rows if r.rank in v.suspect_ranks] + [r for r in rows if r.rank not in v.suspect_ranks][
            : MAX_ROWS - len(v.suspect_ranks)
        ]
    for r in rows:
        mark = "**" if r.rank in v.suspect_ranks else ""
        phase = f"{r.phase} ({r.collective})" if r.collective else r.phase
        w(f"| {mark}{_cell(r.rank)}{mark} | {_cell(r.node)} | {_cell(r.pid)} | {_cell(r.state)} | "
          f"{'-' if r.step is None else _cell(r.step)} | "
          f"{_cell(phase)} | {_cell(r.top_frame or '')} |\n")  # fmt: skip
    if len(rows) < len(report.ranks):
        w(f"\n… {len(report.ranks) - len(rows)} more rank(s) (grouped under Evidence).\n")
    if report.stack_groups:
        w("\n### Stacks (identical main threads merged, odd ones first)\n\n")
        for g in report.stack_groups:
            w(f"- {'**odd** ' if g.get('odd') else ''}{_cell(g.get('describe'))} ({_t(g.get('waits_in'))})\n\n")
            w("  ```\n" + "".join(f"  {_code(frame)}\n" for frame in g.get("frames", [])) + "  ```\n")
    time_shown, phases = time_rows(report.time, v.suspect_ranks, MAX_ROWS)
    if time_shown:
        share = report.time.get("data_share")
        w("\n### Where the time went\n\n" + (f"All ranks spent {share:.0%} of their time waiting for data.\n\n"
                                               if share is not None else ""))  # fmt: skip
        w("| rank | s | " + " | ".join(phases) + " |\n| ---: | ---: |" + " ---: |" * len(phases) + "\n")
        stragglers = {e["rank"] for e in report.time.get("stragglers") or []}
        for row in time_shown:
            mark = " (straggler)" if row["rank"] in stragglers else ""
            w(f"| {_cell(row['rank'])}{mark} | {row['seconds']:.0f} | "
              + " | ".join(f"{row['shares'].get(p, 0):.0%}" for p in phases) + " |\n")  # fmt: skip
    w("\n### Evidence\n\n")
    for f in report.findings:
        w(f"- *{_t(f.kind)}*: {_t(f.text)}" + (f" — `{_code(f.source)}`" if f.source else "") + "\n")
    if report.console_tail:
        w("\n### Console tail\n\n```\n" + "\n".join(map(_code, report.console_tail)) + "\n```\n")
    w(f"\nBundle: `{_code(report.bundle)}`\n")
