"""The workers table: the trainer's main process and pin-memory thread, then each worker.

Rendered as one block of fixed-width text lines, re-rendered only when a line changed: a
DataTable re-renders its cells on every update and cost most of the TUI's CPU at 1 Hz."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...fields import WORKER_FIELDS, row
from ...model import ProcessSample, TrainerSnapshot

SORTS = ("worker", "cpu", "uss", "rss")
FIXED = sum(f.width for f in WORKER_FIELDS)  # DOING (width 0) takes the rest of the line


def _look(p: ProcessSample | dict) -> str:
    status = p.status if isinstance(p, ProcessSample) else p.get("status")
    cpu = p.cpu_percent if isinstance(p, ProcessSample) else p.get("cpu_percent")
    if status in ("stopped", "zombie", "exited"):
        return "red"
    return "bold" if cpu is not None and cpu >= 90 else ""


class WorkersTable(VerticalScroll):
    DEFAULT_CSS = "WorkersTable > Static { width: 100%; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.sort_by = "worker"
        self.rows: list[list[str]] = []  # what is on screen, for tests and the next diff
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
        processes += [(f"w{w.worker_id}" if w.worker_id is not None else f"w?{i}", w) for i, w in enumerate(workers)]
        return [(row(label, p, now), _look(p)) for label, p in processes]

    def show(self, trainer: TrainerSnapshot | None, now: float) -> None:
        """now: the snapshot's time, so ages stay frozen on a trainer that exited."""
        rows = self.rows_for(trainer, now) if trainer is not None else []
        width = max(40, self.size.width or self.app.size.width)
        key = (tuple((tuple(cells), look) for cells, look in rows), width)
        if key == self._last:
            return
        self._last = key
        self.rows = [cells for cells, _ in rows]
        doing = max(10, width - FIXED - len(WORKER_FIELDS))
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(self._line([f.header for f in WORKER_FIELDS], doing), style="bold reverse")
        for cells, look in rows:
            text.append("\n")
            text.append(self._line(cells, doing), style=look)
        self._body.update(text, layout=len(rows) != self._row_count)
        self._row_count = len(rows)

    @staticmethod
    def _line(values: list[str], doing: int) -> str:
        out = []
        for field, value in zip(WORKER_FIELDS, values, strict=True):
            width = field.width or doing
            value = value if len(value) <= width else value[: width - 1] + "…"
            out.append(value.rjust(width) if field.right else value.ljust(width))
        return " ".join(out)

    def next_sort(self) -> str:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]
        return self.sort_by
