"""The summary when a job ends: kept on screen by the live view (Pilot), printed and written
beside a recording by `record`, printed by `snapshot`; real jobs that end while watched."""

from __future__ import annotations

import json

import pytest
from support.jobs import loadertop

pytestmark = pytest.mark.live

# A starved job that ends by itself after a few seconds.
SHORT = ("--workers", "1", "--item-ms", "25", "--batch-size", "8", "--step-ms", "10", "--persistent", "--watch")


def test_a_recording_of_a_job_that_ends_gets_its_summary_beside_it(job, tmp_path):
    j = job(*SHORT, "--duration", "8")
    j.wait_ready()
    rec = tmp_path / "run.ltrec"
    r = loadertop("record", str(j.pid), "-o", str(rec), "--interval", "0.5", "--no-stacks", timeout=60)
    assert r.returncode == 0, r.stderr  # it stopped by itself: the job ended
    written = (tmp_path / "run.summary.md").read_text()
    assert "the job ended" in written and "Last verdict: **INPUT-BOUND" in written, written
    assert "steps/s" in written and "±" in written, written
    # The change, in the flag that set the job's worker count (`--workers 1`), as the header
    # says it; where other processes kept the CPUs busy, what the plan made of that instead.
    report = json.loads(loadertop("snapshot", "--from", str(rec), "--json").stdout)
    plan = report["trainers"][0]["plan"]
    if plan["change"] is None:  # only where others took the CPUs a second worker would need
        assert plan["evidence"]["other_processes_cpus"] >= 0.25 * plan["evidence"]["cpu_set"], plan
        assert "No setting to change" in written, written
    else:
        assert "Change `--workers 1 -> " in written, (written, plan)
    assert f"loadertop diff {rec} AFTER.ltrec" in written
    assert "Last verdict" in r.stderr and "summary written to" in r.stderr


def test_a_snapshot_that_outlives_its_job_prints_the_summary(job):
    j = job(*SHORT, "--duration", "6")
    j.wait_ready()
    r = loadertop("snapshot", str(j.pid), "--duration", "30", "--interval", "0.5", "--json", timeout=90)
    assert r.returncode == 0, r.stderr
    assert "the job ended" in r.stderr and "Last verdict" in r.stderr, r.stderr


async def test_the_live_view_keeps_the_summary_on_screen_when_the_job_ends(job):
    from support.tui import wait_until

    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.screens.job_ended import SummaryScreen
    from loadertop.tui.source import LiveSource

    j = job(*SHORT, "--duration", "8")
    j.wait_ready()
    app = LoadertopApp(LiveSource([j.pid], interval_s=0.5))
    async with app.run_test(size=(120, 36)) as pilot:
        # Pushed, then composed: wait for its text, not only the screen.
        await wait_until(pilot, lambda: isinstance(app.screen, SummaryScreen) and bool(app.screen.query("Static")),
                         timeout=60)
        text = str(app.screen.query_one("Static").render())
        assert "the job ended" in text and "Last verdict" in text, text
        await pilot.press("escape")  # back to the view, its last data kept
        assert not isinstance(app.screen, SummaryScreen) and app.snapshot is not None
