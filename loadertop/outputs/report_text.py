"""A report for the terminal (`loadertop snapshot` with no `--json` and no `-o`, on a terminal):
the verdict and the one change first, as the live view's header says them, then each trainer's
workers as the live view's table shows them, and the findings. What the report says, never judged
again (outputs only consume)."""

from __future__ import annotations

from ..fields import REPORT_COLUMNS, WORKER_FIELD, human_percent, row
from .report import verdict_of_report
from .report_md import _cpus, job_lines, plan_line, processes


def render(report: dict) -> str:
    host = report["host"]
    out = [f"loadertop: {verdict_of_report(report)}",
           f"  {report['duration_s']:.0f} s sampled on {host['hostname']}, {host['cpu_count']} CPUs, "
           f"load {host['load_avg'][0]:.2f}", ""]
    out += [line.replace("**", "").replace("`", "") for line in job_lines(report) if line]
    for t in report["trainers"]:
        rank = f" rank {t['rank']}," if t.get("rank") is not None else ""
        out.append(f"trainer {t['pid']}{rank} {t['status']}: {t.get('verdict') or 'n/a'}   "
                   f"data wait {human_percent(t.get('data_wait_fraction'))}   {_cpus(t)}")
        change = plan_line(t).replace("`", "")
        if change:
            out.append(f"  -> {change}")
        fields = [WORKER_FIELD[k] for k in REPORT_COLUMNS]
        rows = [[f.header for f in fields]] + [row(label, p, keys=REPORT_COLUMNS) for label, p in processes(t)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(fields))]
        for r in rows:
            cells = [c.rjust(w) if f.right else c.ljust(w) for c, w, f in zip(r, widths, fields, strict=True)]
            out.append("  " + "  ".join(cells).rstrip())
        out.append("")
    if report["findings"]:
        out.append("findings:")
        for f in report["findings"]:
            mark = "!" if f["severity"] != "info" else " "
            out.append(f" {mark} {f['id']} (trainer {f['trainer_pid']}): {f['title']}")
            if f["suggestion"]:
                out.append(f"     {f['suggestion']}")
    else:
        out.append("no findings")
    for n in report["notices"]:
        out.append(f"  n/a: {n['message']}" + (f" ({n['fix']})" if n.get("fix") else ""))
    out.append("")
    out.append("(--json or -o FILE.json for the report's JSON)")
    return "\n".join(out) + "\n"
