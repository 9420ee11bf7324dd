"""`loadertop diff BEFORE AFTER`: one job before and after a change (pure, over two reports).

What changed in the settings (each loader's workers, prefetch, persistence and batch size, pin
memory, the thread limits, the CPUs and /dev/shm it had) and what that did (steps/s, data
wait, the workers' and the main process's CPU, /dev/shm used, findings gone and new), each
figure with its noise: a change counts only past two standard errors of the difference
(outputs/figures.py), so "+50 % steps/s" is told from a wobble.

The trainers of the two reports are paired by rank where every one has a rank, else one to
one, else by program in pid order; two reports whose trainers run different programs are two
different jobs, and are refused.
"""

from __future__ import annotations

import html
import math
import os

from ..fields import human_bytes
from ..redact import ENV_WHITELIST
from ..rules import thresholds as T
from .report_md import cell, code

SCHEMA = "loadertop.diff/1"


class NotComparable(ValueError):
    """The two reports are not one job before and after a change."""


# (key in a report's figures, what the user reads, which way is better: +1 up, -1 down, 0 neither)
FIGURES = (
    ("steps_per_s", "steps/s", +1),
    ("data_wait", "data wait", -1),
    ("workers_cpu_percent", "workers' CPU %", 0),
    ("main_cpu_percent", "main process CPU %", 0),
    ("shm_used_bytes", "/dev/shm used", 0),
)

# Where a figure's noise is unknown (one window, an old report), a change smaller than this
# share is not called a change: one setting differs by ±7 % between runs on a 2-CPU VM (docs/BENCHMARKS.md §10).
UNKNOWN_NOISE_FLOOR = 0.05
INTERPRETER_FLAGS_WITH_VALUE = frozenset({"-W", "-X", "-c"})


def program(cmdline: list[str]) -> str:
    """What a trainer runs: its script's file name, or `-m module`, past the interpreter."""
    args = list(cmdline)
    if args and os.path.basename(args[0]).startswith(("python", "pypy")):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] != "-m":
            flag = args.pop(0)
            if flag in INTERPRETER_FLAGS_WITH_VALUE and args:
                args.pop(0)
        if len(args) >= 2 and args[0] == "-m":
            return f"-m {args[1]}"
    return os.path.basename(args[0]) if args else "?"


def diff(before: dict, after: dict, names: tuple[str, str] = ("before", "after")) -> dict:
    """The loadertop.diff/1 report of two loadertop.report/2 reports of one job."""
    pairs, only_before, only_after = _pairs(before["trainers"], after["trainers"])
    if not pairs:
        progs = [", ".join(sorted({program(t["cmdline"]) for t in r["trainers"]})) or "no trainer"
                 for r in (before, after)]
        raise NotComparable(f"{names[0]} runs {progs[0]} and {names[1]} runs {progs[1]}: diff compares one job "
                            "before and after a change (two reports or recordings of the same program)")
    findings = [_findings_by_pid(r) for r in (before, after)]
    trainers = []
    for b, a in pairs:
        gone = sorted(set(findings[0].get(b["pid"], {})) - set(findings[1].get(a["pid"], {})))
        new = sorted(set(findings[1].get(a["pid"], {})) - set(findings[0].get(b["pid"], {})))
        trainers.append({
            "rank": a.get("rank"), "program": program(a["cmdline"]), "pid_before": b["pid"], "pid_after": a["pid"],
            "settings": _settings(b, a),
            "figures": [_figure(key, label, better, _figures_of(b).get(key), _figures_of(a).get(key))
                        for key, label, better in FIGURES],
            "findings_gone": gone, "findings_new": new,
            "findings_kept": sorted(set(findings[0].get(b["pid"], {})) & set(findings[1].get(a["pid"], {}))),
            "verdict_before": b.get("verdict"), "verdict_after": a.get("verdict"),
        })
    return {
        "schema": SCHEMA,
        "before": _about(before, names[0]), "after": _about(after, names[1]),
        "trainers": trainers,
        "only_before": [t["pid"] for t in only_before], "only_after": [t["pid"] for t in only_after],
    }


