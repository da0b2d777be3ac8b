"""The terminal report: the verdict on one screen first, details below. Uses rich; respects NO_COLOR and
a non-terminal sink. Bundle text is never read as rich markup: every piece is a `Text`, made `printable`.
Imports rich, the report model and render."""

from __future__ import annotations

from typing import Optional, TextIO, Union

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analyze.model import Report, describe_seen
from . import printable, time_rows

MAX_ROWS = 32  # rank rows in the terminal table; JSON and HTML have them all
_STYLE = {"hang": "bold yellow", "crash": "bold red", "ok": "bold green"}

Piece = Union[str, tuple[object, str]]  # plain text, or (text, style)


def _text(*pieces: Piece) -> Text:
    """One line from pieces of bundle text, each made printable; styles come only from this module."""
    out = Text()
    for piece in pieces:
        text, style = piece if isinstance(piece, tuple) else (piece, "")
        out.append(printable(text), style=style or None)
    return out


def _cell(text: object, style: Optional[str] = None) -> Text:
    return Text(printable(text), style=style or "")


def render_terminal(report: Report, out: TextIO) -> None:
    console = Console(file=out, highlight=False, soft_wrap=False, markup=False, emoji=False)
    say = console.print
    v = report.verdict
    style = _STYLE.get(str(v.category).split(".")[0], "bold")
    suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
    say(_text((v.category, style), "  suspect rank(s): ", (suspects, "bold"), "  phase: ", v.phase or "?",
              "  confidence: ", v.confidence))  # fmt: skip
    say(_text(v.summary))
    observed = [f for f in report.findings if f.kind == "observed"]
    for f in observed[:3]:
        say(_text("  observed: ", f.text))
    for entry in report.similar_incidents[:3]:
        say(_text(("seen before:", "bold"), " ", describe_seen(entry)))
    if report.next_actions:
        say(_text(("next:", "bold"), " ", report.next_actions[0]))
    say()

    table = Table(title=_text("ranks (run ", report.run_id, ", node ", report.node, ", trigger ", report.trigger,
                              ")"))  # fmt: skip
    for col in ("rank", "pid", "state", "step", "phase", "idle s", "alive", "where (main thread)"):
        table.add_column(col, justify="right" if col in ("rank", "pid", "step", "idle s") else "left")
    shown = report.ranks
    if len(shown) > MAX_ROWS:  # the suspects, then the first ranks; the rest are grouped in the evidence
        keep = {r.rank for r in shown if r.rank in v.suspect_ranks}
        keep.update(r.rank for r in shown[: MAX_ROWS - len(keep)])
        shown = [r for r in shown if r.rank in keep]
    for r in shown:
        phase = f"{r.phase} ({r.collective})" if r.collective else r.phase
        table.add_row(_cell(r.rank, "bold" if r.rank in v.suspect_ranks else None), _cell(r.pid), _cell(r.state),
                      _cell("-" if r.step is None else r.step), _cell(phase),
                      _cell("" if r.idle_s is None else f"{r.idle_s:.0f}"), _cell("yes" if r.alive else "no"),
                      _cell(r.top_frame or ""))  # fmt: skip
    say(table)
    if len(shown) < len(report.ranks):
        say(_text(f"  … {len(report.ranks) - len(shown)} more rank(s): see the evidence below, or "
                  "--format json / html for every rank"))  # fmt: skip
    if report.stack_groups:
        say(_text(("stacks", "bold"), " (main threads; identical stacks merged, odd ones first)"))
        for g in report.stack_groups:
            say(_text(f"  {'*' if g.get('odd') else ' '} ", g.get("describe"), "  [", g.get("waits_in"), "]"))
            for frame in g.get("frames", [])[-6:]:
                say(_text("        ", frame))
            for rank, workers in (g.get("workers") or {}).items():
                for worker in workers:
                    say(_text("        rank ", rank, "'s ", worker))
    rows, phases = time_rows(report.time, v.suspect_ranks, MAX_ROWS)
    if rows:
        share = report.time.get("data_share")
        title = "where the time went (each rank's share of its time, over the run)" + (
            f"; {share:.0%} of all ranks' time waiting for data" if share is not None else "")  # fmt: skip
        shares = Table(title=_text(title))
        for col in ("rank", "s", *phases):
            shares.add_column(col, justify="right")
        stragglers = {e["rank"] for e in report.time.get("stragglers") or []}
        for row in rows:
            mark = " (straggler)" if row["rank"] in stragglers else ""
            shares.add_row(_cell(f"{row['rank']}{mark}", "bold" if mark else None), _cell(f"{row['seconds']:.0f}"),
                           *(_cell(f"{row['shares'].get(p, 0):.0%}") for p in phases))  # fmt: skip
        say(shares)
    say(_text(("evidence", "bold")))
    for f in report.findings:
        say(_text("  [", f.kind, "] ", f.text, *(("  (", f.source, ")") if f.source else ())))
    if len(report.next_actions) > 1:
        say(_text(("next actions", "bold")))
        for i, action in enumerate(report.next_actions, 1):
            say(_text(f"  {i}. ", action))
    if report.console_tail:
        say(_text(("console tail", "bold")))
        for line in report.console_tail:
            say(_text("  | ", line))
    say(_text("bundle: ", report.bundle))
