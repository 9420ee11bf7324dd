"""`loadertop fleet --prometheus URL`: every job the node agents report (collect/fleet_figures.py), each
judged by the same rule as on one node (rules/across_nodes.py), as one `loadertop.fleet/1` report
(JSON, Markdown for an incident, or text for the terminal). A job all of whose ranks ended is
listed only when asked (`ended=True`)."""

from __future__ import annotations

import datetime as dt
import html

from ..collect.fleet_figures import LOOKBACK, SCHEMA, history, join
from ..probes.prometheus import MAX_SERIES, Prometheus
from ..rules.across_nodes import judge_job
from ..text import count
from .report_md import cell, code

__all__ = ["LOOKBACK", "SCHEMA", "count", "history", "read", "render_html", "render_md", "render_text"]


def read(prom: Prometheus, now: float | None = None, job: str | None = None, ended: bool = False) -> dict:
    """The fleet report. `job`: that job only, its ranks with their data wait's history;
    `ended`: list the jobs that ended within the lookback too."""
    joined = join(prom, now, job)
    out = [judge_job(name, rows) for name, rows in joined.jobs.items() if name]
    if not ended:
        out = [j for j in out if not j["ended"]]
    out.sort(key=lambda j: (j["straggler"] is None, -(j["straggler"] or {}).get("cost_fraction", 0.0) or 0.0,
                            -max((r["data_wait_fraction"] or 0.0) for r in j["ranks"])))
    notices = [] if not prom.refused else [
        f"{prom.refused} series refused: labels or figures no loadertop agent writes (a rank or a "
        "time that is not a number, labels that are not strings); check the targets Prometheus scrapes"]
    if prom.capped:
        notices.append(f"{prom.capped} series left out past the cap of {MAX_SERIES} a query: the fleet is read in "
                       "part; `--job NAME` reads one job whole")
    return {"schema": SCHEMA, "created_at": dt.datetime.fromtimestamp(joined.now, dt.timezone.utc).isoformat(
        timespec="seconds"), "prometheus": prom.url, "nodes": joined.nodes, "jobs": out, "notices": notices}




def _pod(r: dict) -> str:
    """' (pod namespace/name)' for a rank in a Kubernetes pod."""
    if not r.get("pod"):
        return ""
    return f" (pod {r['namespace']}/{r['pod']})" if r.get("namespace") else f" (pod {r['pod']})"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def render_text(report: dict) -> str:
    """The fleet in the terminal: a line a job, worst first, its ranks under it."""
    lines = [f"loadertop fleet: {count(len(report['jobs']), 'job')} on {count(len(report['nodes']), 'node')} "
             f"({report['prometheus']}, {report['created_at']})"]
    for n in report["nodes"]:
        if n["stale"]:
            lines.append(f"  node {n['node']}: STALE, last reported {n['age_s']:.0f} s ago")
    for notice in report.get("notices", []):
        lines.append(f"  n/a: {notice}")
    for job in report["jobs"]:
        s = job["straggler"]
        who = (f"; waits for rank {s['rank']} on {s['node']} ({s['cause']}), costing {_pct(s['cost_fraction'])} "
               "of the others' loop") if s else ""
        lines.append(f"{job['job']}: {job['verdict']} ({job['seen']} on {count(len(job['nodes']), 'node')}){who}")
        for r in job["ranks"]:
            lines.append(f"  rank {r['rank'] if r['rank'] is not None else '-':>4} {r['node']:<20} "
                         f"data wait {_pct(r['data_wait_fraction']):>4}  waits for ranks "
                         f"{_pct(r['wait_for_ranks_fraction']):>4}  {r['verdict']}"
                         + (f"  [{', '.join(r['findings'])}]" if r["findings"] else ""))
    return "\n".join(lines) + "\n"


