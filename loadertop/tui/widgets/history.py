"""The history panel: the trainer's data wait, its GPU's utilization and the host's CPU over
the last 1, 5 or 15 minutes, one line of bars each, on one time axis that ends now.

The bars are on a fixed 0-100 % scale, and each row says the range of its line beside the
value now. Each bar is a slice of the window; until the history fills the window, the lines
start part way along, where sampling began. The lines are rebuilt when a new slice begins
or a value arrives, not on every tick."""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from rich.color import Color as RichColor
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.app import RenderResult as Drawn
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from ...fields import human_percent
from ...model import Snapshot, TrainerSnapshot

WINDOWS_S = (60, 300, 900)
KEEP = 2000  # points per line: 15 minutes of 0.5 s ticks
LABEL_WIDTH = 12
VALUE_WIDTH = 22
MIN_REDRAW_S = 10.0


class Series:
    """(time, value) points of one line, oldest first; a tick with no value adds none."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, float]] = deque(maxlen=KEEP)

    def add(self, when: float, value: float | None) -> None:
        if value is not None:
            self.points.append((when, value))

    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def slices(self, now: float, window_s: float, width: int) -> list[float]:
        """The mean of each of `width` equal slices of the window ending at `now`, from the
        first slice that holds a point; a slice with none repeats the one before it."""
        if width <= 0:
            return []
        start = now - window_s
        step = window_s / width
        sums = [0.0] * width
        counts = [0] * width
        for when, value in self.points:
            if when <= start:
                continue
            i = min(width - 1, int((when - start) / step))
            sums[i] += value
            counts[i] += 1
        out: list[float] = []
        for total, n in zip(sums, counts, strict=True):
            if n:
                out.append(total / n)
            elif out:
                out.append(out[-1])
        return out


class HistoryLine(Widget):
    """A line of bars on a fixed 0-100 % scale, at the right: the part of the window before
    sampling began stays blank. Each bar is one value, several rows high on a tall terminal
    (eight steps a row), coloured between the row's low and high colours by its value, as
    Textual's Sparkline colours them; drawn here with Textual's public API only, since the
    Sparkline scales between its data's own low and high (a flat 42 % would fill the line or
    draw nothing). The widget keeps its width, so a new bar is a repaint, not a layout."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"history-line--low", "history-line--high"}
    DEFAULT_CSS = """
    HistoryLine > .history-line--low { color: $primary 30%; }
    HistoryLine > .history-line--high { color: $primary; }
    """
    BARS = "▁▂▃▄▅▆▇█"

    data: reactive[list[float]] = reactive(list, layout=False)

    def render(self) -> Drawn:
        width, height = self.size.width, max(1, self.size.height)
        values = [min(1.0, max(0.0, v)) for v in self.data][-width:]
        if not values:
            return ""
        _, base = self.background_colors
        low = (base + self.get_component_styles("history-line--low").color).rich_color
        high = (base + self.get_component_styles("history-line--high").color).rich_color
        steps = len(self.BARS) * height - 1  # a full bar is every step of every row
        styles = [Style.from_color(_blend(low, high, v)) for v in values]
        text = Text(no_wrap=True)
        for row in reversed(range(height)):  # the top row first
            text.append(("\n" if row < height - 1 else "") + " " * (width - len(values)))
            bottom, top = row * len(self.BARS), (row + 1) * len(self.BARS)
            for value, style in zip(values, styles, strict=True):
                step = int(value * steps)
                if step < bottom:
                    text.append(" ")
                else:
                    text.append("█" if step >= top else self.BARS[step % len(self.BARS)], style)
        return text


def _blend(low: RichColor, high: RichColor, share: float) -> RichColor:
    """The colour `share` of the way from low to high (RGB)."""
    if low.triplet is None or high.triplet is None:
        return high
    return RichColor.from_rgb(*(a + (b - a) * share for a, b in zip(low.triplet, high.triplet, strict=True)))


