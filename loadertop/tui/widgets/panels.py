"""The text panels: header with the verdict and the change to make, the trainers overview,
findings and events. Each re-renders only when its text changed."""

from __future__ import annotations

import datetime as dt
import textwrap
from collections import deque

from rich.text import Text
from textual.widgets import Static

from ... import notices as N
from ...fields import human_age, human_bytes, human_percent
from ...model import Event, Finding, Snapshot, TrainerSnapshot
from ...rules.diagnosis import Diagnosis
from ...rules.ranks import Attribution, jobs_of
from ...text import count


class Panel(Static):
    """A Static that skips updates that would not change what is on screen, and skips the
    layout pass when the number of lines stayed the same (most ticks)."""

    _last: str | None = None
    _lines: int = -1

    def show(self, content: Text | str) -> None:
        plain = content.plain if isinstance(content, Text) else content
        key = plain + (content.markup if isinstance(content, Text) else "")
        if key != self._last:
            self._last = key
            lines = plain.count("\n")
            self.update(content, layout=lines != self._lines)
            self._lines = lines


def cpus_usable(trainer: TrainerSnapshot) -> str:
    """The CPUs this trainer may use: its affinity, cut by its cgroup's quota."""
    cpus = trainer.usable_cpus
    quota = trainer.cpu_quota
    if quota is not None and (cpus is None or quota < cpus):
        return f"{quota:g} CPU{'s' if quota != 1 else ''} usable (quota)"
    return f"{cpus or '?'} CPU{'s' if cpus != 1 else ''} usable"


class HeaderPanel(Panel):
    def render_for(self, snap: Snapshot, trainer: TrainerSnapshot | None, diagnosis: Diagnosis,
                   paused: bool, live: bool, index: int, count: int) -> None:
        """The verdict and the change as the diagnoser said them this tick (never judged here)."""
        width = max(40, self.size.width or 80)
        top = Text()
        top.append(" loadertop ", style="bold reverse")
        if trainer is None:
            top.append("  waiting for a trainer…")
            self.show(top)
            return
        rank = f"  rank {trainer.rank}/{trainer.world_size}" if trainer.rank is not None else ""
        which = f"  trainer {index + 1}/{count}" if count > 1 else ""
        tail = f"  up {human_age(snap.time - trainer.started_at)}  {cpus_usable(trainer)}{which}"
        top.append(f" pid {trainer.pid}{rank}  ")
        room = width - len(top.plain) - len(tail)
        cmd = " ".join(trainer.cmdline)
        if room > 8:
            top.append(cmd if len(cmd) <= room else cmd[: room - 1] + "…", style="dim")
        top.append(tail)
        line = Text()
        said = diagnosis.verdict(trainer)
        word, colour, provisional = said.text, said.colour, said.provisional
        line.append(f" {word} ", style=f"bold reverse {colour}")
        dw = trainer.data_wait
        if provisional:
            # A first look: said at once, confirmed (or not) once it has held a full window.
            line.append(" provisional", style=f"italic {colour}")
        if said.measuring and live and trainer.status == "running":
            seen = "py-spy's first 3 s look" if dw is None else "no DataLoader seen yet"
            line.append(f"  data wait: measuring ({seen})", style="dim")
        else:
            line.append(f"  data wait {human_percent(dw.fraction if dw else None)}")
        if dw is not None and dw.source == "hook":
            line.append(" (exact, hook)", style="dim")
        elif dw is not None and dw.first_look and provisional:
            line.append(f" (first {dw.window_s:.0f} s, confirming)", style="dim")
        util = [g.utilization_percent for g in snap.gpus if g.index in trainer.gpus]
        if util and util[0] is not None:
            line.append(f"   GPU{trainer.gpus[0]} {util[0]:.0f}%")
        shm = trainer.shm
        if shm and shm.total_bytes:
            line.append(f"   shm {(shm.used_bytes or 0) / shm.total_bytes:.0%} of {human_bytes(shm.total_bytes)}")
        if snap.host.cpu_percent is not None:
            line.append(f"   host CPU {snap.host.cpu_percent:.0f}%")
        if paused:
            line.append("   PAUSED", style="bold yellow")
        if not live:
            line.append("   REPLAY", style="bold cyan")
        top.truncate(width)
        line.truncate(width)
        tune = next((loader.tune for loader in trainer.loaders if loader.tune is not None), None)
        plan = diagnosis.plan(trainer)
        change = said.change
        if tune is not None and tune.state != "off":
            # The tuner sizes the workers itself: what it does, and any change it cannot make.
            rest = plan.sentence(("threads", "shm")) if plan is not None and plan.change("threads", "shm") else ""
            todo = Text(" ⟳ " + tune.summary + (f" · {rest}" if rest else ""), style="bold cyan")
        elif change:
            todo = Text(" → " + change, style="bold green")
        elif said.why_no_change:
            # A finding with nothing to change says why not: never "no change" over it.
            todo = Text(" no setting to change: " + said.why_no_change, style="yellow")
        else:
            todo = Text(" no change to make", style="dim")
        todo.truncate(width, overflow="ellipsis")
        self.show(Text("\n").join([top, line, todo]))


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


