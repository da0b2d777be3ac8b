"""The terminal report: the verdict on one screen first, details below. Uses rich; respects NO_COLOR and
a non-terminal sink. Imports rich and the report model."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..analyze.model import Report, describe_seen

MAX_ROWS = 32  # rank rows in the terminal table; JSON and HTML have them all
_STYLE = {"hang": "bold yellow", "crash": "bold red", "ok": "bold green"}


def render_terminal(report: Report, out: TextIO) -> None:
    console = Console(file=out, highlight=False, soft_wrap=False)
    v = report.verdict
    style = _STYLE.get(v.category.split(".")[0], "bold")
    suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
    console.print(f"[{style}]{v.category}[/]  suspect rank(s): [bold]{suspects}[/]  phase: {v.phase or '?'}  "
                  f"confidence: {v.confidence}")  # fmt: skip
    console.print(v.summary, markup=False)
    observed = [f for f in report.findings if f.kind == "observed"]
    for f in observed[:3]:
        console.print(f"  observed: {f.text}", markup=False)
    for entry in report.similar_incidents[:3]:
        console.print(f"[bold]seen before:[/] {escape(describe_seen(entry))}")
    if report.next_actions:
        console.print(f"[bold]next:[/] {report.next_actions[0]}")
    console.print()

    table = Table(title=f"ranks (run {report.run_id}, node {report.node}, trigger {report.trigger})")
    for col in ("rank", "pid", "state", "step", "phase", "idle s", "alive", "where (main thread)"):
        table.add_column(col, justify="right" if col in ("rank", "pid", "step", "idle s") else "left")
    shown = report.ranks
    if len(shown) > MAX_ROWS:  # the suspects, then the first ranks; the rest are grouped in the evidence
        keep = {r.rank for r in shown if r.rank in v.suspect_ranks}
        keep.update(r.rank for r in shown[: MAX_ROWS - len(keep)])
        shown = [r for r in shown if r.rank in keep]
    for r in shown:
        phase = f"{r.phase} ({r.collective})" if r.collective else r.phase
        mark = "[bold]" if r.rank in v.suspect_ranks else ""
        table.add_row(f"{mark}{r.rank}", str(r.pid), r.state, "-" if r.step is None else str(r.step), phase,
                      "" if r.idle_s is None else f"{r.idle_s:.0f}", "yes" if r.alive else "no",
                      r.top_frame or "")  # fmt: skip
    console.print(table)
    if len(shown) < len(report.ranks):
        console.print(f"  … {len(report.ranks) - len(shown)} more rank(s): see the evidence below, or "
                      "--format json / html for every rank", markup=False)  # fmt: skip
    if report.stack_groups:
        console.print("[bold]stacks[/] (main threads; identical stacks merged, odd ones first)")
        for g in report.stack_groups:
            console.print(f"  {'*' if g.get('odd') else ' '} {g.get('describe')}  [{g.get('waits_in')}]", markup=False)
            for frame in g.get("frames", [])[-6:]:
                console.print(f"        {frame}", markup=False)
            for rank, workers in (g.get("workers") or {}).items():
                for worker in workers:
                    console.print(f"        rank {rank}'s {worker}", markup=False)
    console.print("[bold]evidence[/]")
    for f in report.findings:
        console.print(f"  [{f.kind}] {f.text}" + (f"  ({f.source})" if f.source else ""), markup=False)
    if len(report.next_actions) > 1:
        console.print("[bold]next actions[/]")
        for i, action in enumerate(report.next_actions, 1):
            console.print(f"  {i}. {action}", markup=False)
    if report.console_tail:
        console.print("[bold]console tail[/]")
        for line in report.console_tail:
            console.print(f"  | {line}", markup=False)
    console.print(f"bundle: {report.bundle}", markup=False)
