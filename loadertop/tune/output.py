"""What `loadertop tune` prints and writes: a table of every setting, the recommendation with
the exact DataLoader line, and the same as JSON (`loadertop.tune/1`), Markdown or HTML (with
the diminishing-returns curve as an inline SVG chart). Outputs only read the result."""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone

from ..fields import human_bytes, human_percent
from ..rules.thresholds import WORKER_BUSY_THREADS
from .grid import Summary, rate_of
from .result import TuneResult

SCHEMA = "loadertop.tune/1"
OVERRUN_NOTE = "settings that hang wait for --first-batch-timeout"


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _bytes(x: int | None) -> str:
    return "n/a" if x is None else human_bytes(x)


def dataloader_line(result: TuneResult) -> str | None:
    rec = result.recommendation
    if rec is None:
        return None
    return rec.chosen.config.dataloader_line(result.batch_size, result.extra_kwargs)


def environment(result: TuneResult) -> dict[str, str]:
    """Environment for the recommended setting: one compute thread per worker where the
    workers ran thread pools (the monitor's worker_threads finding)."""
    rec = result.recommendation
    if rec is None:
        return {}
    busy = rec.chosen.mean("busy_threads_per_worker")
    if rec.chosen.config.num_workers > 0 and busy is not None and busy >= WORKER_BUSY_THREADS:
        return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return {}


def _row(s: Summary, result: TuneResult) -> dict:
    rec = result.recommendation
    return {
        "num_workers": s.config.num_workers,
        "prefetch_factor": s.config.prefetch_factor,
        "pin_memory": s.config.pin_memory,
        "runs": len(s.trials),
        "rate": None if s.rate is None else round(s.rate, 2),
        "rate_stderr": None if s.stderr is None else round(s.stderr, 2),
        "samples_per_s": _round(s.mean("samples_per_s")),
        "batches_per_s": _round(s.mean("batches_per_s")),
        "data_wait_fraction": _round(s.mean("data_wait"), 4),
        "first_batch_s": _round(s.mean("first_batch_s"), 3),
        "worker_cpu_percent": _round(s.mean("worker_cpu_percent"), 1),
        "main_cpu_percent": _round(s.mean("main_cpu_percent"), 1),
        "busy_threads_per_worker": _round(s.mean("busy_threads_per_worker"), 2),
        "ctx_switches_per_s": _round(s.mean("ctx_switches_per_s"), 0),
        "rss_bytes": s.mean("rss_bytes"),
        "pss_bytes": s.mean("pss_bytes"),
        "uss_bytes": s.mean("uss_bytes"),
        "shm_peak_bytes": s.mean("shm_peak_bytes"),
        "shm_total_bytes": s.mean("shm_total_bytes"),
        "excluded": s.excluded,
        "recommended": rec is not None and s is rec.chosen,
        "best": rec is not None and s is rec.best,
        "indistinguishable_from_best": rec is not None and s.config in rec.ties,
    }


def _round(x, digits: int = 2):
    return None if x is None else round(x, digits)


def to_dict(result: TuneResult) -> dict:
    rec = result.recommendation
    m = result.machine
    return {
        "schema": SCHEMA,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "factory": result.spec.factory,
        "dataset": result.dataset,
        "batch_size": result.batch_size,
        "metric": result.metric,
        "per_step_ms": result.spec.per_step_ms,
        "budget_s": result.spec.budget_s,
        "elapsed_s": round(result.elapsed_s, 1),
        "stopped_early": result.stopped,
        "skipped": [c.label() for c in result.skipped],
        "machine": {"usable_cpus": m.usable_cpus, "other_trainers": m.other_trainers, "cpu_share": m.cpu_share,
                    "memory_available_bytes": m.memory_available, "cuda": result.cuda},
        "configs": [_row(s, result) for s in result.summaries],
        "recommendation": None if rec is None else {
            "num_workers": rec.chosen.config.num_workers,
            "prefetch_factor": rec.chosen.config.prefetch_factor,
            "pin_memory": rec.chosen.config.pin_memory,
            "persistent_workers": rec.chosen.config.num_workers > 0,
            "dataloader": dataloader_line(result),
            "env": environment(result),
            "rate": round(rate_of(rec.chosen), 2),
            "best_rate": round(rate_of(rec.best), 2),
            "reasons": list(rec.reasons),
        },
    }


def to_json(result: TuneResult) -> str:
    return json.dumps(to_dict(result), indent=2) + "\n"