class HistoryRow(Horizontal):
    """A label, the line (right-aligned: its right end is now), the value now and the range."""

    def __init__(self, label: str, **kw) -> None:
        super().__init__(**kw)
        self.label = label
        self._line = HistoryLine()
        self._value = Static(classes="history-value")
        self._text = ""

    def compose(self) -> ComposeResult:
        yield Static(f" {self.label}", classes="history-label")
        yield self._line
        yield self._value

    def draw(self, values: list[float], now: float | None) -> None:
        """The line, the value now and the range the line spans (with the value now, which
        the line shows once its slice is over)."""
        self._line.data = values
        self._values = values
        self.show_now(now)

    def show_now(self, now: float | None) -> None:
        """The value now, at every tick: the header's (the line moves once a slice is over)."""
        values = getattr(self, "_values", [])
        text = human_percent(now).rjust(5)
        if values:
            low, high = min(*values, now if now is not None else values[0]), max(*values, now or 0.0)
            text += f"  range {low * 100:.0f}–{high * 100:.0f}%"
        if text != self._text:
            self._text = text
            self._value.update(text, layout=False)


class HistoryPanel(Vertical):
    """Data wait, GPU utilization and host CPU over a window that `w` cycles: 1, 5, 15 min."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.window_s = WINDOWS_S[1]
        self._title = Static(classes="history-title")
        self._rows = {"wait": HistoryRow("data wait", classes="wait"), "gpu": HistoryRow("GPU util", classes="gpu"),
                      "cpu": HistoryRow("host CPU", classes="cpu")}
        self._drawn: tuple | None = None
        self.reset()

    def compose(self) -> ComposeResult:
        yield self._title
        yield from self._rows.values()

    def reset(self) -> None:
        self.wait: dict[int, Series] = {}
        self.gpu: dict[int, Series] = {}
        self.cpu = Series()
        self._drawn = None

    def cycle_window(self) -> int:
        self.window_s = WINDOWS_S[(WINDOWS_S.index(self.window_s) + 1) % len(WINDOWS_S)]
        self._drawn = None
        return self.window_s

    def record(self, snap: Snapshot) -> None:
        self.cpu.add(snap.time, None if snap.host.cpu_percent is None else snap.host.cpu_percent / 100)
        for t in snap.trainers:
            dw = t.data_wait
            self.wait.setdefault(t.pid, Series()).add(snap.time, dw.fraction if dw else None)
            util = [g.utilization_percent for g in snap.gpus if g.index in t.gpus]
            self.gpu.setdefault(t.pid, Series()).add(snap.time, util[0] / 100 if util and util[0] is not None
                                                     else None)

    def render_for(self, snap: Snapshot, trainer: TrainerSnapshot | None, now: bool = False) -> None:
        """now: draw up to this snapshot whatever the cadence (paused, or a replay's end)."""
        width = max(10, self._rows["cpu"]._line.size.width or
                    (self.size.width or self.app.size.width) - LABEL_WIDTH - VALUE_WIDTH)
        lines = {"wait": self.wait.get(trainer.pid) if trainer else None,
                 "gpu": self.gpu.get(trainer.pid) if trainer else None, "cpu": self.cpu}
        # The lines and the values beside them move once a slice (window / width: 3.5 s of a
        # 5-minute window on 120 columns) is over, and at most every MIN_REDRAW_S: a redraw of
        # three 5-row lines 126 columns wide is ~6 ms of per-cell work, then
        # Textual's; the header has the values of each tick.
        # A line that got its first value is drawn at once: the header shows that value already.
        view = (trainer.pid if trainer else None, width, self.window_s,
                tuple(series is not None and bool(series.points) for series in lines.values()))
        drawn_view, drawn_slice, drawn_at = self._drawn or (None, None, float("-inf"))
        slice_no = int(snap.time // (self.window_s / width))
        if not now and view == drawn_view and (slice_no == drawn_slice or snap.time - drawn_at < MIN_REDRAW_S):
            for name, row in self._rows.items():
                series = lines[name]
                row.show_now(series.last() if series is not None else None)
            return
        self._drawn = (view, slice_no, snap.time)
        self._title.update(f" HISTORY  last {self.window_s // 60} min, now at the right  (w: 1 / 5 / 15 min)",
                           layout=False)
        for name, row in self._rows.items():
            series = lines[name]
            row.display = name != "gpu" or (series is not None and bool(series.points))  # no GPU: no GPU line
            row.draw(series.slices(snap.time, self.window_s, width) if series is not None else [],
                     series.last() if series is not None else None)
