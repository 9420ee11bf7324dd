"""The TUI driven by its Pilot over synthetic snapshot streams: keys, trainers, saving a
report, a target that exits, and the 80x24 layout."""

from __future__ import annotations

import datetime
import json

import pytest
from support.synth import TRAINER, data_wait, host, snapshot, story, trainer
from support.tui import moving, starved, text_of, wait_until
from textual.widgets import Static

from loadertop.rules import diagnose
from loadertop.tui.app import LoadertopApp
from loadertop.tui.source import ScriptedSource
from loadertop.tui.widgets.findings import FindingsPanel
from loadertop.tui.widgets.header import HeaderPanel
from loadertop.tui.widgets.history import HistoryLine, HistoryPanel, HistoryRow
from loadertop.tui.widgets.overview import OverviewPanel
from loadertop.tui.widgets.workers import TREND_AT, WorkersTable


async def test_starved_stream_shows_verdict_workers_and_the_fix(tmp_path):
    app = LoadertopApp(ScriptedSource(starved()), save_dir=tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        header = text_of(app, HeaderPanel).splitlines()
        assert "INPUT-BOUND 62%" in header[1]
        # Up top, without a key: the one change to make and what it is predicted to do, the
        # same words as the finding's.
        assert header[2].startswith(" → DataLoader(num_workers=2 -> 6)") and "steps/s" in header[2], header
        table = app.query_one(WorkersTable)
        pids = {row[1] for row in table.rows}
        assert {str(TRAINER), str(TRAINER + 1), str(TRAINER + 2)} <= pids
        findings = " ".join(text_of(app, FindingsPanel).split())  # wrapped lines joined
        assert "input_bound" in findings and "num_workers=2 -> 6" in findings and "steps/s" in findings
        # Findings hang: every wrapped line starts right of the id column, never under it.
        lines = text_of(app, FindingsPanel).splitlines()[1:]
        assert len(lines) > 2 and lines[0].startswith(" ! input_bound  ")
        indent = len(" ! input_bound  ")
        assert all(line[:indent].strip() == "" for line in lines[1:] if not line.startswith("   n/a")), lines


async def test_keys_pause_help_sort_and_save(tmp_path):
    app = LoadertopApp(ScriptedSource(starved()), save_dir=tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended)
        await pilot.press("p")
        assert app.paused
        await pilot.press("p")
        assert not app.paused
        await pilot.press("question_mark")
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.press("o")
        assert app.query_one(WorkersTable).sort_by == "cpu"
        await pilot.press("s")
        await pilot.pause(0.1)
        saved = sorted(tmp_path.iterdir())
        assert [p.suffix for p in saved] == [".json", ".md"]
        report = json.loads(saved[0].read_text())
        assert report["schema"] == "loadertop.report/2"
        assert [f["id"] for f in report["findings"]] == ["input_bound"]
        assert "input_bound" in saved[1].read_text()
        await pilot.press("q")


async def test_unwritable_save_folder_is_a_notification_not_a_crash(tmp_path):
    app = LoadertopApp(ScriptedSource(starved(5)), save_dir=tmp_path / "missing")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended)
        await pilot.press("s")
        await pilot.pause(0.1)
        assert any("cannot save" in n.message for n in app._notifications)
        assert len(app.history) == 5  # nothing sampled is lost


async def test_switching_trainers_with_tab_and_numbers():
    app = LoadertopApp(ScriptedSource(starved(trainers=2)))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        assert app.query_one(OverviewPanel).display
        assert f"pid {TRAINER} " in text_of(app, HeaderPanel)
        await pilot.press("tab")
        assert app.selected == 1 and f"pid {TRAINER + 1000} " in text_of(app, HeaderPanel)
        assert len(app.query_one(WorkersTable).rows) == 1 + 3
        await pilot.press("1")
        assert app.selected == 0


async def test_target_exit_keeps_the_last_data():
    app = LoadertopApp(ScriptedSource(starved(12, exit_at=8)))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        assert "EXITED" in text_of(app, HeaderPanel)
        assert len(app.query_one(WorkersTable).rows) == 3  # main + 2 workers, still shown


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_small_terminal_keeps_workers_and_findings(size):
    app = LoadertopApp(ScriptedSource(starved()))
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        compact = app.default_screen.has_class("compact")
        assert compact == (size[1] < 30)
        table = app.query_one(WorkersTable)
        assert table.region.height >= 3
        findings = app.query_one(FindingsPanel)
        assert findings.region.height >= 3 and findings.region.bottom <= size[1]


async def test_missing_data_renders_as_na():
    snaps = story(5, lambda t: snapshot(t, [trainer(worker_cpu=None, wait=data_wait(None))], host(cpu=None)))
    app = LoadertopApp(ScriptedSource(snaps))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        table = app.query_one(WorkersTable)
        assert table.rows[1][2] == "n/a"
        assert "WATCHING" in text_of(app, HeaderPanel)  # no data wait: not called healthy


async def test_replay_seek_step_and_speed():
    source = ScriptedSource(starved(40), interval_s=0.01)
    app = LoadertopApp(source)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended)
        assert "REPLAY" in text_of(app, HeaderPanel)
        await pilot.press("left")
        assert source.position == 30 and len(app.history) == 30
        await pilot.press("left", "left", "left")
        assert source.position == 1
        await pilot.press("full_stop")
        assert app.paused and source.position == 2
        await pilot.press("right")
        assert source.position == 12
        # The diagnosis is folded again up to the new position.
        assert app.findings == diagnose(source.snapshots[:12])
        assert [f.id for f in app.findings] == ["input_bound"]
        source.interval_s = 0.2
        await pilot.press("right_square_bracket")
        assert source.interval_s == 0.1


