"""The findings: each one's title, evidence and suggestion."""

from __future__ import annotations

import datetime as dt

from rich.text import Text

from ... import notices as N
from ...model import Finding, Snapshot, TrainerSnapshot
from .panel import Panel, hang


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
