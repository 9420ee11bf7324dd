"""`loadertop fleet --prometheus URL`: every job the node agents report, joined across nodes by
their labels, each judged by the same rule as on one node (rules/ranks.py), as one
`loadertop.fleet/1` report (JSON, Markdown for an incident, or text for the terminal).

The figures are each series' latest value within LOOKBACK (so that a node whose agent stopped
keeps its last figures, marked stale with their age, never shown as live). A rank whose series
its node's agent no longer serves (the job ended: the agent dropped it, and Prometheus marked
its series stale at the next scrape) is `ended`; a job all of whose ranks ended is listed only
when asked (`ended=True`). Each rank's verdict is the one its node judged (`loadertop_verdict`,
the live view's header there); only what needs every node (who waits for whom across nodes,
the job's verdict) is worked out here, by the same rules."""

from __future__ import annotations

import datetime as dt
import html
import time

from ..model import Finding
from ..probes.prometheus import MAX_SERIES, Prometheus, Sample
from ..rules.ranks import RankFigures, attribute
from ..rules.verdict import job_verdict, undecided, word_of
from ..text import count
from .report_md import cell, code

SCHEMA = "loadertop.fleet/1"
LOOKBACK = "10m"
# A node is stale once Prometheus no longer has its series (a failed scrape marks them stale),
# or its latest sample is older than this (the agent samples every few seconds, Prometheus
# scrapes every 15-60 s).
STALE_S = 120.0
# A job's ranks, looked at one by one: their data wait over the last half hour.
HISTORY_S = 1800.0
HISTORY_POINTS = 60

FIGURES = {
    "data_wait": "loadertop_data_wait_ratio",
    "sync_frames": "loadertop_sync_frames_ratio",
    "sync_blocked": "loadertop_sync_blocked_ratio",
    "frames_error": "loadertop_sync_frames_stderr_ratio",
    "blocked_error": "loadertop_sync_blocked_stderr_ratio",
    "wait_for_ranks": "loadertop_wait_for_ranks_ratio",
    "steps_per_s": "loadertop_steps_per_second",
    "workers": "loadertop_workers",
}
KEY = ("train_job", "node", "rank")


def _rank(label: str) -> int | None:
    """A rank label as a number ('²' and '٣' are digits to str.isdigit, not ranks)."""
    return int(label) if label.isascii() and label.isdigit() and len(label) <= 9 else None


def _key(s: Sample) -> tuple[str, str, str]:
    return (s.labels.get("train_job", ""), s.labels.get("node", ""), s.labels.get("rank", ""))


def _matcher(job: str | None) -> str:
    """The label matcher of one job's series ('' for the whole fleet)."""
    if job is None:
        return ""
    escaped = job.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{{train_job="{escaped}"}}'


def read(prom: Prometheus, now: float | None = None, job: str | None = None, ended: bool = False) -> dict:
    """The fleet report: one query a figure (its cost grows with the jobs shown, not with the
    fleet's history). `job`: that job only, its ranks with their data wait's history; `ended`:
    list the jobs that ended within the lookback too."""
    now = time.time() if now is None else now
    only = _matcher(job)
    ranks: dict[tuple[str, str, str], dict] = {}
    sizes: dict[tuple[str, str, str], str] = {}
    pods: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}
    for name, metric in FIGURES.items():
        for s in prom.query(f"last_over_time({metric}{only}[{LOOKBACK}])"):
            if s.labels.get("rank") and _rank(s.labels["rank"]) is None:
                prom.refused += 1  # a rank label no agent writes ('²')
                continue
            row = ranks.setdefault(_key(s), {})
            row[name] = s.value
            sizes.setdefault(_key(s), s.labels.get("world_size", ""))
            pods.setdefault(_key(s), (s.labels.get("namespace") or None, s.labels.get("pod") or None))
    cpu = {_key(s): s.value for s in prom.query(
        f"sum by (train_job, node, rank) (last_over_time(loadertop_cpu_percent{only}[{LOOKBACK}]))")}
    findings: dict[tuple[str, str, str], list[str]] = {}
    for s in prom.query(f"last_over_time(loadertop_finding{only}[{LOOKBACK}]) == 1"):
        found = findings.setdefault(_key(s), [])
        if s.labels.get("id", "") not in found:  # one finding once, whatever its severity's series
            found.append(s.labels.get("id", ""))
    said: dict[tuple[str, str, str], str] = {}
    for s in prom.query(f"last_over_time(loadertop_verdict{only}[{LOOKBACK}]) == 1"):
        said[_key(s)] = s.labels.get("verdict", "")
    serving = {_key(s) for s in prom.query(f"loadertop_trainer_info{only}")}  # the ranks agents serve now
    seen = {s.labels.get("node", ""): s.value for s in prom.query(
        f"max by (node) (timestamp(last_over_time(loadertop_host_cpu_percent[{LOOKBACK}])))")}
    # Live: Prometheus has the node's series now. A failed scrape (the agent stopped, the node
    # went down) marks them stale at once; their last figures stay within the lookback.
    live = {s.labels.get("node", "") for s in prom.query("loadertop_host_cpu_percent")}
    nodes = [{"node": n, "age_s": round(max(0.0, now - at), 1), "stale": n not in live or now - at > STALE_S}
             for n, at in sorted(seen.items())]
    stale = {n["node"] for n in nodes if n["stale"]}
    jobs: dict[str, list[dict]] = {}
    for key, row in ranks.items():
        job, node, rank = key
        jobs.setdefault(job, []).append({
            "rank": _rank(rank), "node": node,
            "data_wait_fraction": _r(row.get("data_wait")), "sync_frames_fraction": _r(row.get("sync_frames")),
            "sync_blocked_fraction": _r(row.get("sync_blocked")), "steps_per_s": _r(row.get("steps_per_s")),
            "sync_frames_stderr": _r(row.get("frames_error")), "sync_blocked_stderr": _r(row.get("blocked_error")),
            "workers": int(row["workers"]) if "workers" in row else None, "cpu_percent": _r(cpu.get(key)),
            "findings": sorted(findings.get(key, [])), "stale": node in stale,
            "ended": node not in stale and key not in serving, "node_verdict": said.get(key),
            "world_size": _rank(sizes.get(key, "")),
            "namespace": pods.get(key, (None, None))[0], "pod": pods.get(key, (None, None))[1],
        })
    if job is not None:
        ranks_history = history(prom, job, now)
        for r in jobs.get(job, []):
            r["data_wait_history"] = ranks_history.get((r["node"], r["rank"]))
    out = [_job(name, rows) for name, rows in jobs.items() if name]
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
    return {"schema": SCHEMA, "created_at": dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(
        timespec="seconds"), "prometheus": prom.url, "nodes": nodes, "jobs": out, "notices": notices}


