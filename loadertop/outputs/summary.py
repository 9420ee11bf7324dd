"""The summary of a run, from its report (pure): for each trainer, whether it ended, the last
verdict, the one change to make, and its figures over the run with their noise. Shown when a
job ends under the live view, printed and written beside a recording (`FILE.summary.md`) when
`record` stops, printed by `snapshot` when the job ended during it. Markdown that reads as
plain text in a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from ..fields import human_age
from ..model import Snapshot
from ..text import count
from .diff import FIGURES, noise_text, value_text
from .report_md import code, plan_line


def ended(snapshots: Sequence[Snapshot]) -> bool:
    """Every trainer of the last snapshot exited."""
    return bool(snapshots and snapshots[-1].trainers) and all(t.status == "exited" for t in snapshots[-1].trainers)


def while_running(snapshots: Sequence[Snapshot]) -> list[Snapshot]:
    """The snapshots up to the last one where a trainer ran its loop (running, its data wait
    measured): the summary's last verdict and change are those of the job at work, not of its
    shutdown (a loop that has closed its loader, an exited trainer's view with no plan)."""
    def at_work(s: Snapshot) -> bool:
        return any(t.status == "running" and t.data_wait is not None and t.data_wait.fraction is not None
                   for t in s.trainers)

    last = max((i for i, s in enumerate(snapshots) if at_work(s)), default=-1)
    return list(snapshots[: last + 1]) if last >= 0 else list(snapshots)


def render(report: dict, job_ended: bool, recording: str | None = None) -> str:
    """`report`: of the snapshots while the job ran (while_running); `job_ended`: it ended
    (else loadertop stopped first). A job of several ranks opens with the job's own verdict
    (the report's, as the live header says it); each rank's section then says the rank's."""
    out = []
    for job in report.get("jobs", ()):
        if job.get("ranks_seen", 0) >= 2:
            out.append(f"# loadertop summary: job {code(job['job'])}, {count(job['ranks_seen'], 'rank')} seen")
            out.append("")
            out.append(f"- The job's verdict: **{job['verdict']}**.")
            out.append("")
    for t in report["trainers"]:
        rank = f"rank {t['rank']}, " if t.get("rank") is not None else ""
        out.append(f"# loadertop summary: {rank}pid {t['pid']} {code(' '.join(t['cmdline'])[:120])}")
        out.append("")
        state = "ended" if job_ended else "still running when loadertop stopped"
        watched = f"{human_age(report['duration_s'])} ({count(report['samples'], 'snapshot')})"
        out.append(f"- The loop was watched at work for {watched}; the job {state}.")
        out.append(f"- Last verdict: **{t['verdict']}**.")
        change = plan_line(t)
        if change:
            out.append(f"- {change}")
        figures = t.get("figures") or {}
        said = []
        for key, label, _ in FIGURES:
            f = figures.get(key) or {}
            if f.get("value") is not None:
                said.append(f"{label} {value_text(key, f['value'])}{noise_text(key, f.get('stderr'))}")
        shm = t.get("shm") or {}
        if shm.get("peak_used_bytes") is not None:
            said.append(f"/dev/shm peak {value_text('shm_used_bytes', shm['peak_used_bytes'])}")
        if said:
            out.append(f"- Over the run (± one standard error): {'; '.join(said)}.")
        mine = [f["id"] for f in report["findings"] if f.get("trainer_pid") == t["pid"] and f["severity"] != "info"]
        out.append(f"- Findings at the end: {', '.join(map(code, mine)) or 'none'}.")
        out.append("")
    if recording:
        out.append(f"After a change, compare the two runs: {code(f'loadertop diff {recording} AFTER.ltrec')}")
        out.append("")
    return "\n".join(out)