def slower(report: dict, percent: float) -> list[str]:
    """Each trainer whose steps/s fell by more than `percent` and past its noise, in a line;
    raises NotComparable where no trainer has steps/s on both sides."""
    measured = [(t, f) for t in report["trainers"] for f in t["figures"]
                if f["name"] == "steps_per_s" and f["before"] is not None and f["after"] is not None]
    if not measured:
        raise NotComparable("--fail-if-slower needs steps/s in both reports, and the hook measures them: "
                            "wrap the loader in loadertop.watch(loader) (or use a framework's callback)")
    out = []
    for t, f in measured:
        fell = -f["change_fraction"] if f["change_fraction"] is not None else 0.0
        if fell * 100 > percent and f["state"] != "within noise":
            who = f"rank {t['rank']}: " if t["rank"] is not None else ""
            out.append(f"{who}steps/s fell {fell:.0%} ({f['before']:.1f} -> {f['after']:.1f}"
                       + (f", beyond the noise of ±{f['noise']:.1f}" if f["noise"] is not None else "")
                       + f"): more than --fail-if-slower {percent:g}")
    return out


# --- the comparison ---------------------------------------------------------------------------


def _about(report: dict, name: str) -> dict:
    return {"file": name, "created_at": report.get("created_at"), "duration_s": report.get("duration_s"),
            "hostname": (report.get("host") or {}).get("hostname")}


def _pairs(before: list[dict], after: list[dict]) -> tuple[list[tuple[dict, dict]], list[dict], list[dict]]:
    if before and after and all(t.get("rank") is not None for t in (*before, *after)):
        by_rank = {t["rank"]: t for t in after}
        pairs = [(b, by_rank[b["rank"]]) for b in before if b["rank"] in by_rank
                 and program(b["cmdline"]) == program(by_rank[b["rank"]]["cmdline"])]
    else:
        left = sorted(after, key=lambda t: t["pid"])
        pairs = []
        for b in sorted(before, key=lambda t: t["pid"]):
            match = next((a for a in left if program(a["cmdline"]) == program(b["cmdline"])), None)
            if match is not None:
                left.remove(match)
                pairs.append((b, match))
    paired_b = {id(b) for b, _ in pairs}
    paired_a = {id(a) for _, a in pairs}
    return pairs, [t for t in before if id(t) not in paired_b], [t for t in after if id(t) not in paired_a]


def _findings_by_pid(report: dict) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for f in report.get("findings", []):
        if f.get("severity") != "info":
            out.setdefault(f.get("trainer_pid"), {})[f["id"]] = f
    return out


def _loader_settings(t: dict) -> dict[str, dict]:
    """Each loader's settings by its name; a worker count no one read (the hook is off, py-spy
    had not read the locals yet) is the workers seen: a 2-worker job read "unset -> 2"."""
    loaders = t.get("loaders") or []
    seen = len(t.get("workers") or [])
    if not loaders:
        return {"DataLoader": {"num_workers": seen}} if seen else {}
    out = {}
    for i, loader in enumerate(loaders):
        name = loader.get("name") or loader.get("dataset_class") or f"loader {i}"
        settings = {k: loader.get(k) for k in ("num_workers", "prefetch_factor", "persistent_workers", "batch_size")}
        if settings["num_workers"] is None:
            settings["num_workers"] = len(loader.get("worker_pids") or []) or (seen if len(loaders) == 1 else None)
        out[name] = settings
    return out


def _settings(b: dict, a: dict) -> list[dict]:
    """Every setting that differs: (name, before, after)."""
    rows = []

    def add(name: str, x, y) -> None:
        if x != y:
            rows.append({"name": name, "before": x, "after": y})

    lb, la = _loader_settings(b), _loader_settings(a)
    if len(lb) == 1 and len(la) == 1:  # one loader each: the same one, however each side names it
        lb = {next(iter(la)): next(iter(lb.values()))}
    for name in [*lb, *(n for n in la if n not in lb)]:
        sb, sa = lb.get(name, {}), la.get(name, {})
        for key in ("num_workers", "prefetch_factor", "persistent_workers", "batch_size"):
            # Only what both sides tell (py-spy does not see prefetch_factor; the hook does).
            if sb.get(key) is not None and sa.get(key) is not None or key == "num_workers":
                add(f"{name}: {key}", sb.get(key), sa.get(key))
    add("pin_memory", b.get("pin_memory_thread"), a.get("pin_memory_thread"))
    eb, ea = b.get("env") or {}, a.get("env") or {}
    for key in sorted(k for k in {*eb, *ea} if k in ENV_WHITELIST and k.endswith("_THREADS")):
        add(key, eb.get(key), ea.get(key))
    add("usable CPUs", b.get("usable_cpus"), a.get("usable_cpus"))
    add("/dev/shm size", (b.get("shm") or {}).get("total_bytes"), (a.get("shm") or {}).get("total_bytes"))
    return rows


