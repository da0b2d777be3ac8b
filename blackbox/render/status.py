"""A run's status (blackbox.status) for people: one screen of rich renderables (`blackbox status` prints it once,
`blackbox top` redraws it), and as JSON for scripts. Text from the run directory is shown inert. Imports the stdlib,
rich and the status model."""

from __future__ import annotations

import json
from typing import IO, Any, Optional

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..detections import human_bytes, plural_ranks
from ..status import RankStatus, RunStatus
from . import TIME_PHASES, printable


def _num(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _shares(share: dict[str, float]) -> str:
    parts = [f"{p} {share[p]:.0%}" for p in TIME_PHASES if share.get(p, 0) >= 0.005]
    return " ".join(parts) or "-"


def _moving(r: RankStatus) -> str:
    """What moved lately: step or batch, forward calls (their count), the stack, I/O (its rates between two readings,
    as `top` has them)."""
    words = []
    for what in r.moving:
        if what == "forward":
            words.append(f"{r.forwards} fwd")
        elif what == "io" and r.read_per_s is not None and r.written_per_s is not None:
            words.extend(f"{k} {human_bytes(v)}/s" for k, v in (("r", r.read_per_s), ("w", r.written_per_s)) if v)
        else:
            words.append(what)
    return " ".join(words) or "-"


def renderable(s: RunStatus, title: str = "blackbox status") -> RenderableType:
    head = Text()
    head.append(f"{title}: run {printable(s.run_id or '?')}", style="bold")
    head.append(f"  {printable(s.run_dir)}\n")
    if s.live:
        head.append(f"live (supervisor pid {s.supervisor_pid})", style="green")
    else:
        head.append(f"not live: {printable(s.why_not_live or '?')}; its last state:", style="yellow")
    if s.command:
        head.append(f"\n{printable(' '.join(s.command))[:300]}")
    table = Table(title_justify="left", expand=False)
    left = ("stage", "phase", "moving", "where its time goes")
    for col in ("rank", "pid", "stage", "step", "steps/s", "phase", "phase s", "idle s", "live s", "moved s",
                "moving", "where its time goes"):  # fmt: skip
        table.add_column(col, justify="left" if col in left else "right",
                         no_wrap=col not in ("moving", "where its time goes"))  # fmt: skip
    for r in s.ranks:
        style = "bold red" if r.straggler else ("dim" if not r.alive else "")
        phase = printable(r.phase) + (" (straggler)" if r.straggler else "") + ("" if r.alive else f" ({r.state})")
        table.add_row(Text(str(r.rank)), Text(str(r.pid)), Text(r.stage), Text(str(r.step)),
                      Text(_num(r.steps_per_s, "{:.2f}")),
                      Text(phase), Text(_num(r.phase_s)), Text(_num(r.idle_s)), Text(_num(r.liveness_age_s)),
                      Text(_num(r.moved_s)), Text(_moving(r)), Text(_shares(r.time_share)), style=style)  # fmt: skip
    parts: list[RenderableType] = [head, table if s.ranks else Text(_no_rank(s))]
    if s.gpus:
        parts.append(Text("GPUs: " + " | ".join(
            f"GPU{g['index']} {printable(str(g['name']))} util {_num(g['utilization_pct'], '{:.0f}')} % "
            f"{_num(g['temperature_c'], '{:.0f}')} C {_num(g.get('memory_used_mib'), '{:.0f}')}/"
            f"{_num(g.get('memory_total_mib'), '{:.0f}')} MiB" for g in s.gpus)))  # fmt: skip
    if s.rendezvous is not None:
        parts.append(Text(rendezvous_words(s), style="yellow"))
    for r in s.ranks:
        if r.waits_for:
            parts.append(Text(f"rank {r.rank} waits for {printable(r.waits_for)}"))
        if r.kept_by:
            parts.append(Text(f"rank {r.rank} {printable(r.kept_by)}"))
        if r.io_unreadable:
            parts.append(Text(f"rank {r.rank}: /proc/{r.pid}/io cannot be read (another user's process, or no "
                              "CAP_SYS_PTRACE): its I/O is not seen, only its heartbeat", style="yellow"))  # fmt: skip
    for e in s.stragglers[-5:]:
        when = f"until {str(e['ended'])[11:19]}" if e["ended"] else "still on" if s.live else "until the run ended"
        parts.append(Text(f"straggler: rank {e['rank']} in {printable(str(e['phase']))}, {e['factor']}x the others' "
                          f"own work (from {str(e['started'])[11:19]}, {when})",
                          style="red" if e["ended"] is None and s.live else ""))  # fmt: skip
    for i in s.incidents[-5:]:
        parts.append(Text(f"incident ({printable(str(i['trigger']))}): {printable(str(i['category']))}, suspect "
                          f"rank(s) {i['suspect_ranks']} — {printable(str(i['bundle']))}"))  # fmt: skip
    return Group(*parts)


def _no_rank(s: RunStatus) -> str:
    """'no rank has a heartbeat yet', and why when the launcher waits in its own rendezvous."""
    w = s.launcher_waiting
    if w is None:
        return "no rank has a heartbeat yet"
    waited = max(0.0, s.read_at - float(w["since"]))
    nodes = f" for the job's other nodes (--nnodes {printable(w['nnodes'])})" if w["nnodes"] not in ("", "1") else ""
    return (f"no rank has a heartbeat yet: the launcher (torchrun, pid {w['pid']}) has started no rank; it has waited "
            f"in its own rendezvous{nodes} for {waited:.0f} s")  # fmt: skip


def rendezvous_words(s: RunStatus) -> str:
    """'rendezvous: rank 0 waits in init_process_group (still for 42 s) for 1 of 2 ranks: rank 1 (pid 4121) has not
    called it — step 0, phase startup'."""
    z = s.rendezvous
    assert z is not None
    missing = len(z.not_arrived) + z.elsewhere
    out = (f"rendezvous: {plural_ranks(z.waiting)} {'waits' if len(z.waiting) == 1 else 'wait'} in "
           f"init_process_group (still for {z.still_s:.0f} s) for {missing} of {z.world_size} ranks")  # fmt: skip
    by_rank = {r.rank: r for r in s.ranks}
    named = [f"rank {n} (pid {by_rank[n].pid}) has not called it — step {by_rank[n].step}, phase "
             f"{printable(by_rank[n].phase)}" for n in z.not_arrived[:8]]  # fmt: skip
    if len(z.not_arrived) > 8:
        named.append(f"{len(z.not_arrived) - 8} more here have not")
    for host, ranks in sorted(z.elsewhere_on.items(), key=lambda kv: kv[1])[:8]:
        named.append(f"{plural_ranks(ranks)} on {printable(host)} (`blackbox status` there says which have not "
                     "called it)")  # fmt: skip
    unplaced = z.elsewhere - sum(len(r) for r in z.elsewhere_on.values())
    if unplaced > 0 and z.nodes_not_joined:
        at = f" at {printable(z.coordination)}" if z.coordination else ""
        named.append(
            f"{unplaced} on the {z.nodes_not_joined} of {z.nnodes} node(s) that have not joined blackbox's "
            f"coordination{at} (their launcher or `blackbox run` has not started, or cannot reach it)"
        )
    elif unplaced > 0:
        named.append(f"{unplaced} {'has' if unplaced == 1 else 'have'} no heartbeat here (another node's, or not "
                     "started)")  # fmt: skip
    return out + ": " + "; ".join(named)


def render_status(s: RunStatus, out: IO[str], width: Optional[int] = None) -> None:
    if width is None and not out.isatty():  # a log or a pipe: wide enough for a rank a line
        width = 160
    console = Console(file=out, highlight=False, markup=False, emoji=False, soft_wrap=False, width=width)
    console.print(renderable(s))


def render_status_json(s: RunStatus, out: IO[str]) -> None:
    data: Any = s.to_json()
    out.write(json.dumps(data, indent=2) + "\n")
