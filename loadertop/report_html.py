"""The HTML report: one self-contained file (inline CSS and SVG charts, no network) with the
verdict, findings, charts of data wait, GPU and worker CPU/memory over the window, and the
workers table. Built from the snapshots (for the charts) and the JSON report (for the rest)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from .fields import human_bytes
from .model import Snapshot
from .report_md import render as render_md
from .verdict import verdict_of_report


def e(value) -> str:
    """Anything from a report or a recording, escaped: a recording is a file anyone may hand us."""
    return html.escape("" if value is None else str(value))


COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _svg_chart(title: str, series: dict[str, list[tuple[float, float | None]]], unit: str,
               y_max: float | None = None, width: int = 640, height: int = 160) -> str:
    points = [p for values in series.values() for p in values if p[1] is not None]
    if not points:
        return f'<p class="na">{html.escape(title)}: n/a (not measured)</p>'
    t0 = min(p[0] for p in points)
    t1 = max(p[0] for p in points) or t0 + 1
    top = y_max if y_max is not None else max(p[1] for p in points) or 1.0
    pad = 30

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / max(1e-9, t1 - t0) * (width - 2 * pad)
        y = height - pad + -(v / top) * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{pad}" y="16" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>',
             f'<text x="2" y="{pad + 4}" font-size="10">{top:.0f}{unit}</text>',
             f'<text x="2" y="{height - pad}" font-size="10">0</text>']
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(xy(t, v) for t, v in values if v is not None)
        if coords:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
            parts.append(f'<text x="{width - pad + 2}" y="{pad + 12 * i}" font-size="10" fill="{colour}">'
                         f'{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(report: dict, snapshots: Sequence[Snapshot]) -> str:
    charts = []
    for tr in report["trainers"]:
        pid = tr["pid"]
        wait, gpu, cpu, uss = {}, {}, {}, {}
        for s in snapshots:
            for t in s.trainers:
                if t.pid != pid:
                    continue
                dw = t.data_wait.fraction if t.data_wait else None
                wait.setdefault("data wait", []).append((s.time, dw * 100 if dw is not None else None))
                for g in s.gpus:
                    if g.index in t.gpus:
                        gpu.setdefault(f"GPU{g.index}", []).append((s.time, g.utilization_percent))
                for w in t.workers:
                    name = f"w{w.worker_id}" if w.worker_id is not None else f"pid {w.pid}"
                    cpu.setdefault(name, []).append((s.time, w.cpu_percent))
                    uss.setdefault(name, []).append((s.time, w.uss_bytes / 2**20 if w.uss_bytes else None))
        charts.append(f"<h2>Trainer {e(pid)}</h2>")
        charts.append(_svg_chart("data wait (% of the training loop)", wait, "%", 100))
        charts.append(_svg_chart("GPU utilization (%)", gpu, "%", 100))
        charts.append(_svg_chart("worker CPU (% of a core)", cpu, "%"))
        charts.append(_svg_chart("worker USS (MiB)", uss, "M"))
    findings = "".join(
        f'<li class="{e(f["severity"])}"><b>{e(str(f["severity"]).upper())} '
        f'{e(f["id"])}</b> (trainer {e(f["trainer_pid"])}): {e(f["title"])}'
        f'<br><span class="fix">{e(f["suggestion"])}</span></li>'
        for f in report["findings"]
    ) or "<li>No findings.</li>"
    rows = "".join(
        f"<tr><td>{e(t['pid'])}</td><td>{e(w['worker_id'])}</td><td>{e(w['pid'])}</td>"
        f"<td>{'' if w['cpu_percent'] is None else round(w['cpu_percent'], 1)}</td>"
        f"<td>{e(human_bytes(w['uss_bytes']))}</td><td>{e(human_bytes(w['rss_bytes']))}</td>"
        f"<td>{e(w['status'])}</td><td>{e(w.get('doing'))}</td></tr>"
        for t in report["trainers"] for w in [t["main"], *t["workers"]]
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>loadertop report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 900px; }}
.critical b {{ color: #b00; }} .warning b {{ color: #b60; }} .fix {{ color: #060; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; font-size: 13px; }}
.na {{ color: #888; }} pre {{ white-space: pre-wrap; font-size: 12px; background: #f6f6f6; padding: 1em; }}
</style></head><body>
<h1>loadertop: {e(verdict_of_report(report))}</h1>
<p>{e(report["created_at"])} on {e(report["host"]["hostname"])},
{float(report["duration_s"]):.0f} s sampled.</p>
<h2>Findings</h2><ul>{findings}</ul>
{"".join(charts)}
<h2>Processes</h2>
<table><tr><th>trainer</th><th>worker</th><th>pid</th><th>CPU %</th><th>USS</th><th>RSS</th><th>state</th>
<th>doing</th></tr>{rows}</table>
<h2>Full report (Markdown)</h2><pre>{html.escape(render_md(report))}</pre>
</body></html>
"""
