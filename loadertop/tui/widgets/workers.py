"""The workers table: the trainer's main process and pin-memory thread, then each worker.
Cells are updated only where their text changed: a full redraw each tick costs CPU."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ...fields import WORKER_FIELDS, human_age, human_bytes
from ...model import ProcessSample, TrainerSnapshot

STATE_LETTER = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "zombie": "Z",
                "exited": "X", "idle": "I"}
SORTS = ("worker", "cpu", "uss", "rss")
# Fixed widths so that columns do not jump as values change; DOING takes the rest.
WIDTHS = {"worker_id": 6, "pid": 7, "cpu_percent": 5, "uss_bytes": 6, "rss_bytes": 6, "threads": 6,
          "ctx_switches_per_s": 5, "status": 5, "age_s": 6}


def _cpu(x: float | None) -> str:
    return "n/a" if x is None else f"{x:5.1f}"


def _row(label: str, p: ProcessSample, now: float) -> list:
    csw = None
    if p.ctx_switches_voluntary_per_s is not None:
        csw = p.ctx_switches_voluntary_per_s + (p.ctx_switches_involuntary_per_s or 0.0)
    threads = "n/a" if p.threads is None else str(p.threads)
    if p.busy_threads and p.busy_threads > 1:
        threads += f"({p.busy_threads})"
    state = STATE_LETTER.get(p.status, "?")
    return [
        label,
        str(p.pid),
        Text(_cpu(p.cpu_percent), style="bold red" if (p.cpu_percent or 0) >= 90 else ""),
        human_bytes(p.uss_bytes),
        human_bytes(p.rss_bytes),
        threads,
        "n/a" if csw is None else f"{csw:.0f}",
        Text(state, style="bold red" if state in ("T", "Z", "X") else ""),
        p.doing or ("" if p.status == "exited" else "·"),
        human_age(now - p.started_at),
    ]


class WorkersTable(DataTable):
    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self.sort_by = "worker"
        self._keys: list[str] = []

    def on_mount(self) -> None:
        doing = max(14, self.app.size.width - sum(WIDTHS.values()) - 2 * len(WORKER_FIELDS) - 2)
        for f in WORKER_FIELDS:
            self.add_column(f.header, key=f.key, width=WIDTHS.get(f.key, doing))

    def rows_for(self, trainer: TrainerSnapshot, now: float) -> list[tuple[str, list]]:
        rows = [(f"main-{trainer.pid}", _row("main", trainer.main, now))]
        if trainer.pin_memory_thread:
            pin = trainer.pin_memory_cpu_percent
            rows.append((f"pin-{trainer.pid}", ["pin", str(trainer.pid), _cpu(pin), "-", "-", "1", "-", "S",
                                               "pin-memory thread", ""]))
        workers = list(trainer.workers)
        if self.sort_by == "cpu":
            workers.sort(key=lambda w: -(w.cpu_percent or 0))
        elif self.sort_by in ("uss", "rss"):
            workers.sort(key=lambda w: -(getattr(w, f"{self.sort_by}_bytes") or 0))
        else:
            workers.sort(key=lambda w: (w.worker_id if w.worker_id is not None else 10**6, w.pid))
        for i, w in enumerate(workers):
            label = f"w{w.worker_id}" if w.worker_id is not None else f"w?{i}"
            rows.append((f"w-{w.pid}-{w.started_at}", _row(label, w, now)))
        return rows

    def show(self, trainer: TrainerSnapshot | None, now: float) -> None:
        """now: the snapshot's time, so ages stay frozen on a trainer that exited."""
        rows = self.rows_for(trainer, now) if trainer is not None else []
        keys = [k for k, _ in rows]
        if keys != self._keys:
            # Rows came or went (or the order changed): rebuild, rare.
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            self._keys = keys
            return
        for key, cells in rows:
            for field, value in zip(WORKER_FIELDS, cells):
                if str(self.get_cell(key, field.key)) != str(value):
                    self.update_cell(key, field.key, value)

    def next_sort(self) -> str:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]
        return self.sort_by