def _figures_of(t: dict) -> dict[str, dict]:
    """A trainer's figures; a report written before they were kept gets what it holds, with no
    noise but py-spy's sampling error."""
    if t.get("figures"):
        return t["figures"]
    dw = t.get("data_wait") or {}
    wait, samples = dw.get("fraction"), dw.get("samples") or 0
    error = None
    if wait is not None and samples and dw.get("source") == "py-spy":
        error = math.sqrt(wait * (1 - wait) / samples)
    workers = [w["cpu_percent"] for w in t.get("workers", []) if w.get("cpu_percent") is not None]
    shm = t.get("shm") or {}
    return {
        "steps_per_s": {"value": dw.get("steps_per_s"), "stderr": None, "readings": 1},
        "data_wait": {"value": wait, "stderr": error, "readings": 1},
        "workers_cpu_percent": {"value": sum(workers) if workers else None, "stderr": None, "readings": 1},
        "main_cpu_percent": {"value": (t.get("main") or {}).get("cpu_percent"), "stderr": None, "readings": 1},
        "shm_used_bytes": {"value": shm.get("used_bytes"), "stderr": None, "readings": 1},
    }


def _figure(key: str, label: str, better: int, b: dict | None, a: dict | None) -> dict:
    x = b.get("value") if b else None
    y = a.get("value") if a else None
    eb = b.get("stderr") if b else None
    ea = a.get("stderr") if a else None
    row = {"name": key, "label": label, "before": x, "after": y, "stderr_before": eb, "stderr_after": ea,
           "change": None, "change_fraction": None, "noise": None, "state": "not measured"}
    if x is None or y is None:
        return row
    change = y - x
    row["change"] = round(change, 4)
    row["change_fraction"] = round(change / x, 4) if x else None
    if eb is not None and ea is not None:
        row["noise"] = round(T.NOISE_Z * math.hypot(eb, ea), 4)
    if row["noise"] is not None and abs(change) <= row["noise"]:
        row["state"] = "within noise"
    elif change == 0 or (row["noise"] is None and x and abs(change / x) < UNKNOWN_NOISE_FLOOR):
        row["state"] = "same" if change == 0 else "about the same (noise unknown)"
    else:
        up = change > 0
        state = ("better" if up == (better > 0) else "worse") if better else ("up" if up else "down")
        row["state"] = state + (" (noise unknown)" if row["noise"] is None else "")
    return row


# --- rendering --------------------------------------------------------------------------------


def value_text(key: str, x: float | None) -> str:
    if x is None:
        return "n/a"
    if key == "data_wait":
        return f"{x:.0%}"
    if key == "shm_used_bytes":
        return human_bytes(int(x))
    if key == "steps_per_s":
        return f"{x:.1f}"
    return f"{x:.0f}"


def noise_text(key: str, e: float | None) -> str:
    if e is None:
        return ""
    if key == "data_wait":
        return f" ±{e * 100:.1f}"
    if key == "shm_used_bytes":
        return f" ±{human_bytes(int(e))}"
    return f" ±{e:.1f}" if key == "steps_per_s" else f" ±{e:.0f}"


def change_text(f: dict) -> str:
    if f["change"] is None:
        return ""
    if f["name"] == "data_wait":
        return f"{f['change'] * 100:+.0f} pts"
    if f["change_fraction"] is not None:
        return f"{f['change_fraction']:+.0%}"
    return value_text(f["name"], f["change"])


def _setting_text(x) -> str:
    if x is None:
        return "unset"
    if isinstance(x, bool):
        return "on" if x else "off"
    return str(x)


def _setting_value(row: dict, x) -> str:
    return human_bytes(x) if row["name"] == "/dev/shm size" and isinstance(x, int) else _setting_text(x)


def _title(report: dict) -> str:
    b, a = report["before"], report["after"]
    return (f"{b['file']} ({b['created_at']}, {b['duration_s']:.0f} s) -> "
            f"{a['file']} ({a['created_at']}, {a['duration_s']:.0f} s)")


def _who(t: dict) -> str:
    rank = f"rank {t['rank']}, " if t["rank"] is not None else ""
    return f"{rank}{t['program']} (pid {t['pid_before']} -> {t['pid_after']})"


