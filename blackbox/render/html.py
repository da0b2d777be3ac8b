"""`--format html`: one self-contained page (no network: inline CSS, SVG and a few lines of script) with the
verdict, next actions, the per-rank table, a timeline of each rank's progress showing which rank stopped first,
the stack groups, the evidence and the console tail. Bundle text is escaped everywhere (`e`). Imports the stdlib,
the model and render."""

from __future__ import annotations

import json
from html import escape
from typing import Any, TextIO

from ..analyze.model import Report, describe_seen
from . import printable, time_rows

MAX_TIMELINE_RANKS = 64


def e(text: object) -> str:
    """Bundle text on the page: printable, and HTML-escaped (quotes too: it also goes into attributes)."""
    return escape(printable(text))


def with_code(text: str) -> str:
    """An action's text escaped, its `backticked` commands as <code> (a lone backtick stays as it is)."""
    parts = printable(text).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: the last one opens nothing
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return "".join(f"<code>{escape(p)}</code>" if i % 2 else escape(p) for i, p in enumerate(parts))


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{padding:14px 18px;border-radius:8px;background:#f4f4f6}.hang{border-left:6px solid #d89b00}
.crash{border-left:6px solid #c62828}.ok{border-left:6px solid #2e7d32}.meta{color:#555}
table{border-collapse:collapse;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right}tr.suspect{background:#fff3e0;font-weight:600}code,pre{font:12px/1.4 ui-monospace,monospace}
pre{background:#f7f7f9;padding:8px;overflow-x:auto}.observed{color:#1b5e20}.inferred{color:#8a5a00}
.tag{display:inline-block;min-width:70px;font-size:11px;text-transform:uppercase}
svg text{font:11px ui-monospace,monospace}
"""
_SCRIPT = """
document.querySelectorAll('tr[data-rank]').forEach(function (row) {
  row.addEventListener('mouseenter', function () {
    var bar = document.getElementById('tl-' + row.dataset.rank);
    if (bar) { bar.setAttribute('stroke', '#000'); }
  });
  row.addEventListener('mouseleave', function () {
    var bar = document.getElementById('tl-' + row.dataset.rank);
    if (bar) { bar.setAttribute('stroke', 'none'); }
  });
});
document.getElementById('suspect-count').textContent = document.querySelectorAll('tr.suspect').length;
"""


def _timeline_svg(report: Report) -> str:
    tl: dict[str, Any] = report.timeline or {}
    ranks = [r for r in tl.get("ranks", []) if r.get("samples")]
    if not ranks:
        return "<p class='meta'>No heartbeat history in this bundle (the ranks ran without the recorder).</p>"
    suspects = set(report.verdict.suspect_ranks)
    shown = sorted(ranks, key=lambda r: (r["rank"] not in suspects, r["rank"]))[:MAX_TIMELINE_RANKS]
    shown.sort(key=lambda r: r["rank"])
    times = [s[0] for r in shown for s in r["samples"]]
    t0 = float(min(times))
    t1 = max([*times, tl.get("end") or 0.0, *(r["last_progress"] or 0.0 for r in shown)])
    span = float(max(t1 - t0, 1e-3))
    width, left, row_h = 1000, 150, 22

    def x(t: float) -> float:
        return left + (t - t0) / span * (width - left - 20)

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{row_h * len(shown) + 30}' "
             "role='img' aria-label='per-rank progress timeline'>"]  # fmt: skip
    for i, r in enumerate(shown):
        y = 10 + i * row_h
        last = r["last_progress"] or r["samples"][-1][0]
        first_stop = r["rank"] == tl.get("stopped_first")
        label = f"rank {r['rank']}" + (" (stopped first)" if first_stop else "")
        parts.append(f"<text x='4' y='{y + 13}'>{e(label)}</text>")
        parts.append(f"<rect id='tl-{e(r['rank'])}' x='{x(r['samples'][0][0]):.1f}' y='{y + 3}' "
                     f"width='{max(x(last) - x(r['samples'][0][0]), 2):.1f}' height='12' fill='#81c784'/>")  # fmt: skip
        if t1 > last:
            parts.append(f"<rect x='{x(last):.1f}' y='{y + 3}' width='{max(x(t1) - x(last), 1):.1f}' height='12' "
                         f"fill='{'#e57373' if first_stop else '#ffcc80'}'><title>no progress for "
                         f"{t1 - last:.0f} s</title></rect>")  # fmt: skip
        step = r["samples"][-1][1]
        parts.append(f"<text x='{min(x(last) + 3, width - 60):.1f}' y='{y + 13}'>step {e(step)}</text>")
    parts.append(f"<text x='{left}' y='{row_h * len(shown) + 26}'>{span:.0f} s shown; green: progressing, "
                 "orange: no progress since, red: the rank that stopped first</text></svg>")  # fmt: skip
    more = len(ranks) - len(shown)
    return "".join(parts) + (f"<p class='meta'>{more} more rank(s) not drawn.</p>" if more > 0 else "")


def _gpu_svg(report: Report) -> str:
    """Each GPU's utilisation over time, on the rank timeline's clock (0 % sustained is the silent hang)."""
    series = [g for g in report.gpus if g.get("samples")]
    if not series:
        return ""
    times = [float(s[0]) for g in series for s in g["samples"]]
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1e-3)
    width, left, row_h = 1000, 150, 40
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{row_h * len(series) + 24}' "
             "role='img' aria-label='GPU utilisation over time'>"]  # fmt: skip
    for i, g in enumerate(series):
        y = 8 + i * row_h
        points = " ".join(f"{left + (float(t) - t0) / span * (width - left - 20):.1f},"
                          f"{y + 30 - 30 * float(u or 0) / 100:.1f}" for t, u, _ in g["samples"])  # fmt: skip
        last = g["samples"][-1]
        parts.append(f"<text x='4' y='{y + 20}'>GPU {e(str(g['index']))} {e(str(g.get('name') or ''))}</text>")
        parts.append(f"<line x1='{left}' y1='{y + 30}' x2='{width - 20}' y2='{y + 30}' stroke='#ccc'/>")
        parts.append(f"<polyline fill='none' stroke='#1565c0' stroke-width='1.5' points='{points}'/>")
        parts.append(f"<text x='{width - 140}' y='{y + 10}'>{e(last[1])}% {e(last[2])}C</text>")
    parts.append(f"<text x='{left}' y='{row_h * len(series) + 20}'>{span:.0f} s of GPU utilisation (0-100 %)</text>"
                 "</svg>")  # fmt: skip
    return "<h2>GPUs</h2>" + "".join(parts)


_PHASE_COLOURS = {
    "data": "#ef6c00",
    "compute": "#1565c0",
    "checkpoint": "#6a1b9a",
    "eval": "#00838f",
    "other": "#8d6e63",
    "backward": "#90caf9",
    "collective": "#bdbdbd",
    "startup": "#e0e0e0",
}
MAX_TIME_RANKS = 64


def _time_bars(report: Report) -> str:
    """A stacked bar per rank: the share of its time in each phase over the run (the heartbeat's time ledger)."""
    rows, phases = time_rows(report.time, report.verdict.suspect_ranks, MAX_TIME_RANKS)
    if not rows:
        return ""
    stragglers = {s["rank"] for s in report.time.get("stragglers") or []}
    width, left, row_h = 1000, 150, 20
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{row_h * len(rows) + 30}' "
             "role='img' aria-label='where each rank spent its time'>"]  # fmt: skip
    for i, row in enumerate(rows):
        y, x = 6 + i * row_h, float(left)
        label = f"rank {row['rank']}" + (" (straggler)" if row["rank"] in stragglers else "")
        parts.append(f"<text x='4' y='{y + 12}'>{e(label)}</text>")
        for p in phases:
            share = float(row["shares"].get(p, 0.0))
            if share <= 0:
                continue
            w = share * (width - left - 20)
            parts.append(f"<rect x='{x:.1f}' y='{y + 2}' width='{w:.1f}' height='13' fill='{_PHASE_COLOURS[p]}'>"
                         f"<title>{e(p)} {share:.0%}</title></rect>")  # fmt: skip
            x += w
    legend = " ".join(f"<tspan fill='{_PHASE_COLOURS[p]}'>■</tspan> {e(p)}" for p in phases)
    parts.append(f"<text x='{left}' y='{row_h * len(rows) + 22}'>{legend}</text></svg>")
    data_share = report.time.get("data_share")
    head = (
        "<h2>Where the time went</h2><p class='meta'>Each rank's share of its time in each phase, over the run"
        + (f"; all ranks spent {data_share:.0%} of their time waiting for data" if data_share is not None else "")
        + ".</p>"
    )
    more = len(report.time.get("ranks") or []) - len(rows)
    return head + "".join(parts) + (f"<p class='meta'>{more} more rank(s) not drawn.</p>" if more > 0 else "")


def render_html(report: Report, out: TextIO) -> None:
    v = report.verdict
    kind = v.category.split(".")[0]
    suspects = ", ".join(map(str, v.suspect_ranks)) or "none named"
    w = out.write
    title = f"blackbox: {v.category} — rank(s) {suspects}"
    w(f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
      f"<style>{_CSS}</style></head><body>")  # fmt: skip
    w(f"<div class='verdict {e(kind)}'><h1>{e(v.category)} — suspect rank(s) {e(suspects)}</h1>"
      f"<div class='meta'>phase {e(v.phase or '?')} · confidence {e(v.confidence)} · run {e(report.run_id)} · "
      f"node {e(report.node)} · trigger {e(report.trigger)} · <span id='suspect-count'></span> suspect row(s)</div>"
      f"<p>{e(v.summary)}</p></div>")  # fmt: skip
    if report.similar_incidents:
        w("<h2>Seen before</h2><ul>" + "".join(f"<li>{e(describe_seen(s))}</li>" for s in report.similar_incidents)
          + "</ul>")  # fmt: skip
    if report.next_actions:
        w("<h2>Next actions</h2><ol>" + "".join(f"<li>{with_code(a)}</li>" for a in report.next_actions) + "</ol>")
    w("<h2>Ranks</h2><table><tr><th>rank</th><th>node</th><th>pid</th><th>state</th><th>step</th><th>phase</th>"
      "<th>idle s</th><th>where (main thread)</th></tr>")  # fmt: skip
    for r in report.ranks:
        cls = " class='suspect'" if r.rank in v.suspect_ranks else ""
        phase = f"{r.phase} ({r.collective})" if r.collective else r.phase
        idle = "" if r.idle_s is None else f"{r.idle_s:.0f}"
        w(f"<tr{cls} data-rank='{e(r.rank)}'><td class='n'>{e(r.rank)}</td><td>{e(r.node)}</td>"
          f"<td class='n'>{e(r.pid)}</td>"
          f"<td>{e(r.state)}</td><td class='n'>{'-' if r.step is None else e(r.step)}</td><td>{e(phase)}</td>"
          f"<td class='n'>{idle}</td><td><code>{e(r.top_frame or '')}</code></td></tr>")  # fmt: skip
    w("</table><h2>Timeline</h2>" + _timeline_svg(report) + _gpu_svg(report) + _time_bars(report))
    if report.stack_groups:
        w("<h2>Stacks</h2><p class='meta'>Main threads; identical stacks merged, the odd ones first.</p>")
        for g in report.stack_groups:
            frames = "\n".join(e(frame) for frame in g.get("frames", []))
            w(f"<details{' open' if g.get('odd') else ''}><summary><code>{e(str(g.get('describe')))}</code> "
              f"({e(str(g.get('waits_in')))})</summary><pre>{frames}</pre></details>")  # fmt: skip
    w("<h2>Evidence</h2><ul>")
    for f in report.findings:
        src = f" <span class='meta'>— {e(f.source)}</span>" if f.source else ""
        w(f"<li><span class='tag {e(f.kind)}'>{e(f.kind)}</span> {e(f.text)}{src}</li>")
    w("</ul>")
    if report.console_tail:
        w("<h2>Console tail</h2><pre>" + "\n".join(map(e, report.console_tail)) + "</pre>")
    w(f"<p class='meta'>Bundle: <code>{e(report.bundle)}</code></p>")
    w("<script type='application/json' id='report-data'>" + json.dumps(report.to_json()).replace("<", "\\u003c")
      + "</script>")  # fmt: skip
    w(f"<script>{_SCRIPT}</script></body></html>\n")
