"""The workers table: the trainer's main process and pin-memory thread, then each worker,
each with its CPU over the last ticks as a trend beside the figure now.

Rendered as one block of fixed-width text lines, re-rendered only when a line changed: a
DataTable re-renders its cells on every update and cost most of the TUI's CPU at 1 Hz."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...fields import WORKER_FIELDS, row, worker_label
from ...model import ProcessSample, TrainerSnapshot

SORTS = ("worker", "cpu", "uss", "rss")
TREND_TICKS = 10
BLOCKS = " ▁▂▃▄▅▆▇█"
# (header, width, right-aligned): the report's columns, and the trend after CPU%.
COLUMNS = [c for f in WORKER_FIELDS for c in ((f.header, f.width, f.right),
                                              *((("CPU TREND", TREND_TICKS, False),) if f.key == "cpu_percent"
                                                else ()))]
TREND_AT = [f.key for f in WORKER_FIELDS].index("cpu_percent") + 1
NO_TREND = COLUMNS[:TREND_AT] + COLUMNS[TREND_AT + 1 :]
TREND_MIN_WIDTH = 100  # narrower (80 columns over SSH): the trend folds away, DOING and AGE stay


def trend(values) -> str:
    """CPU percentages as bars, a full one for a busy core (more than one core: still full)."""
    out = "".join("·" if v is None else BLOCKS[min(8, max(0, round(v / 100 * 8)))] for v in values)
    return out.rjust(TREND_TICKS)


def _read(p: ProcessSample | dict, name: str):
    return getattr(p, name) if isinstance(p, ProcessSample) else p.get(name)


def _look(p: ProcessSample | dict) -> str:
    status, cpu = _read(p, "status"), _read(p, "cpu_percent")
    if status in ("stopped", "zombie", "exited"):
        return "red"
    return "bold" if cpu is not None and cpu >= 90 else ""


class WorkersTable(VerticalScroll):
    DEFAULT_CSS = "WorkersTable > Static { width: 100%; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.sort_by = "worker"
        self.rows: list[list[str]] = []  # what is on screen, for tests and the next diff
        self._cpu: dict[tuple[str, int], deque] = {}  # (kind, pid) -> the last ticks' CPU %
        self._recorded_at: float | None = None
        self._body = Static()
        self._last: tuple | None = None
        self._row_count = -1

    def compose(self):
        yield self._body

    def rows_for(self, trainer: TrainerSnapshot, now: float) -> list[tuple[list[str], str]]:
        """Each row's cells and its style: the main process, the pin-memory thread, then the
        workers in the chosen order."""
        processes: list[tuple[str, ProcessSample | dict]] = [("main", trainer.main)]
        if trainer.pin_memory_thread:
            # A thread of the main process: only its CPU is its own.
            processes.append(("pin", {"pid": trainer.pid, "cpu_percent": trainer.pin_memory_cpu_percent,
                                      "threads": 1, "status": "sleeping", "doing": "pin-memory thread"}))
        workers = list(trainer.workers)
        if self.sort_by == "cpu":
            workers.sort(key=lambda w: -(w.cpu_percent or 0))
        elif self.sort_by in ("uss", "rss"):
            workers.sort(key=lambda w: -(getattr(w, f"{self.sort_by}_bytes") or 0))
        else:
            workers.sort(key=lambda w: (w.worker_id if w.worker_id is not None else 10**6, w.pid))
        processes += [(worker_label(w.worker_id, i), w) for i, w in enumerate(workers)]
        record = now != self._recorded_at  # one point a snapshot, however often it is shown
        self._recorded_at = now
        out = []
        for label, p in processes:
            cells = row(label, p, now)
            key = ("pin" if label == "pin" else "process", _read(p, "pid"))
            history = self._cpu.setdefault(key, deque(maxlen=TREND_TICKS))
            if record:
                history.append(_read(p, "cpu_percent"))
            cells.insert(TREND_AT, trend(history))
            out.append((cells, _look(p)))
        if record:  # forget processes that left the table
            shown = {("pin" if label == "pin" else "process", _read(p, "pid")) for label, p in processes}
            self._cpu = {k: v for k, v in self._cpu.items() if k in shown}
        return out

    def show(self, trainer: TrainerSnapshot | None, now: float) -> None:
        """now: the snapshot's time, so ages stay frozen on a trainer that exited."""
        rows = self.rows_for(trainer, now) if trainer is not None else []
        width = max(40, self.size.width or self.app.size.width)
        key = (tuple((tuple(cells), look) for cells, look in rows), width)
        if key == self._last:
            return
        self._last = key
        self.rows = [cells for cells, _ in rows]
        with_trend = width >= TREND_MIN_WIDTH
        columns = COLUMNS if with_trend else NO_TREND
        doing = max(10, width - sum(w for _, w, _ in columns) - len(columns))  # DOING takes the rest
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(self._line(columns, [header for header, _, _ in columns], doing), style="bold reverse")
        trend_from = sum(w + 1 for _, w, _ in COLUMNS[:TREND_AT])
        for cells, look in rows:
            text.append("\n")
            start = len(text)
            text.append(self._line(columns, cells if with_trend else cells[:TREND_AT] + cells[TREND_AT + 1 :], doing),
                        style=look)
            if with_trend:
                text.stylize("cyan", start + trend_from, start + trend_from + TREND_TICKS)
        self._body.update(text, layout=len(rows) != self._row_count)
        self._row_count = len(rows)

    @staticmethod
    def _line(columns: list[tuple[str, int, bool]], values: list[str], doing: int) -> str:
        out = []
        for (_, width, right), value in zip(columns, values, strict=True):
            width = width or doing
            value = value if len(value) <= width else value[: width - 1] + "…"
            out.append(value.rjust(width) if right else value.ljust(width))
        return " ".join(out)

    def next_sort(self) -> str:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]
        return self.sort_by