def table(result: TuneResult) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows; data wait only where a step was emulated (else the loop only waits)."""
    header: tuple[str, ...] = ("setting", "runs", result.metric, "±", "data wait", "1st batch", "worker CPU", "PSS",
                               "shm peak", "")
    rows = table_rows(result)
    if not result.spec.per_step_ms:
        header = header[:4] + header[5:]
        rows = [r[:4] + r[5:] for r in rows]
    return header, rows


def table_rows(result: TuneResult) -> list[tuple[str, ...]]:
    rec = result.recommendation
    rows: list[tuple[str, ...]] = []
    for s in result.summaries:
        mark = ""
        if rec is not None and s is rec.chosen:
            mark = "<- recommended"
        elif rec is not None and s is rec.best:
            mark = "fastest"
        elif rec is not None and s.config in rec.ties:
            mark = "same as fastest (noise)"
        if s.excluded:
            mark = f"left out: {s.excluded}"
        rows.append((
            s.config.label(), str(len(s.trials)), _num(s.rate, "{:.1f}"), _num(s.stderr, "{:.1f}"),
            human_percent(s.mean("data_wait")), _num(s.mean("first_batch_s"), "{:.2f}s"),
            _num(s.mean("worker_cpu_percent"), "{:.0f}%"),
            _bytes(s.mean("pss_bytes") or s.mean("rss_bytes")), _bytes(s.mean("shm_peak_bytes")), mark,
        ))
    return rows


def to_text(result: TuneResult) -> str:
    header, rows = table(result)
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    lines.append("")
    lines += summary_lines(result)
    return "\n".join(lines) + "\n"


def summary_lines(result: TuneResult) -> list[str]:
    rec = result.recommendation
    m = result.machine
    out = [f"{result.dataset or 'dataset'} from {result.spec.factory}: {len(result.summaries)} settings in "
           f"{result.elapsed_s:.0f} s on {m.cpu_share} CPUs"
           + (f" (a share of {m.usable_cpus}: {m.other_trainers} other DataLoader jobs running)"
              if m.other_trainers else "")
           + (" - stopped early (Ctrl-C)" if result.stopped else "")]
    if result.skipped:
        out.append(f"not run, the budget was overrun ({OVERRUN_NOTE}): "
                   + ", ".join(c.label() for c in result.skipped))
    if rec is None:
        out.append("no setting could be measured; see the errors above")
        return out
    out.append(f"use: {dataloader_line(result)}")
    env = environment(result)
    if env:
        out.append("env: " + " ".join(f"{k}={v}" for k, v in env.items()))
    speed = f"{rec.chosen.rate:.1f} {result.metric}"
    if result.spec.per_step_ms:
        speed += f", data wait {human_percent(rec.chosen.mean('data_wait'))} of a {result.spec.per_step_ms:g} ms step"
    out.append(f"measured: {speed} ({len(rec.chosen.trials)} runs)")
    if rec.ties:
        out.append("indistinguishable from the fastest within noise: " + ", ".join(c.label() for c in rec.ties))
    out += [f"note: {r}" for r in rec.reasons]
    return out


def to_markdown(result: TuneResult) -> str:
    header, rows = table(result)
    lines = [f"# loadertop tune: {result.spec.factory}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    lines.append("")
    lines += [f"- {ln}" for ln in summary_lines(result)]
    return "\n".join(lines) + "\n"


def chart_svg(result: TuneResult, width: int = 640, height: int = 300) -> str:
    """Throughput against num_workers, one line per (prefetch, pin) setting: where the curve
    flattens, more workers stop paying."""
    points = [(s.config.num_workers, s.rate, s) for s in result.summaries if s.rate is not None]
    if not points:
        return ""
    left, bottom, top, right = 60, 40, 20, 20
    xs = sorted({p[0] for p in points})
    ymax = max(p[1] for p in points) * 1.1 or 1.0

    def x_of(w: int) -> float:
        i = xs.index(w)
        return left + (width - left - right) * (i / max(1, len(xs) - 1))

    def y_of(v: float) -> float:
        return height - bottom - (height - bottom - top) * v / ymax

    # One line per (prefetch, pin), each starting from workers=0 (which has no prefetch).
    zero = {s.config.pin_memory: (w, v, s) for w, v, s in points if w == 0}
    series: dict[tuple, list] = {}
    for w, v, s in points:
        if w > 0:
            series.setdefault((s.config.prefetch_factor, s.config.pin_memory), []).append((w, v, s))
    for key in series:
        series[key] = ([zero[key[1]]] if key[1] in zero else []) + sorted(series[key], key=lambda p: p[0])
    if not series:
        series = {(None, pin): [p] for pin, p in zero.items()}
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(result.metric)} by num_workers">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>']
    for w in xs:
        parts.append(f'<text x="{x_of(w):.0f}" y="{height - bottom + 16}" font-size="12" '
                     f'text-anchor="middle">{w}</text>')
    parts.append(f'<text x="{(width + left) / 2:.0f}" y="{height - 6}" font-size="12" '
                 'text-anchor="middle">num_workers</text>')
    for frac in (0.0, 0.5, 1.0):
        v = ymax / 1.1 * frac
        parts.append(f'<text x="{left - 6}" y="{y_of(v) + 4:.0f}" font-size="11" text-anchor="end">{v:.0f}</text>')
    parts.append(f'<text x="12" y="{top + 4}" font-size="12">{html.escape(result.metric)}</text>')
    for i, (key, pts) in enumerate(sorted(series.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))):
        color = colors[i % len(colors)]
        path = " ".join(f"{x_of(w):.1f},{y_of(v):.1f}" for w, v, _ in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        for w, v, s in pts:
            mark = result.recommendation is not None and s is result.recommendation.chosen
            parts.append(f'<circle cx="{x_of(w):.1f}" cy="{y_of(v):.1f}" r="{6 if mark else 3}" fill="{color}">'
                         f'<title>{html.escape(s.config.label())}: {v:.1f}</title></circle>')
        label = "no prefetch" if key[0] is None else f"prefetch={key[0]}" + (" pin" if key[1] else "")
        parts.append(f'<text x="{width - right - 4}" y="{top + 14 * (i + 1)}" font-size="11" fill="{color}" '
                     f'text-anchor="end">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def to_html(result: TuneResult) -> str:
    header, table_body = table(result)
    rows = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table_body)
    items = "\n".join(f"<li>{html.escape(ln)}</li>" for ln in summary_lines(result))
    title = html.escape(f"loadertop tune: {result.spec.factory}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:60em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}</style></head>
<body><h1>{title}</h1>
<ul>{items}</ul>
<h2>Throughput by setting</h2>
{chart_svg(result)}
<table><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in header)}</tr>
{rows}</table>
</body></html>
"""


def render(result: TuneResult, path: str) -> str:
    if path.endswith(".json"):
        return to_json(result)
    if path.endswith(".md"):
        return to_markdown(result)
    return to_html(result)