class FindingsPanel(Panel):
    """Findings as cards: the id, the title and since when, then what to change, each text
    wrapping under itself, never under the id."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.since: dict[tuple[int | None, str], float] = {}  # (trainer, id) -> first seen, in a row

    def record(self, snap: Snapshot, findings: list[Finding]) -> None:
        keys = {(f.trainer_pid, f.id) for f in findings}
        self.since = {k: v for k, v in self.since.items() if k in keys}
        for k in keys:
            self.since.setdefault(k, snap.time)

    def render_for(self, trainer: TrainerSnapshot | None, findings: list[Finding], notices) -> None:
        t = Text()
        mine = [f for f in findings if trainer is None or f.trainer_pid in (None, trainer.pid)]
        t.append(" FINDINGS", style="bold")
        if not mine:
            waiting = trainer is not None and trainer.data_wait is None
            t.append("  none" + (" yet (data wait needs a few seconds)" if waiting else ""), style="dim")
        # A hanging indent: the text wraps under itself, never under the id column.
        column = max((len(f.id) for f in mine), default=0) + 2
        indent = 3 + column
        room = max(20, (self.size.width or 80) - indent - 1)
        for f in mine:
            style = {"critical": "bold red", "warning": "bold yellow"}.get(f.severity, "")
            t.append("\n ! " if f.severity != "info" else "\n   ", style=style)
            t.append(f"{f.id:<{column}}", style=style)
            # The clock time, not an age: the card stays the same from tick to tick (no redraw).
            began = self.since.get((f.trainer_pid, f.id))
            when = f" (since {dt.datetime.fromtimestamp(began).strftime('%H:%M:%S')})" if began is not None else ""
            t.append(hang(f.title + when, room, indent))
            t.append("\n" + " " * indent)
            t.append(hang(f.suggestion, room, indent), style="green")
        shown = [n for n in notices if n.id not in (N.NO_GPU,)][:2]
        for n in shown:
            t.append(f"\n   n/a: {n.message}", style="dim")
        self.show(t)


def hang(text: str, width: int, indent: int) -> str:
    """text wrapped to width, each line after the first indented by indent."""
    lines = textwrap.wrap(text, width) or [""]
    return ("\n" + " " * indent).join(lines)


class EventsPanel(Panel):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.events: deque[Event] = deque(maxlen=200)

    def record(self, snap: Snapshot) -> None:
        self.events.extend(snap.events)

    def render_for(self, trainer: TrainerSnapshot | None, lines: int = 3) -> None:
        mine = [e for e in self.events if trainer is None or e.trainer_pid == trainer.pid]
        t = Text(" EVENTS", style="bold")
        for e in mine[-lines:]:
            when = dt.datetime.fromtimestamp(e.time).strftime("%H:%M:%S")
            what = e.kind.replace("_", " ")
            detail = f" ({e.detail})" if e.detail and e.kind != "trainer_found" else ""
            style = "red" if e.exit_code not in (None, 0) or e.kind == "trainer_exited" else ""
            t.append(f"\n {when} {what} {e.pid}{detail}", style=style)
        self.show(t)
