"""No PID given: list the training processes on this machine; Enter attaches."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ...candidates import find_trainers


class PickerScreen(Screen):
    """Knows the app only by the two things it asks of it (the app starts this screen)."""

    BINDINGS = [("q", "app.quit", "quit"), ("r", "refresh", "refresh")]

    def __init__(self, gpu_pids: Callable[[], list[int]], attach: Callable[[list[int]], None]) -> None:
        super().__init__()
        self._gpu_pids = gpu_pids
        self._open = attach

    def compose(self) -> ComposeResult:
        yield Static(" [b]loadertop[/b]  training processes on this machine: Enter attaches, r refreshes",
                     id="picker-title")
        yield DataTable(cursor_type="row", id="trainers")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in ("PID", "WORKERS", "GPU", "USER", "COMMAND"):
            table.add_column(column)
        self.action_refresh()

    def action_refresh(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        found = find_trainers(self._gpu_pids())
        for t in found:
            # Text, not str: a command line like `train.py --tag [/x]` is not markup.
            table.add_row(str(t.pid), str(t.workers), "yes" if t.on_gpu else "", Text(t.user), Text(t.command[:100]),
                          key=str(t.pid))
        if not found:
            table.add_row("-", "-", "", "", "no process with DataLoader workers or a GPU context found (r: refresh)")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value and event.row_key.value.isdigit():
            self._open([int(event.row_key.value)])