def history(prom: Prometheus, job: str, now: float | None = None) -> dict[tuple[str, int | None], list[float | None]]:
    """Each rank of the job (by node and rank): its data wait over the last HISTORY_S,
    HISTORY_POINTS points (None: no sample), from one range query of the job's series."""
    now = time.time() if now is None else now
    step = HISTORY_S / HISTORY_POINTS
    start = now - HISTORY_S
    out: dict[tuple[str, int | None], list[float | None]] = {}
    for s in prom.query_range(f"loadertop_data_wait_ratio{_matcher(job)}", start, now, step):
        points: list[float | None] = [None] * HISTORY_POINTS
        for t, v in s.points:
            points[min(HISTORY_POINTS - 1, max(0, int((t - start) / step)))] = round(v, 4)
        out[(s.labels.get("node", ""), _rank(s.labels.get("rank", "")))] = points
    return out


def _pod(r: dict) -> str:
    """' (pod namespace/name)' for a rank in a Kubernetes pod."""
    if not r.get("pod"):
        return ""
    return f" (pod {r['namespace']}/{r['pod']})" if r.get("namespace") else f" (pod {r['pod']})"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _job(name: str, rows: list[dict]) -> dict:
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["node"]))
    live = [r for r in rows if not r["stale"] and not r.get("ended") and r["rank"] is not None]
    figures = [RankFigures(r["rank"], r["node"], None, r["data_wait_fraction"], r["sync_frames_fraction"],
                           r["sync_blocked_fraction"], r["steps_per_s"], r["world_size"],
                           frames_error=r.get("sync_frames_stderr") or 0.0,
                           blocked_error=r.get("sync_blocked_stderr") or 0.0) for r in live]
    att = attribute(figures)
    waits = dict(att.waits)
    for r in rows:
        r["wait_for_ranks_fraction"] = _r(waits.get(r["rank"])) if not r["stale"] and not r.get("ended") else None
        r["verdict"] = _rank_verdict(r, att)
    size = max((r["world_size"] or 0 for r in rows), default=0) or None
    seen = len({r["rank"] for r in rows if r["rank"] is not None}) or len(rows)
    over = bool(rows) and all(r.get("ended") for r in rows)
    text, _ = job_verdict(att if len(live) >= 2 else None,
                          [(r["rank"], r["verdict"], "") for r in rows if not r["stale"] and not r.get("ended")])
    if over:
        text = "ENDED"
    straggler = att.straggler
    stale = sorted({r["node"] for r in rows if r["stale"]})
    return {
        "job": name, "verdict": text, "nodes": sorted({r["node"] for r in rows}), "world_size": size,
        "ranks_seen": seen, "seen": f"{seen} of {size} ranks seen" if size and size != seen else count(seen, "rank"),
        "stale_nodes": stale, "ended": over,
        "straggler": None if straggler is None else {
            "rank": straggler.rank, "node": straggler.node, "cause": straggler.cause,
            "cost_fraction": _r(att.cost)},
        "ranks": sorted(rows, key=lambda r: (straggler is None or r["rank"] != straggler.rank,
                                             -(r["wait_for_ranks_fraction"] or 0.0), r["rank"] or 0)),
    }


def _rank_verdict(r: dict, att) -> str:
    """A rank's verdict: who it waits for across nodes (only the fleet sees every node), else
    what its own node judged. An agent from before it exported verdicts: from its findings."""
    if r["stale"]:
        return "STALE"
    if r.get("ended"):
        return "ENDED"
    straggler = att.straggler
    if straggler is not None and r["rank"] in att.waiting:
        return f"WAITS FOR RANK {straggler.rank}"
    if straggler is not None and r["rank"] == straggler.rank and straggler.cause == "step":
        return "SLOWEST RANK"
    if r.get("node_verdict"):
        return str(r["node_verdict"])
    wait = r["data_wait_fraction"]
    findings = [Finding(i, "warning", None, "", {}) for i in r["findings"]]
    found = word_of(set(r["findings"]), findings, wait)
    if found is not None:
        return found[0]
    if wait is None:
        return "WATCHING"
    return (undecided(wait) or ("HEALTHY", ""))[0]


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
