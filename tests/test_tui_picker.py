"""`loadertop` with no PID: the picker lists real training processes; Enter attaches."""

from __future__ import annotations

from support.tui import text_of, wait_until

from loadertop.tui.app import LoadertopApp
from loadertop.tui.source import LiveSource
from loadertop.tui.widgets.header import HeaderPanel


async def test_the_picker_lists_the_job_and_enter_attaches(watched_job):
    j = watched_job
    # The picked job is watched with the command line's options (here a 0.5 s tick, no py-spy).
    app = LoadertopApp(None, connect=lambda pids: LiveSource(pids, interval_s=0.5, stacks=False))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.5)
        from textual.widgets import DataTable

        table = app.screen.query_one(DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        mine = [i for i, row in enumerate(rows) if row[0] == str(j.pid)]
        assert mine, rows
        assert rows[mine[0]][1] == "2"  # worker count
        table.move_cursor(row=mine[0])
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.ticks_shown > 0, timeout=20)
        assert f"pid {j.pid}" in text_of(app, HeaderPanel)
        assert isinstance(app.source, LiveSource) and app.source.interval_s == 0.5 and app.source.stacks is None
        await pilot.press("q")
