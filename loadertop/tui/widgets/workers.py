"""The workers table: the trainer's main process and pin-memory thread, then each worker.

Rendered as one block of fixed-width text lines, re-rendered only when a line changed: a
DataTable re-renders its cells on every update and cost most of the TUI's CPU at 1 Hz."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...fields import WORKER_FIELDS, human_age, human_bytes
from ...model import ProcessSample, TrainerSnapshot

STATE_LETTER = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "zombie": "Z",
                "exited": "X", "idle": "I"}
SORTS = ("worker", "cpu", "uss", "rss")
# Fixed widths so that columns do not jump as values change; DOING takes the rest.
WIDTHS = {"worker_id": 6, "pid": 7, "cpu_percent": 6, "uss_bytes": 6, "rss_bytes": 6, "threads": 6,
          "ctx_switches_per_s": 6, "status": 5, "age_s": 6}
RIGHT = {"cpu_percent", "uss_bytes", "rss_bytes", "ctx_switches_per_s", "age_s"}


def _cpu(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def cells(label: str, p: ProcessSample, now: float) -> list[str]:
    csw = None
    if p.ctx_switches_voluntary_per_s is not None:
        csw = p.ctx_switches_voluntary_per_s + (p.ctx_switches_involuntary_per_s or 0.0)
    threads = "n/a" if p.threads is None else str(p.threads)
    if p.busy_threads and p.busy_threads > 1:
        threads += f"({p.busy_threads})"
    return [
        label,
        str(p.pid),
        _cpu(p.cpu_percent),
        human_bytes(p.uss_bytes),
        human_bytes(p.rss_bytes),
        threads,
        "n/a" if csw is None else f"{csw:.0f}",
        STATE_LETTER.get(p.status, "?"),
        p.doing or ("" if p.status == "exited" else "·"),
        human_age(now - p.started_at),
    ]


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

    def rows_for(self, trainer: TrainerSnapshot, now: float) -> list[list[str]]:
        rows = [cells("main", trainer.main, now)]
        if trainer.pin_memory_thread:
            rows.append(["pin", str(trainer.pid), _cpu(trainer.pin_memory_cpu_percent), "-", "-", "1", "-", "S",
                         "pin-memory thread", ""])
        workers = list(trainer.workers)
        if self.sort_by == "cpu":
            workers.sort(key=lambda w: -(w.cpu_percent or 0))
        elif self.sort_by in ("uss", "rss"):
            workers.sort(key=lambda w: -(getattr(w, f"{self.sort_by}_bytes") or 0))
        else:
            workers.sort(key=lambda w: (w.worker_id if w.worker_id is not None else 10**6, w.pid))
        for i, w in enumerate(workers):
            label = f"w{w.worker_id}" if w.worker_id is not None else f"w?{i}"
            rows.append(cells(label, w, now))
        return rows

    def show(self, trainer: TrainerSnapshot | None, now: float) -> None:
        """now: the snapshot's time, so ages stay frozen on a trainer that exited."""
        rows = self.rows_for(trainer, now) if trainer is not None else []
        width = max(40, self.size.width or self.app.size.width)
        key = (tuple(map(tuple, rows)), width)
        if key == self._last:
            return
        self._last = key
        self.rows = rows
        doing = max(10, width - sum(WIDTHS.values()) - len(WORKER_FIELDS))
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(self._line([f.header for f in WORKER_FIELDS], doing), style="bold reverse")
        for row in rows:
            text.append("\n")
            line = self._line(row, doing)
            hot = row[2] not in ("n/a", "-") and float(row[2]) >= 90
            dead = row[7] in ("T", "Z", "X")
            text.append(line, style="red" if dead else ("bold" if hot else ""))
        self._body.update(text, layout=len(rows) != self._row_count)
        self._row_count = len(rows)

    @staticmethod
    def _line(values: list[str], doing: int) -> str:
        out = []
        for field, value in zip(WORKER_FIELDS, values, strict=True):
            width = WIDTHS.get(field.key, doing)
            value = value if len(value) <= width else value[: width - 1] + "…"
            out.append(value.rjust(width) if field.key in RIGHT else value.ljust(width))
        return " ".join(out)

    def next_sort(self) -> str:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]
        return self.sort_by
