"""The HTML report: one self-contained file (inline CSS and SVG charts, no network, light and
dark) with a summary to paste on top (verdict, the change, its predicted gain), the findings,
charts of data wait, GPU and each worker's CPU and memory over the window, and the processes.
Built from the snapshots (for the charts) and the JSON report (for the rest)."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence

from ..fields import REPORT_COLUMNS, WORKER_FIELD, row, worker_label
from ..model import Snapshot, TrainerSnapshot
from .report import verdict_of_report
from .report_md import job_lines, plan_line, processes
from .report_md import render as render_md


def e(value) -> str:
    """Anything from a report or a recording, escaped: a recording is a file anyone may hand us."""
    return html.escape("" if value is None else str(value))


COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
Series = dict[str, list[tuple[float, float | None]]]


def _nice_step(span: float, ticks: int = 4) -> float:
    """A round step (1, 2, 2.5 or 5 × 10^k) that cuts span into about `ticks` parts."""
    raw = max(span, 1e-9) / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw - 1e-12)


def svg_chart(title: str, series: Series, unit: str, y_max: float | None = None,
              span: tuple[float, float] | None = None, width: int = 720, height: int = 190) -> str:
    """A line chart with a time axis (seconds from the window's start: `span`, shared by a
    trainer's charts, or its own points'), gridlines and the unit on its value axis, and its
    legend in a row under it. A series of one point is a dot."""
    points = [(t, v) for values in series.values() for t, v in values if v is not None]
    if not points:
        return f'<p class="na">{e(title)}: n/a (not measured)</p>'
    left, right, top_pad, bottom = 52, 16, 26, 30
    t0, t1 = span or (min(p[0] for p in points), max(p[0] for p in points))
    span_t = t1 - t0
    top = y_max if y_max is not None else max(p[1] for p in points)
    top = top if top > 0 else 1.0
    plot_w, plot_h = width - left - right, height - top_pad - bottom

    def x_of(t: float) -> float:
        return left + ((t - t0) / span_t * plot_w if span_t > 0 else plot_w / 2)

    def y_of(v: float) -> float:
        return top_pad + plot_h - min(v, top) / top * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{e(title)}" class="chart">',
             f'<text x="{left}" y="16" class="title">{e(title)}</text>']
    step = _nice_step(top)
    if y_max is None:
        top = math.ceil(top / step - 1e-9) * step  # the axis ends on a gridline
    v = 0.0
    while v <= top + 1e-9:
        y = y_of(v)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{v:g}{e(unit)}</text>')
        v += step
    t_step = _nice_step(span_t) if span_t > 0 else 1.0
    s = 0.0
    while s <= span_t + 1e-9:
        x = x_of(t0 + s)
        parts.append(f'<line x1="{x:.1f}" y1="{top_pad}" x2="{x:.1f}" y2="{top_pad + plot_h}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle" class="tick">{s:g} s</text>')
        s += t_step
    parts.append(f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width - right}" y2="{top_pad + plot_h}" '
                 'class="axis"/>')
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        drawn = [(x_of(t), y_of(v)) for t, v in values if v is not None]
        if len(drawn) == 1:
            x, y = drawn[0]
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"><title>{e(name)}</title></circle>')
        elif drawn:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{coords}">'
                         f"<title>{e(name)}</title></polyline>")
    parts.append("</svg>")
    legend = "".join(f'<span style="color:{COLOURS[i % len(COLOURS)]}">&#9632;</span> {e(name)} '
                     f'<span class="last">{_last(values, unit)}</span>'
                     for i, (name, values) in enumerate(series.items()))
    return f'<figure>{"".join(parts)}<figcaption>{legend}</figcaption></figure>'


def _last(values: list[tuple[float, float | None]], unit: str) -> str:
    last = next((v for _, v in reversed(values) if v is not None), None)
    return "" if last is None else f"{last:.0f}{e(unit)}&emsp;"


def _code(markdown: str) -> str:
    """Escaped, with Markdown's `code` spans as <code>."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", e(markdown))


def worker_names(history: Sequence[TrainerSnapshot]) -> dict[int, str]:
    """Each worker's name, w0, w1…: its worker id where the stacks read it at any time in
    the window, else its place in start order. One name per process, so one series each."""
    ids: dict[int, int] = {}
    order: list[int] = []
    for t in history:
        for w in t.workers:
            if w.pid not in order:
                order.append(w.pid)
            if w.worker_id is not None:
                ids[w.pid] = w.worker_id
    return {pid: worker_label(ids.get(pid), i) for i, pid in enumerate(order)}


