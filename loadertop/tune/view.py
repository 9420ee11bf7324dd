"""Progress of `loadertop tune` on stderr: a live rich panel in a terminal (setting being
measured, its rate so far, elapsed and budget, best so far), one line per setting otherwise."""

from __future__ import annotations

import sys
import time

from .grid import Config, Summary, Trial
from .result import Machine
from .runner import Progress


def _fmt(rate: float | None, metric: str) -> str:
    return "n/a" if rate is None else f"{rate:.1f} {metric}"


class LineProgress(Progress):
    """For logs and pipes: a line when a setting starts measuring and when it ends."""

    def __init__(self, metric: str, budget_s: float, stream=None) -> None:
        self.metric = metric
        self.budget_s = budget_s
        self.stream = stream or sys.stderr
        self.started_at = time.monotonic()

    def _say(self, text: str) -> None:
        print(f"tune [{time.monotonic() - self.started_at:5.0f}s] {text}", file=self.stream, flush=True)

    def planned(self, configs: list[Config], machine: Machine, window_s: float) -> None:
        self._say(f"{len(configs)} settings on {machine.cpu_share} CPUs, {self.budget_s:.0f} s budget "
                  f"(~{window_s:.0f} s measured each); Ctrl-C stops and reports")

    def started(self, config: Config, index: int, total: int, repeat: bool) -> None:
        self._say(f"{'again: ' if repeat else ''}{config.label()} ({index + 1}/{total})")

    def finished(self, trial: Trial, best: Summary | None) -> None:
        result = trial.error or _fmt(trial.rate, self.metric)
        best_text = f"; best so far {best.config.label()} {_fmt(best.rate, self.metric)}" if best else ""
        self._say(f"  {trial.config.label()}: {result}{best_text}")


class LiveProgress(Progress):
    """A rich Live panel, redrawn in place (rich comes with textual)."""

    def __init__(self, metric: str, budget_s: float) -> None:
        from rich.console import Console
        from rich.live import Live

        self.metric = metric
        self.budget_s = budget_s
        self.started_at = time.monotonic()
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=True)
        self.current = ""
        self.rate: float | None = None
        self.best = ""
        self.done: list[str] = []

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def _draw(self) -> None:
        from rich.table import Table

        grid = Table.grid(padding=(0, 2))
        elapsed = time.monotonic() - self.started_at
        budget = f"{elapsed:.0f} s of {self.budget_s:.0f} s budget  (Ctrl-C: stop and report)"
        grid.add_row("[b]loadertop tune[/b]", budget)
        grid.add_row("measuring", f"{self.current}  {_fmt(self.rate, self.metric)}")
        grid.add_row("best so far", self.best or "-")
        for line in self.done[-6:]:
            grid.add_row("", f"[dim]{line}[/dim]")
        self.live.update(grid)

    def planned(self, configs: list[Config], machine: Machine, window_s: float) -> None:
        self.done.append(f"{len(configs)} settings on {machine.cpu_share} CPUs, ~{window_s:.0f} s measured each")
        self._draw()

    def started(self, config: Config, index: int, total: int, repeat: bool) -> None:
        self.current = f"{'again: ' if repeat else ''}{config.label()} ({index + 1}/{total})"
        self.rate = None
        self._draw()

    def update(self, config: Config, rate: float | None, elapsed_s: float) -> None:
        self.rate = rate
        self._draw()

    def finished(self, trial: Trial, best: Summary | None) -> None:
        self.done.append(f"{trial.config.label()}: {trial.error or _fmt(trial.rate, self.metric)}")
        if best is not None:
            self.best = f"{best.config.label()}  {_fmt(best.rate, self.metric)}"
        self._draw()
