"""When every watched trainer has ended: the run's summary (outputs/summary.py), kept on screen
until dismissed; the view behind it keeps the last data."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class SummaryScreen(ModalScreen):
    BINDINGS = [("escape", "app.pop_screen", "back to the view"), ("q", "app.quit", "quit")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="summary-body"):
            # Plain text: a command line or a class name is never read as markup.
            yield Static(Text(self.text + "\nescape: back to the view (s saves a report) · q: quit"))