def _charts(pid: int, snapshots: Sequence[Snapshot]) -> list[str]:
    history = [(s, t) for s in snapshots for t in s.trainers if t.pid == pid]
    names = worker_names([t for _, t in history])
    wait: Series = {}
    gpu: Series = {}
    cpu: Series = {}
    uss: Series = {}
    start = history[0][0].time if history else 0.0
    for s, t in history:
        dw = t.data_wait.fraction if t.data_wait else None
        line = wait.setdefault("data wait", [])
        began = max(start, s.time - t.data_wait.window_s) if t.data_wait is not None else s.time
        if dw is not None and began < s.time and not any(v is not None for _, v in line):
            # The first reading describes the window before it: drawn over it, not as a dot
            # (a short snapshot may hold one or two readings).
            line.append((began, dw * 100))
        line.append((s.time, dw * 100 if dw is not None else None))
        for g in s.gpus:
            if g.index in t.gpus:
                gpu.setdefault(f"GPU{g.index}", []).append((s.time, g.utilization_percent))
        for w in t.workers:
            cpu.setdefault(names[w.pid], []).append((s.time, w.cpu_percent))
            uss.setdefault(names[w.pid], []).append((s.time, w.uss_bytes / 2**20 if w.uss_bytes else None))
    cpu = dict(sorted(cpu.items()))
    uss = dict(sorted(uss.items()))
    span = (history[0][0].time, history[-1][0].time) if history else None  # one time axis for all
    return [svg_chart("Data wait (% of the training loop's time)", wait, "%", 100, span),
            svg_chart("GPU utilization (%)", gpu, "%", 100, span),
            svg_chart("Worker CPU (% of one core)", cpu, "%", span=span),
            svg_chart("Worker private memory, USS (MiB)", uss, " MiB", span=span)]


def render(report: dict, snapshots: Sequence[Snapshot]) -> str:
    # A job of many ranks first: its verdict and the rank it waits for.
    summary = "".join(f"<li><b>{_code(line.strip('*').split('.**', 1)[0])}</b>.{_code(line.split('.**', 1)[1])}</li>"
                      for line in job_lines(report) if line.startswith("**Job"))
    summary += "".join(
        f"<li><b>Trainer {e(t['pid'])}: {e(t.get('verdict') or 'n/a')}</b>. {_code(plan_line(t))}</li>"
        for t in report["trainers"]
    )
    charts = []
    for tr in report["trainers"]:
        charts.append(f"<h2>Trainer {e(tr['pid'])}</h2>")
        charts.extend(_charts(tr["pid"], snapshots))
    findings = "".join(
        f'<li class="{e(f["severity"])}"><b>{e(str(f["severity"]).upper())} '
        f'{e(f["id"])}</b> (trainer {e(f["trainer_pid"])}): {e(f["title"])}'
        f'<br><span class="fix">{e(f["suggestion"])}</span></li>'
        for f in report["findings"]
    ) or "<li>No findings.</li>"
    rows = []
    for t in report["trainers"]:
        for label, w in processes(t):
            cells = "".join(f"<td>{e(c)}</td>" for c in row(label, w, keys=REPORT_COLUMNS))
            rows.append(f"<tr><td>{e(t['pid'])}</td>{cells}</tr>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>loadertop report: {e(verdict_of_report(report))}</title>
<meta name="color-scheme" content="light dark">
<style>
:root {{ --fg: #1b1b1b; --bg: #fff; --muted: #777; --grid: #e4e4e4; --box: #f3f6fa; --line: #ccc; }}
@media (prefers-color-scheme: dark) {{
  :root {{ --fg: #e6e6e6; --bg: #16181c; --muted: #999; --grid: #2c3038; --box: #1f242c; --line: #444; }}
}}
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: var(--fg);
  background: var(--bg); padding: 0 1em; }}
.summary {{ background: var(--box); border-left: 4px solid #1f77b4; padding: .6em 1em; }}
.summary ul {{ margin: .3em 0; padding-left: 1.2em; }}
.critical b {{ color: #d33; }} .warning b {{ color: #c80; }} .fix {{ color: #2a2; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid var(--line); padding: 2px 6px; font-size: 13px; }}
.na {{ color: var(--muted); }} pre {{ white-space: pre-wrap; font-size: 12px; background: var(--box); padding: 1em; }}
figure {{ margin: 1em 0; }} figcaption {{ font-size: 13px; }} .last {{ color: var(--muted); }}
svg.chart {{ max-width: 100%; height: auto; }}
svg .title {{ font-size: 13px; fill: var(--fg); }} svg .tick {{ font-size: 10px; fill: var(--muted); }}
svg .grid {{ stroke: var(--grid); }} svg .axis {{ stroke: var(--muted); }}
</style></head><body>
<h1>loadertop: {e(verdict_of_report(report))}</h1>
<div class="summary"><ul>{summary}</ul>
<small>{e(report["created_at"])} on {e(report["host"]["hostname"])}, {float(report["duration_s"]):.0f} s sampled,
{len(report["findings"])} finding(s).</small></div>
<h2>Findings</h2><ul>{findings}</ul>
{"".join(charts)}
<h2>Processes</h2>
<table><tr><th>TRAINER</th>{"".join(f"<th>{e(WORKER_FIELD[k].header)}</th>" for k in REPORT_COLUMNS)}</tr>
{"".join(rows)}</table>
<h2>Full report (Markdown)</h2><pre>{html.escape(render_md(report))}</pre>
</body></html>
"""