def render_md(report: dict) -> str:
    """The fleet report as Markdown, to paste into an incident. Every label a target wrote is a
    code span or a table cell (report_md's): no heading, link or HTML can be forged through it."""
    out = [f"# loadertop fleet: {len(report['jobs'])} jobs", "",
           f"{report['created_at']}, from {code(report['prometheus'])}", ""]
    stale = [n for n in report["nodes"] if n["stale"]]
    if stale:
        ages = ", ".join(f"{code(n['node'])} ({n['age_s']:.0f} s)" for n in stale)
        out += [f"Stale nodes (their agent stopped reporting): {ages}", ""]
    out += [f"- n/a: {code(n)}" for n in report.get("notices", [])] + ([""] if report.get("notices") else [])
    for job in report["jobs"]:
        s = job["straggler"]
        out.append(f"## {code(job['job'])}: {code(job['verdict'])}")
        out.append("")
        out.append(f"{job['seen']} on {count(len(job['nodes']), 'node')}."
                   + (f" The job waits for rank {s['rank']} on {code(s['node'])} ({code(s['cause'])}): the others "
                      f"wait {_pct(s['cost_fraction'])} of their loop for it." if s else " No rank waits for another."))
        out.append("")
        out.append("| rank | node | data wait | waits for other ranks | workers | verdict | findings |")
        out.append("|---|---|---|---|---|---|---|")
        for r in job["ranks"]:
            out.append(f"| {r['rank']} | {cell(r['node'] + _pod(r))} | {_pct(r['data_wait_fraction'])} | "
                       f"{_pct(r['wait_for_ranks_fraction'])} | {r['workers']} | {cell(r['verdict'])} | "
                       f"{cell(', '.join(r['findings'])) if r['findings'] else ''} |")
        out.append("")
    return "\n".join(out)


def render_html(report: dict) -> str:
    """The fleet report as one self-contained HTML page (no script, no outside resource):
    a table a job, its straggler marked, and each rank's data wait history where read."""
    e = html.escape
    stale = [n for n in report["nodes"] if n["stale"]]
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>loadertop fleet: {len(report['jobs'])} jobs</title><style>",
           "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 2em}"
           "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}td.l,th.l{text-align:left}"
           "tr.straggler{background:#fde2e2}.bad{color:#b00020;font-weight:bold}.dim{color:#777}",
           "</style></head><body>",
           f"<h1>loadertop fleet: {count(len(report['jobs']), 'job')} on {count(len(report['nodes']), 'node')}</h1>",
           f"<p class='dim'>{e(report['created_at'])}, from {e(report['prometheus'])}</p>"]
    if stale:
        ages = ", ".join(f"{e(n['node'])} ({n['age_s']:.0f} s)" for n in stale)
        out.append(f"<p class='bad'>Stale nodes (their agent stopped reporting): {ages}</p>")
    for job in report["jobs"]:
        s = job["straggler"]
        verdict = f"<span class='{'bad' if s else ''}'>{e(job['verdict'])}</span>"
        out.append(f"<h2><code>{e(job['job'])}</code>: {verdict}</h2>")
        who = (f"The job waits for rank {s['rank']} on <code>{e(s['node'])}</code> ({e(s['cause'])}): the others "
               f"wait {_pct(s['cost_fraction'])} of their loop for it.") if s else "No rank waits for another."
        out.append(f"<p>{e(job['seen'])} on {count(len(job['nodes']), 'node')}. {who}</p>")
        history = any(r.get("data_wait_history") for r in job["ranks"])
        out.append("<table><tr><th>rank</th><th class='l'>node</th><th>data wait</th><th>waits for other ranks</th>"
                   "<th>workers</th><th>CPU %</th>" + ("<th class='l'>data wait, last 30 min</th>" if history else "")
                   + "<th class='l'>verdict</th><th class='l'>findings</th></tr>")
        for r in job["ranks"]:
            mark = " class='straggler'" if s and r["rank"] == s["rank"] else ""
            cpu = "n/a" if r["cpu_percent"] is None else f"{r['cpu_percent']:.0f}"
            out.append(f"<tr{mark}><td>{'-' if r['rank'] is None else r['rank']}</td>"
                       f"<td class='l'><code>{e(r['node'])}</code>{e(_pod(r))}</td>"
                       f"<td>{_pct(r['data_wait_fraction'])}</td><td>{_pct(r['wait_for_ranks_fraction'])}</td>"
                       f"<td>{'n/a' if r['workers'] is None else r['workers']}</td><td>{cpu}</td>"
                       + (f"<td class='l'>{_history_svg(r.get('data_wait_history'))}</td>" if history else "")
                       + f"<td class='l'>{e(r['verdict'])}</td><td class='l'>{e(', '.join(r['findings']))}</td></tr>")
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _history_svg(points: list[float | None] | None, width: int = 180, height: int = 24) -> str:
    """A rank's data wait over the last half hour as an inline line (0 to 100 %)."""
    if not points:
        return ""
    step = width / max(1, len(points) - 1)
    path = " ".join(f"{i * step:.1f},{height - v * height:.1f}" for i, v in enumerate(points) if v is not None)
    return (f"<svg width='{width}' height='{height}' role='img' aria-label='data wait history'>"
            f"<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='{path}'/></svg>")