def render_text(report: dict) -> str:
    out = [f"loadertop diff: {_title(report)}"]
    for t in report["trainers"]:
        out += ["", _who(t), "  settings:"]
        if not t["settings"]:
            out.append("    none changed")
        for s in t["settings"]:
            out.append(f"    {s['name']:<34} {_setting_value(s, s['before'])} -> {_setting_value(s, s['after'])}")
        out.append("  what it did:")
        for f in t["figures"]:
            if f["state"] == "not measured":
                continue
            before = value_text(f["name"], f["before"]) + noise_text(f["name"], f["stderr_before"])
            after = value_text(f["name"], f["after"]) + noise_text(f["name"], f["stderr_after"])
            out.append(f"    {f['label']:<20} {before:>14} -> {after:<14} {change_text(f):>9}  {f['state']}")
        out.append(f"  findings: gone {', '.join(t['findings_gone']) or '-'}; new {', '.join(t['findings_new']) or '-'}"
                   + (f"; still {', '.join(t['findings_kept'])}" if t["findings_kept"] else ""))
        out.append(f"  verdict: {t['verdict_before']} -> {t['verdict_after']}")
    for side, pids in (("before", report["only_before"]), ("after", report["only_after"])):
        if pids:
            out.append(f"\nonly {side}: pid {', '.join(map(str, pids))} "
                       "(no trainer of the same program on the other side)")
    out.append("\n± is one standard error; a change within two of the difference is within noise.")
    return "\n".join(out) + "\n"


def render_md(report: dict) -> str:
    b, a = report["before"], report["after"]
    out = ["# loadertop diff", "", f"{code(b['file'])} ({b['created_at']}, {b['duration_s']:.0f} s) → "
           f"{code(a['file'])} ({a['created_at']}, {a['duration_s']:.0f} s)", ""]
    for t in report["trainers"]:
        rank = f"rank {t['rank']}, " if t["rank"] is not None else ""
        out += [f"## {rank}{code(t['program'])}: {code(t['verdict_before'])} → {code(t['verdict_after'])}", ""]
        if t["settings"]:
            out += ["| setting | before | after |", "|---|---|---|"]
            out += [f"| {cell(s['name'])} | {cell(_setting_value(s, s['before']))} | "
                    f"{cell(_setting_value(s, s['after']))} |" for s in t["settings"]]
        else:
            out.append("No setting changed.")
        out += ["", "| figure | before | after | change | |", "|---|---|---|---|---|"]
        for f in t["figures"]:
            if f["state"] != "not measured":
                out.append(f"| {f['label']} | {value_text(f['name'], f['before'])}"
                           f"{noise_text(f['name'], f['stderr_before'])}"
                           f" | {value_text(f['name'], f['after'])}{noise_text(f['name'], f['stderr_after'])}"
                           f" | {change_text(f)} | {f['state']} |")
        out += ["", f"Findings gone: {', '.join(map(code, t['findings_gone'])) or 'none'}; "
                f"new: {', '.join(map(code, t['findings_new'])) or 'none'}.", ""]
    out.append("± is one standard error; a change within two of the difference is within noise.")
    return "\n".join(out) + "\n"


def render_html(report: dict) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>loadertop diff</title><style>",
           "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
           "table{border-collapse:collapse;margin:.5em 0 1.5em}"
           "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}td.l,th.l{text-align:left}"
           ".better{color:#0a7d32;font-weight:bold}.worse{color:#b00020;font-weight:bold}.dim{color:#777}",
           "</style></head><body>", "<h1>loadertop diff</h1>", f"<p class='dim'>{e(_title(report))}</p>"]
    for t in report["trainers"]:
        out.append(f"<h2>{e(_who(t))}: {e(str(t['verdict_before']))} → {e(str(t['verdict_after']))}</h2>")
        if t["settings"]:
            out.append("<table><tr><th class='l'>setting</th><th>before</th><th>after</th></tr>")
            out += [f"<tr><td class='l'>{e(s['name'])}</td><td>{e(_setting_value(s, s['before']))}</td>"
                    f"<td>{e(_setting_value(s, s['after']))}</td></tr>" for s in t["settings"]]
            out.append("</table>")
        else:
            out.append("<p>No setting changed.</p>")
        out.append("<table><tr><th class='l'>figure</th><th>before</th><th>after</th><th>change</th>"
                   "<th class='l'></th></tr>")
        for f in t["figures"]:
            if f["state"] == "not measured":
                continue
            kind = f["state"].split(" ")[0] if f["state"].startswith(("better", "worse")) else "dim"
            out.append(f"<tr><td class='l'>{e(f['label'])}</td>"
                       f"<td>{e(value_text(f['name'], f['before']) + noise_text(f['name'], f['stderr_before']))}</td>"
                       f"<td>{e(value_text(f['name'], f['after']) + noise_text(f['name'], f['stderr_after']))}</td>"
                       f"<td>{e(change_text(f))}</td><td class='l {kind}'>{e(f['state'])}</td></tr>")
        out.append("</table>")
        out.append(f"<p>Findings gone: {e(', '.join(t['findings_gone']) or 'none')}; "
                   f"new: {e(', '.join(t['findings_new']) or 'none')}.</p>")
    out.append("<p class='dim'>± is one standard error; a change within two of the difference is within noise.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
