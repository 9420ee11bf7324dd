"""The trainers overview: each job and its ranks, the straggler first."""

from __future__ import annotations

from rich.text import Text

from ...fields import human_percent
from ...model import Snapshot, TrainerSnapshot
from ...rules.diagnosis import Diagnosis
from ...rules.ranks import Attribution, jobs_of
from ...text import count
from .panel import Panel


class OverviewPanel(Panel):
    """The job view when several trainers are watched: each job of many ranks on a line of
    its own (its verdict, the rank it waits for, what that costs), then its ranks side by
    side in the app's order (the straggler first); one row per trainer of other jobs."""

    def render_for(self, snap: Snapshot, diagnosis: Diagnosis, selected: int,
                   order: list[TrainerSnapshot] | None = None) -> None:
        order = order if order is not None else list(snap.trainers)
        compared = diagnosis.jobs
        if len(order) < 2:
            self.display = False
            return
        self.display = True
        t = Text()
        jobs = jobs_of(snap)
        told: set[str] = set()
        for i, tr in enumerate(order):
            job = compared.get(tr.job)
            if len(jobs.get(tr.job, ())) >= 2 and tr.job not in told:
                told.add(tr.job)
                self._job_line(t, tr.job, jobs[tr.job], job, diagnosis)
            said = diagnosis.verdict(tr)
            word, colour = said.text, said.colour
            marker = "▶" if i == selected else " "
            rank = f"rank {tr.rank}" if tr.rank is not None else f"job {tr.job_pid}"
            dw = tr.data_wait.fraction if tr.data_wait else None
            waits = job.wait_of(tr.rank) if job is not None and tr.rank is not None else None
            others = f"  waits for other ranks {human_percent(waits):>4}" if job is not None else ""
            workers = "worker " if len(tr.workers) == 1 else "workers"
            t.append(f"{marker}{i + 1} {rank:<8} pid {tr.pid:<8} {len(tr.workers):>2} {workers}  "
                     f"data wait {human_percent(dw):>4}{others}  ")
            t.append(word, style=f"bold {colour}")
            t.append("\n")
        self.show(t)

    @staticmethod
    def _job_line(t: Text, name: str, trainers: list[TrainerSnapshot], job: Attribution | None,
                  diagnosis: Diagnosis) -> None:
        said = diagnosis.job_verdicts.get(name)
        word, colour = (said.text, said.colour) if said is not None else ("WATCHING", "cyan")
        seen = len(trainers)
        size = job.world_size if job is not None else None
        of = f"{seen} of {size} ranks seen" if size and size != seen else count(seen, "rank")
        t.append(f" JOB {name[:40]}  {of}  ", style="bold")
        t.append(word, style=f"bold reverse {colour}")
        if job is not None and job.straggler is not None:
            t.append(f"  the others wait {human_percent(job.cost)} for it", style=colour)
        elif job is not None and job.balanced:
            t.append("  no rank waits for another", style="dim")
        t.append("\n")
