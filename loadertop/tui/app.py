"""The live TUI. Sampling runs in a thread worker; it never overlaps itself, and it hands
the UI only the latest snapshot: when the UI falls behind, stale snapshots are dropped."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Footer

from ..model import Finding, Snapshot
from ..rules.diagnosis import Diagnosis
from ..rules.ranks import view_order
from .source import LiveSource, ScriptedSource, Source
from .widgets.events import EventsPanel
from .widgets.findings import FindingsPanel
from .widgets.header import HeaderPanel
from .widgets.history import HistoryPanel
from .widgets.overview import OverviewPanel
from .widgets.workers import WorkersTable

COMPACT_HEIGHT = 30
COMPACT_HISTORY_ROWS = 4  # its title and a line each for data wait, GPU and host CPU
INTERVALS = (0.5, 1.0, 2.0, 5.0, 10.0)
# Snapshots the live view keeps (an hour at the default 1 s), and the latest of them a saved
# report covers (`s`: five minutes at 1 s).
KEPT_SNAPSHOTS = 3600
SAVED_SNAPSHOTS = 300


class Tick(Message):
    """A new snapshot is waiting in the app's latest slot."""


class SourceEnded(Message):
    """A scripted stream has no more snapshots."""


class LoadertopApp(App):
    CSS_PATH = "loadertop.tcss"
    TITLE = "loadertop"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("p", "pause", "pause"),
        Binding("s", "save", "save report"),
        Binding("plus,equals_sign", "slower", "+ interval", show=False),
        Binding("minus", "faster", "- interval", show=False),
        Binding("tab", "next_trainer", "next trainer", priority=True),
        Binding("o", "sort", "sort"),
        Binding("w", "window", "history 1/5/15 min"),
        # Replay only: seek, step, speed.
        Binding("left", "seek(-10)", "back 10 s", show=False),
        Binding("right", "seek(10)", "forward 10 s", show=False),
        Binding("full_stop", "step", "step", show=False),
        Binding("left_square_bracket", "speed(0.5)", "slower replay", show=False),
        Binding("right_square_bracket", "speed(2)", "faster replay", show=False),
        *(Binding(str(i), f"select({i - 1})", show=False) for i in range(1, 10)),
    ]

    def __init__(self, source: Source | None = None, save_dir: str | Path = ".", on_exit=None, gpu=None,
                 connect: Callable[[list[int]], Source] | None = None) -> None:
        """connect: makes the source for the PIDs picked when no source is given (the
        command line's interval and py-spy options)."""
        super().__init__()
        self.source = source
        self._connect = connect or LiveSource
        self.save_dir = Path(save_dir)
        self.on_exit_callback = on_exit
        self._gpu = gpu
        self.history: deque[Snapshot] = deque(maxlen=KEPT_SNAPSHOTS)
        # The judgement of the snapshot on screen, made in the sampler's thread: shown, never redone.
        self.diagnosis = Diagnosis()
        self.summary_shown = False
        self.snapshot: Snapshot | None = None
        self.selected = 0
        self.paused = False
        self.ended = False
        self._latest: tuple[Snapshot, Diagnosis] | None = None
        self._latest_lock = threading.Lock()
        self._tick_pending = False
        self._stop = threading.Event()
        self.ticks_shown = 0

    @property
    def findings(self) -> list[Finding]:
        return list(self.diagnosis.findings)

    def compose(self) -> ComposeResult:
        yield HeaderPanel(id="header")
        yield HistoryPanel(id="history")
        yield OverviewPanel(id="overview")
        yield WorkersTable(id="workers")
        yield FindingsPanel(id="findings")
        yield EventsPanel(id="events")
        yield Footer()

    def on_mount(self) -> None:
        self._fit_to_size()
        if self.source is None:
            from .screens.picker import PickerScreen

            self.push_screen(PickerScreen(self.gpu_pids, self.attach))
        else:
            self.sample()

    def attach(self, pids: list[int]) -> None:
        self.source = self._connect(pids)
        self.pop_screen()
        self.sample()

    def gpu_pids(self) -> list[int]:
        from ..probes.gpu import GpuProbe

        probe = self._gpu or GpuProbe()
        gpus, _ = probe.sample()
        return [p for g in gpus for p in g.process_pids]

    # --- sampling (a thread worker) ------------------------------------------------

    @work(thread=True, exclusive=True, group="sampler")
    def sample(self) -> None:
        source = self.source
        if source is None:
            return
        lockstep = source.lockstep
        while not self._stop.is_set():
            started = time.monotonic()
            # A recording shows every snapshot: wait for the UI instead of dropping one.
            while lockstep and self._tick_pending and not self._stop.is_set():
                self._stop.wait(0.005)
            if not self.paused:
                result = source.next()
                if result is None:
                    self.post_message(SourceEnded())
                    return
                with self._latest_lock:
                    self._latest = result
                    pending, self._tick_pending = self._tick_pending, True
                if not pending:  # the UI has not taken the previous one: it will take this one
                    self.post_message(Tick())
            self._stop.wait(max(0.0, source.interval_s - (time.monotonic() - started)))

    def on_tick(self, _: Tick) -> None:
        if not self.is_running:  # a late tick while shutting down: the panels may be gone
            return
        with self._latest_lock:
            latest, self._latest = self._latest, None
            self._tick_pending = False
        if latest is None:
            return
        snap, diagnosis = latest
        self.snapshot = snap
        self.diagnosis = diagnosis
        self.history.append(snap)
        self.query_one(HistoryPanel).record(snap)
        self.query_one(EventsPanel).record(snap)
        self.query_one(FindingsPanel).record(snap, self.findings)
        for e in snap.events:
            if e.kind == "trainer_exited":
                self.notify(f"trainer {e.pid} exited; its last data stays on screen (s saves a report)",
                            severity="warning", timeout=8)
        self.refresh_view()
        self.ticks_shown += 1
        if (self.source is not None and self.source.live and not self.summary_shown and snap.trainers
                and all(t.status == "exited" for t in snap.trainers)):
            self.show_summary()

    def show_summary(self) -> None:
        """Every trainer ended: what the run did, on screen until dismissed."""
        from ..outputs import report, summary
        from ..rules import diagnosed
        from .screens.job_ended import SummaryScreen

        self.summary_shown = True
        snaps = list(self.history)[-SAVED_SNAPSHOTS:]
        running = summary.while_running(snaps)
        # The diagnosis as the job last ran (the live one has moved on to its exit).
        data = report.build_report(running, diagnosed(running).diagnosis)
        self.push_screen(SummaryScreen(summary.render(data, summary.ended(snaps))))

    def on_source_ended(self, _: SourceEnded) -> None:
        if not self.is_running:
            return
        self.ended = True
        self.refresh_view()  # the history up to the last snapshot

    def refresh_view(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        diagnosis = self.diagnosis
        trainers = view_order(snap, dict(diagnosis.jobs))
        self.selected = min(self.selected, max(0, len(trainers) - 1))
        trainer = trainers[self.selected] if trainers else None
        self.query_one(HeaderPanel).render_for(snap, trainer, diagnosis, self.paused,
                                               self.source is None or self.source.live, self.selected, len(trainers))
        self.query_one(HistoryPanel).render_for(snap, trainer, now=self.paused or self.ended)
        self.query_one(OverviewPanel).render_for(snap, diagnosis, self.selected, trainers)
        self.query_one(WorkersTable).show(trainer, snap.time)
        notices = [n for n in (*snap.notices, *diagnosis.notices)
                   if trainer is None or n.trainer_pid in (None, trainer.pid)]
        self.query_one(FindingsPanel).render_for(trainer, self.findings, notices)
        self.query_one(EventsPanel).render_for(trainer)
        self._fold_history()

    # --- layout ----------------------------------------------------------------------

    def on_resize(self, _) -> None:
        self._fit_to_size()

    def _fit_to_size(self) -> None:
        # The default screen holds the panels, whatever is shown over it (help, the picker).
        self.default_screen.set_class(self.size.height < COMPACT_HEIGHT, "compact")
        self._fold_history()

    def _fold_history(self) -> None:
        """On a short terminal the history shows, a line per row, only in the rows the
        header, workers and findings leave: it folds away first. The others' heights do not
        depend on it (they fit their content), so this settles in one layout."""
        history = self.query_one(HistoryPanel)
        if not self.default_screen.has_class("compact"):
            history.display = True
            return
        others = [w for w in self.default_screen.children if w is not history and w.display]
        used = sum(w.outer_size.height + w.styles.margin.height for w in others)
        history.display = self.size.height - used - history.styles.margin.height >= COMPACT_HISTORY_ROWS

    # --- actions ---------------------------------------------------------------------

    def action_help(self) -> None:
        from .screens.help import HelpScreen

        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.notify("paused: the screen keeps the last data" if self.paused else "sampling again")
        self.refresh_view()

    def action_next_trainer(self) -> None:
        if self.snapshot and self.snapshot.trainers:
            self.selected = (self.selected + 1) % len(self.snapshot.trainers)
            self.refresh_view()

    def action_select(self, index: int) -> None:
        if self.snapshot and index < len(self.snapshot.trainers):
            self.selected = index
            self.refresh_view()

    def action_sort(self) -> None:
        order = self.query_one(WorkersTable).next_sort()
        self.notify(f"workers sorted by {order}")
        self.refresh_view()

    def action_window(self) -> None:
        seconds = self.query_one(HistoryPanel).cycle_window()
        self.notify(f"history over the last {seconds // 60} min")
        self.refresh_view()

    def _set_interval(self, step: int) -> None:
        if self.source is None:
            return
        current = self.source.interval_s
        i = min(range(len(INTERVALS)), key=lambda k: abs(INTERVALS[k] - current))
        self.source.interval_s = INTERVALS[max(0, min(len(INTERVALS) - 1, i + step))]
        self.notify(f"sampling every {self.source.interval_s:g} s")

    def action_slower(self) -> None:
        self._set_interval(+1)

    def action_faster(self) -> None:
        self._set_interval(-1)

    # --- replay ----------------------------------------------------------------------

    def _replay(self) -> ScriptedSource | None:
        """The recording being replayed; None when watching live."""
        return self.source if isinstance(self.source, ScriptedSource) else None

    def action_seek(self, seconds: float) -> None:
        replay = self._replay()
        if replay is None or not self.snapshot:
            return
        interval = self.snapshot.interval_s or 1.0
        self._show_prefix(replay, *replay.seek(replay.position + round(seconds / interval)))

    def action_step(self) -> None:
        """One snapshot forward; pauses the replay."""
        replay = self._replay()
        if replay is None:
            return
        self.paused = True
        self._show_prefix(replay, *replay.seek(replay.position + 1))

    def action_speed(self, factor: float) -> None:
        replay = self._replay()
        if replay is not None:
            replay.interval_s = max(0.01, replay.interval_s / factor)
            self.notify(f"replay at one snapshot every {replay.interval_s:.2g} s")

    def _show_prefix(self, replay: ScriptedSource, prefix: list[Snapshot], diagnosis: Diagnosis) -> None:
        self.history.clear()
        history = self.query_one(HistoryPanel)
        events = self.query_one(EventsPanel)
        history.reset()
        events.events.clear()
        for snap in prefix:
            self.history.append(snap)
            history.record(snap)
            events.record(snap)
        self.snapshot, self.diagnosis = prefix[-1], diagnosis
        findings_panel = self.query_one(FindingsPanel)
        findings_panel.since.clear()  # a seek knows the findings at its end only: counted from there
        findings_panel.record(prefix[-1], self.findings)
        self.ended = replay.position >= len(replay.snapshots)
        self.refresh_view()
        self.notify(f"snapshot {replay.position}/{len(replay.snapshots)}", timeout=2)

    def action_save(self) -> None:
        path = self.save_report()
        if path:
            self.notify(f"report saved: {path}.json and {path}.md", timeout=10)

    def save_report(self) -> str | None:
        """JSON + Markdown of the recent history; a write error is a notification, and the
        monitor keeps everything it sampled."""
        from ..outputs import report, report_md

        if not self.history:
            self.notify("nothing sampled yet", severity="warning")
            return None
        snaps = list(self.history)[-SAVED_SNAPSHOTS:]
        data = report.build_report(snaps, self.diagnosis)
        pid = snaps[-1].jobs[0] if snaps[-1].jobs else "host"
        stem = self.save_dir / f"loadertop-{pid}-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            report.write_file(f"{stem}.json", report.to_json(data))
            report.write_file(f"{stem}.md", report_md.render(data))
        except OSError as e:
            self.notify(f"cannot save in {self.save_dir}: {e.strerror} (start loadertop in a writable folder)",
                        severity="error", timeout=10)
            return None
        return str(stem)

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    def on_unmount(self) -> None:
        self._stop.set()
        if self.source is not None:
            self.source.close()
        if self.on_exit_callback is not None:
            self.on_exit_callback()
