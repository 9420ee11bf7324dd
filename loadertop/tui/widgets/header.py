"""The header: the verdict, the change to make and why, above everything else."""

from __future__ import annotations

from rich.text import Text

from ...fields import human_age, human_bytes, human_percent
from ...model import Snapshot, TrainerSnapshot
from ...rules.diagnosis import Diagnosis
from .panel import Panel, cpus_usable


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