async def test_the_header_counts_the_cpus_a_quota_leaves_not_the_hosts():
    stream = story(5, lambda t: snapshot(t, [trainer(usable=2, cpu_quota=1.0)], host(cpu_count=2)))
    app = LoadertopApp(ScriptedSource(stream))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        header = text_of(app, HeaderPanel)
        assert "1 CPU usable (quota)" in header and "2 CPUs" not in header


async def test_history_draws_data_wait_gpu_and_host_cpu_on_one_time_axis_and_w_changes_the_window():
    app = LoadertopApp(ScriptedSource(moving(), interval_s=0.005))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        panel = app.query_one(HistoryPanel)
        rows = {name: row for name, row in zip(("wait", "gpu", "cpu"), panel.query(HistoryRow), strict=True)}
        assert all(row.display for row in rows.values())
        lines = {name: list(row.query_one(HistoryLine).data) for name, row in rows.items()}
        # 40 s of a 5-minute window: the lines cover its last 40 s (the rest is before sampling
        # began), all of the same length, and follow the story: wait up, GPU down, CPU up.
        width = len(lines["wait"])
        assert 0 < width < 40 and {len(v) for v in lines.values()} == {width}, lines
        assert lines["wait"][0] < 0.3 and lines["wait"][-1] > 0.7
        assert lines["gpu"][0] > 0.8 and lines["gpu"][-1] < 0.2
        assert lines["cpu"] == sorted(lines["cpu"])
        value = str(rows["wait"].query(Static).last().render())
        assert value.split()[0] == "80%" and "range" in value, value
        assert "last 5 min" in str(panel.query(Static).first().render())
        # w: 15 minutes, the same 40 s now a third as wide; then 1 minute, two thirds of the width.
        await pilot.press("w")
        await pilot.pause(0.1)
        assert "last 15 min" in str(panel.query(Static).first().render())
        assert len(rows["wait"].query_one(HistoryLine).data) < width
        await pilot.press("w")
        await pilot.pause(0.1)
        assert "last 1 min" in str(panel.query(Static).first().render())
        assert len(rows["wait"].query_one(HistoryLine).data) > width
        # Each worker's CPU as a trend: worker 0 climbs, worker 1 stays busy.
        table = app.query_one(WorkersTable)
        trends = {cells[0]: cells[TREND_AT] for cells in table.rows}
        assert trends["w0"] == "".join(sorted(trends["w0"], key=" ▁▂▃▄▅▆▇█".index)) and trends["w0"] != trends["w1"]
        assert set(trends["w1"]) == {"█"}
        # The finding says when it began: the first snapshot it showed in.
        findings = text_of(app, FindingsPanel)
        began = min(panel_since for key, panel_since in app.query_one(FindingsPanel).since.items())
        assert f"(since {datetime.datetime.fromtimestamp(began).strftime('%H:%M:%S')})" in findings


async def test_no_gpu_no_gpu_line_and_80x24_folds_the_history_and_the_trend_away():
    app = LoadertopApp(ScriptedSource(moving(with_gpu=False), interval_s=0.005))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        wait, gpu_row, cpu = app.query(HistoryRow)
        assert wait.display and cpu.display and not gpu_row.display
        assert wait.region.height >= 2 and cpu.region.height >= 2
    # 80x24 with two workers: the history keeps the rows the others leave, a line each.
    app = LoadertopApp(ScriptedSource(moving(with_gpu=False), interval_s=0.005))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        history = app.query_one(HistoryPanel)
        assert history.display and history.region.height >= 3
        assert all(row.region.height >= 1 for row in app.query(HistoryRow) if row.display)
        findings = app.query_one(FindingsPanel)
        assert findings.region.height >= 3 and findings.region.bottom <= 24
        header = str(app.query_one(WorkersTable).query_one(Static).render()).splitlines()[0]
        assert "TREND" not in header and header.rstrip().endswith("AGE"), header
    # Twelve workers leave no room: the history folds away, every worker and the findings stay.
    crowded = story(20, lambda t: snapshot(t, [trainer(workers=12, worker_cpu=97.0, wait=0.62)], host(cpu=30.0)))
    app = LoadertopApp(ScriptedSource(crowded, interval_s=0.005))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        assert not app.query_one(HistoryPanel).display
        table = app.query_one(WorkersTable)
        assert len(table.rows) == 13 and table.region.height >= 6
        findings = app.query_one(FindingsPanel)
        assert findings.region.height >= 3 and findings.region.bottom <= 24


@pytest.mark.parametrize("with_gpu", [False, True])
async def test_at_120x36_the_history_fills_the_rows_the_workers_and_findings_leave(with_gpu):
    """The demo's first screen left ten blank rows between the history and the workers when
    its lines were capped at five rows: every row is the history's or another panel's."""
    app = LoadertopApp(ScriptedSource(moving(with_gpu=with_gpu), interval_s=0.005))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0)
        await pilot.pause(0.1)
        panel = app.query_one(HistoryPanel)
        shown = [row for row in panel.query(HistoryRow) if row.display]
        assert len(shown) == (3 if with_gpu else 2)
        assert shown[-1].region.bottom == panel.region.bottom == app.query_one(WorkersTable).region.y
        assert all(row.region.height >= 5 for row in shown)
