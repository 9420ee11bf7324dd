"""The Markdown report: for an issue or a pull request. Rendered from the JSON report dict,
so the two never disagree.

Reports are pasted into public issues: a process's own words (its command line, a dataset's
class, py-spy's frames, a hook file's name, anything a finding or notice quotes) must not
forge headings, links or HTML there. Every interpolated field goes into a code span that
cannot be closed from inside (its fence is longer than any run of backticks in it), and
table cells escape `|`.
"""

from __future__ import annotations

import re

from ..fields import REPORT_COLUMNS, WORKER_FIELD, human_bytes, human_percent, row, worker_label
from ..rules.loops import loader_call
from .report import verdict_of_report


def code(text) -> str:
    """text as an inline code span nothing inside can end."""
    text = str(text).replace("\n", " ").replace("\r", " ")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text) -> str:
    """A table cell: a code span, its pipes escaped (GFM splits cells on them, even in code)."""
    return code(text).replace("|", "\\|")


def _num(x, fmt="{:.0f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _cpus(t: dict) -> str:
    quota = f", a {t['cpu_quota']:g}-CPU quota" if t.get("cpu_quota") else ""
    return f"{_num(t['usable_cpus'])} usable CPUs{quota}"


def plan_line(t: dict) -> str:
    """The one change to make and its predicted effect, or why there is none."""
    plan = t.get("plan")
    if not plan:
        return ""
    change = plan.get("change")
    if not change:
        return "No setting to change."
    parts = []
    flag = plan.get("worker_flag")
    for section, values in change.items():
        if not isinstance(values, dict):
            continue
        if section == "DataLoader" and flag and "num_workers" in values:
            # Said as the header says it: in the flag that set the count (rules/loops.py).
            now = (plan.get("current") or {}).get("num_workers")
            args = [f"num_workers={now} -> {values['num_workers']}",
                    *(f"{k}={v}" for k, v in values.items() if k != "num_workers")]
            parts.append(loader_call(None, args, None, str(flag)))
            continue
        parts.append(f"{section}({', '.join(f'{k}={v}' for k, v in values.items())})")
    gain = plan.get("predicted_gain")
    effect = f": predicted {gain:+.0%} steps/s" if gain is not None else ""
    measured = plan.get("measured") or {}
    if measured.get("of_this_change"):  # the loader's tuner tried this very change on this job
        effect += f", measured {measured['measured_gain']:+.0%} in place by tune=True"
    loader = f" for {code(change['dataset'])}" if change.get("dataset") else ""
    return f"Change {code(' '.join(parts))}{loader}{effect}."


def tune_lines(t: dict) -> list[str]:
    """Each tuned loader's decisions, epoch by epoch (`watch(loader, tune=True)`)."""
    out = []
    for loader in t.get("loaders") or []:
        tune = loader.get("tune")
        if not tune:
            continue
        name = f" for {code(loader['dataset_class'])}" if loader.get("dataset_class") else ""
        out += [f"In-place tuning{name}: {code(tune['summary'])} (its own cost so far: "
                f"{_num(tune['cost_s'], '{:.3f}')} s).",
                "", "| epoch | decision | measured steps/s | noise | the model predicted |", "|---|---|---|---|---|"]
        for d in tune["decisions"]:
            gain = _num(d["measured_gain"], "{:+.0%}")
            noise = _num(d["noise"], "±{:.0%}")
            predicted = _num(d.get("predicted_gain"), "{:+.0%}")
            out.append(f"| {d['epoch']} | {cell(d['text'].split(': ', 1)[-1])} | {gain} | {noise} | {predicted} |")
        out.append("")
    return out


def processes(t: dict) -> list[tuple[str, dict]]:
    """A report trainer's processes as the tables name them: main, w0, w1… (fields.worker_label)."""
    return [("main", t["main"])] + [(worker_label(w["worker_id"], i), w) for i, w in enumerate(t["workers"])]


def job_lines(report: dict) -> list[str]:
    """Each job of many ranks: who it waits for, and its ranks side by side (the straggler first)."""
    out = []
    for job in report.get("jobs", ()):
        if job["ranks_seen"] < 2:
            continue
        seen = job["ranks_seen"]
        of = f"{seen} of {job['world_size']}" if job.get("world_size") not in (None, seen) else f"{seen}"
        s = job["straggler"]
        if s is None:
            said = "No rank waits for another: each rank's verdict is its own"
        else:
            what = "its loader is behind" if s["cause"] == "input" else "its own step is the slowest"
            said = (f"The job waits for rank {s['rank']} (pid {s['pid']} on {code(s['node'])}): {what}; "
                    f"the others wait {human_percent(s.get('cost_fraction'))} of their loop for it")
        out.append(f"**Job {code(job['job'])}, ranks {of}: {job['verdict']}.** {said}.")
        out.append("")
        out.append("| rank | pid | verdict | data wait | waits for other ranks |")
        out.append("|---|---|---|---|---|")
        for r in job["ranks"]:
            out.append(f"| {_num(r['rank'])} | {r['pid']} | {r['verdict']} | {human_percent(r['data_wait_fraction'])} "
                       f"| {human_percent(r['wait_for_ranks_fraction'])} |")
        out.append("")
    return out


def render(report: dict) -> str:
    lines: list[str] = []
    host = report["host"]
    lines.append(f"# loadertop report: {verdict_of_report(report)}")
    lines.append("")
    lines.append(
        f"{report['created_at']} on {code(host['hostname'])}, {report['duration_s']:.0f} s sampled, "
        f"{host['cpu_count']} CPUs on the host, load {host['load_avg'][0]:.2f}"
    )
    lines.append("")
    lines += job_lines(report)
    for t in report["trainers"]:
        rank = f" (rank {t['rank']})" if t.get("rank") is not None else ""
        lines.append(f"- **Trainer {t['pid']}{rank}: {t.get('verdict') or 'n/a'}**, {_cpus(t)}. {plan_line(t)}")
    lines.append("")
    if report["findings"]:
        lines.append("## Findings")
        lines.append("")
        for f in report["findings"]:
            lines.append(f"- **{f['severity'].upper()} {code(f['id'])}** (trainer {f['trainer_pid']}): "
                         f"{code(f['title'])}")
            lines.append(f"  - Change: {code(f['suggestion'])}")
            if f["change"]:
                lines.append(f"  - As config: {code(f['change'])}")
            evidence = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if v is not None)
            lines.append(f"  - Evidence: {code(evidence)}")
        lines.append("")
    else:
        lines.append("No findings.")
        lines.append("")
    for t in report["trainers"]:
        rank = f", rank {t['rank']}" if t["rank"] is not None else ""
        lines.append(f"## Trainer {t['pid']}{rank} ({t['status']})")
        lines.append("")
        lines.append(code(" ".join(t["cmdline"])[:300]))
        lines.append("")
        dw = t.get("data_wait") or {}
        shm = t.get("shm") or {}
        lines.append("| figure | value |")
        lines.append("|---|---|")
        lines.append(f"| data wait | {human_percent(t['data_wait_fraction'])} "
                     f"({_num(dw.get('samples'))} samples over {_num(dw.get('window_s'))} s) |")
        if dw:
            workers = human_percent(dw.get("worker_wait_fraction"))
            main = human_percent(dw.get("main_process_fraction"))
            lines.append(f"| of which blocked on workers / main-process work | {workers} / {main} |")
        lines.append(f"| usable CPUs | {_cpus(t)} |")
        lines.append(f"| workers | {len(t['workers'])}, respawns {t['worker_respawns']} |")
        lines.append(f"| pin-memory thread | {t['pin_memory_thread']} |")
        if shm:
            lines.append(f"| /dev/shm | {human_bytes(shm.get('used_bytes'))} of {human_bytes(shm.get('total_bytes'))}"
                         f" (peak {human_bytes(shm.get('peak_used_bytes'))}) |")
        for g in t["gpus"]:
            lines.append(f"| GPU {g['index']} | {_num(g['utilization_percent'])}% utilization |")
        env = ", ".join(f"{k}={v}" for k, v in t["env"].items())
        if env:
            lines.append(f"| environment | {cell(env)} |")
        lines.append("")
        lines += tune_lines(t)
        lines.append("| " + " | ".join(WORKER_FIELD[k].header for k in REPORT_COLUMNS) + " |")
        lines.append("|" + "---|" * len(REPORT_COLUMNS))
        for label, p in processes(t):
            lines.append("| " + " | ".join(cell(c) for c in row(label, p, keys=REPORT_COLUMNS)) + " |")
        lines.append("")
    if report["notices"]:
        lines.append("## What could not be measured")
        lines.append("")
        for n in report["notices"]:
            fix = f" Fix: {code(n['fix'])}" if n.get("fix") else ""
            lines.append(f"- {code(n['message'])}.{fix}")
        lines.append("")
    lines.append(f"_Written by loadertop ({report['schema']})._")
    return "\n".join(lines) + "\n"
