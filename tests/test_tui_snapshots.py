"""SVG snapshots of the TUI on deterministic synthetic data (pytest-textual-snapshot).
Regenerate after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update"""

from __future__ import annotations

import pytest
from support.tui import moving, starved, wait_until

from loadertop.tui.app import LoadertopApp
from loadertop.tui.source import ScriptedSource


async def _settle(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.ended and pilot.app.ticks_shown > 0)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", [(120, 36), (80, 24)])
def test_starved_screen(snap_compare, size):
    app = LoadertopApp(ScriptedSource(starved(20), interval_s=0.01))
    assert snap_compare(app, terminal_size=size, run_before=_settle)


def test_two_trainers_screen(snap_compare):
    app = LoadertopApp(ScriptedSource(starved(20, trainers=2), interval_s=0.01))
    assert snap_compare(app, terminal_size=(120, 36), run_before=_settle)


def test_history_screen(snap_compare):
    # Data wait climbing while the GPU empties: the history panel's three lines on one time axis.
    app = LoadertopApp(ScriptedSource(moving(), interval_s=0.01))
    assert snap_compare(app, terminal_size=(120, 36), run_before=_settle)


def test_job_of_two_ranks_screen(snap_compare):
    # One job, two ranks: rank 1's loader is behind, rank 0 waits for it in the all-reduce.
    from support.ranks import INPUT, job_story

    app = LoadertopApp(ScriptedSource(job_story(INPUT, 20), interval_s=0.01))
    assert snap_compare(app, terminal_size=(120, 36), run_before=_settle)
