"""`loadertop fleet --prometheus URL` in a terminal: every job of the fleet, worst first, and the
selected job's ranks across nodes side by side. The reading runs in a thread worker and never
overlaps itself; an error is one line at the top, and the rows already shown stay."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable, Footer, Static

from ..outputs import fleet
from ..probes.prometheus import FleetError, Prometheus


class FleetRead(Message):
    def __init__(self, report: dict | None, error: str | None) -> None:
        super().__init__()
        self.report = report
        self.error = error


class HistoryRead(Message):
    def __init__(self, job: str, history: dict[tuple[str, int | None], list[float | None]]) -> None:
        super().__init__()
        self.job = job
        self.history = history


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


BARS = "▁▂▃▄▅▆▇█"



def sparkline(points: list[float | None] | None, width: int = 20) -> str:
    """A rank's data wait over the last half hour (0 to 100 %), newest on the right."""
    if not points:
        return ""
    step = max(1, len(points) // width)
    out = []
    for i in range(0, len(points), step):
        seen = [p for p in points[i : i + step] if p is not None]
        out.append(" " if not seen else BARS[min(len(BARS) - 1, int(max(seen) * len(BARS)))])
    return "".join(out)


class FleetApp(App):
    CSS_PATH = "fleet_view.tcss"
    TITLE = "loadertop fleet"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "quit"), Binding("r", "reload", "read now")]

    def __init__(self, prometheus: Prometheus, interval_s: float = 10.0) -> None:
        super().__init__()
        self.prometheus = prometheus
        self.interval_s = interval_s
        self.report: dict | None = None
        self.error: str | None = None
        self.reads = 0
        self._reading = False
        # The selected job's ranks' data wait over the last half hour, from a range query.
        self.history: dict[str, dict[tuple[str, int | None], list[float | None]]] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
        yield Static(id="ranks")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#jobs", DataTable)
        table.add_columns("JOB", "VERDICT", "NODES", "RANKS", "STRAGGLER", "COSTS", "STALE")
        self.set_interval(self.interval_s, self.action_reload)
        self.action_reload()

    def action_reload(self) -> None:
        if not self._reading:
            self._reading = True
            self._read()

    @work(thread=True, exclusive=True, group="fleet")
    def _read(self) -> None:
        try:
            self.post_message(FleetRead(fleet.read(self.prometheus), None))
        except FleetError as e:
            self.post_message(FleetRead(None, str(e)))
        except Exception as e:  # noqa: BLE001 (the view stays; the next read may work)
            self.post_message(FleetRead(None, f"{type(e).__name__}: {e}"))

    def on_fleet_read(self, message: FleetRead) -> None:
        self._reading = False
        self.reads += 1
        self.error = message.error
        if message.report is not None:
            self.report = message.report
            self._fill()
        self._status()

    def _status(self) -> None:
        t = Text()
        t.append(" loadertop fleet ", style="bold reverse")
        report = self.report
        if report is not None:
            t.append(f"  {fleet.count(len(report['jobs']), 'job')} on {fleet.count(len(report['nodes']), 'node')}  "
                     f"{self.prometheus.url}  "
                     f"read {report['created_at']}")
        if self.error:
            t.append("\n n/a: " + self.error, style="bold red")
        stale = [n for n in (report or {}).get("nodes", []) if n["stale"]]
        for n in stale:
            t.append(f"\n node {n['node']}: STALE, last reported {n['age_s']:.0f} s ago", style="yellow")
        self.query_one("#status", Static).update(t)

    def _fill(self) -> None:
        table = self.query_one("#jobs", DataTable)
        row = table.cursor_row
        table.clear()
        for job in (self.report or {}).get("jobs", []):
            s = job["straggler"]
            # Text, never markup: the labels are what any scraped target wrote.
            cells = (job["job"][:48], job["verdict"], str(len(job["nodes"])), job["seen"],
                     f"rank {s['rank']} on {s['node']}" if s else "-", _pct(s["cost_fraction"]) if s else "-",
                     ", ".join(job["stale_nodes"]) or "-")
            table.add_row(*(Text(c) for c in cells), key=job["job"])
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))
        self._show_ranks()

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self._show_ranks()

    def _selected(self) -> dict | None:
        table = self.query_one("#jobs", DataTable)
        jobs = (self.report or {}).get("jobs", [])
        return jobs[table.cursor_row] if jobs and table.cursor_row < len(jobs) else None

    @work(thread=True, exclusive=True, group="history")
    def _read_history(self, job: str) -> None:
        try:  # the job's figures came with the fleet's read: only its history is read here
            self.post_message(HistoryRead(job, fleet.history(self.prometheus, job)))
        except Exception:  # noqa: BLE001 (history is extra: the rows stay without it)
            return

    def on_history_read(self, message: HistoryRead) -> None:
        self.history[message.job] = message.history
        self._show_ranks(fetch=False)

    def _show_ranks(self, fetch: bool = True) -> None:
        jobs = (self.report or {}).get("jobs", [])
        panel = self.query_one("#ranks", Static)
        job = self._selected()
        if job is None:
            panel.update(" no job reported yet" if not jobs else "")
            return
        if fetch:
            self._read_history(job["job"])
        history = self.history.get(job["job"], {})
        t = Text()
        t.append(f" {job['job']}: ", style="bold")
        t.append(job["verdict"], style="bold reverse red" if job["straggler"] else "bold")
        t.append(f"  {job['seen']} on {fleet.count(len(job['nodes']), 'node')}\n")
        head = f" {'RANK':>5} {'NODE':<16} {'DATA WAIT':>9} {'WAITS FOR RANKS':>15} {'WORKERS':>7} {'CPU%':>5}"
        t.append(head + f"  {'WAIT, 30 MIN':<20}  VERDICT\n", style="bold")
        for r in job["ranks"]:
            rank = "-" if r["rank"] is None else str(r["rank"])
            cpu = "n/a" if r["cpu_percent"] is None else f"{r['cpu_percent']:.0f}"
            workers = "n/a" if r["workers"] is None else str(r["workers"])
            t.append(f" {rank:>5} {r['node'][:16]:<16} {_pct(r['data_wait_fraction']):>9} "
                     f"{_pct(r['wait_for_ranks_fraction']):>15} {workers:>7} {cpu:>5}  ")
            t.append(f"{sparkline(history.get((r['node'], r['rank']))):<20}", style="cyan")
            t.append(f"  {r['verdict']}")
            if r["findings"]:
                t.append(f"  [{', '.join(r['findings'])}]", style="dim")
            t.append("\n")
        panel.update(t)
