"""`--format markdown`: the report as Markdown to paste into an issue tracker. Imports the stdlib and the model."""

from __future__ import annotations

from typing import TextIO

from ..analyze.model import Report, describe_seen

MAX_ROWS = 64


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, out: TextIO) -> None:
    v = report.verdict
    suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
    w = out.write
    w(f"## blackbox: `{v.category}` — suspect rank(s) {suspects}\n\n")
    w(f"**Phase:** {v.phase or '?'} · **confidence:** {v.confidence} · **run:** `{report.run_id}` · "
      f"**node:** {report.node} · **trigger:** {report.trigger}\n\n")  # fmt: skip
    w(f"{v.summary}\n\n")
    if report.similar_incidents:
        w("### Seen before\n\n" + "".join(f"- {describe_seen(e)}\n" for e in report.similar_incidents) + "\n")
    if report.next_actions:
        w("### Next actions\n\n")
        for i, action in enumerate(report.next_actions, 1):
            w(f"{i}. {action}\n")
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
        w(f"| {mark}{r.rank}{mark} | {_cell(r.node)} | {r.pid} | {r.state} | {'-' if r.step is None else r.step} | "
          f"{_cell(phase)} | {_cell(r.top_frame or '')} |\n")  # fmt: skip
    if len(rows) < len(report.ranks):
        w(f"\n… {len(report.ranks) - len(rows)} more rank(s) (grouped under Evidence).\n")
    if report.stack_groups:
        w("\n### Stacks (identical main threads merged, odd ones first)\n\n")
        for g in report.stack_groups:
            w(f"- {'**odd** ' if g.get('odd') else ''}{_cell(g.get('describe'))} ({g.get('waits_in')})\n\n")
            w("  ```\n" + "".join(f"  {frame}\n" for frame in g.get("frames", [])) + "  ```\n")
    w("\n### Evidence\n\n")
    for f in report.findings:
        w(f"- *{f.kind}*: {f.text}" + (f" — `{f.source}`" if f.source else "") + "\n")
    if report.console_tail:
        w("\n### Console tail\n\n```\n" + "\n".join(report.console_tail) + "\n```\n")
    w(f"\nBundle: `{report.bundle}`\n")
