"""The events: workers and trainers that came and went."""

from __future__ import annotations

import datetime as dt
from collections import deque

from rich.text import Text

from ...model import Event, Snapshot, TrainerSnapshot
from .panel import Panel


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
