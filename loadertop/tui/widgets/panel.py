"""A text panel that re-renders only when its text changed, and what the panels share."""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.widgets import Static

from ...model import TrainerSnapshot


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


def hang(text: str, width: int, indent: int) -> str:
    """text wrapped to width, each line after the first indented by indent."""
    lines = textwrap.wrap(text, width) or [""]
    return ("\n" + " " * indent).join(lines)
