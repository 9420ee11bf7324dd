"""The summary when a job ends: kept on screen by the live view (Pilot), printed and written
beside a recording by `record`, printed by `snapshot`; real jobs that end while watched."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.jobs import PYTHON, REPO, loadertop

pytestmark = pytest.mark.live

# A starved job that ends by itself after a few seconds.
SHORT = ("--workers", "1", "--item-ms", "25", "--batch-size", "8", "--step-ms", "10", "--persistent", "--watch")


def test_a_recording_and_a_snapshot_of_a_job_that_ends_give_its_summary(job, tmp_path):
    # One job, watched by `record` and `snapshot` at once; each outlives it and stops by itself.
    j = job(*SHORT, "--duration", "8")
    j.wait_ready()
    rec = tmp_path / "run.ltrec"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    watching = [subprocess.Popen([PYTHON, "-m", "loadertop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
                for args in (("record", str(j.pid), "-o", str(rec), "--interval", "0.5", "--no-stacks"),
                             ("snapshot", str(j.pid), "--duration", "30", "--interval", "0.5", "--json"))]
    try:
        (_, recorded), (_, snapshot) = (p.communicate(timeout=90) for p in watching)
    finally:
        for p in watching:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in watching] == [0, 0], (recorded, snapshot)
    # The snapshot prints the summary.
    assert "the job ended" in snapshot and "Last verdict" in snapshot, snapshot
    # The recording has it written beside it.
    written = (tmp_path / "run.summary.md").read_text()
    assert "the job ended" in written and "steps/s" in written and "±" in written, written
    # The verdict and the change, in the flag that set the job's worker count (`--workers 1`),
    # as the header says it; where other processes kept the CPUs busy, what the model makes of
    # that load instead (BUSY HOST; no change where they took the CPU a second worker needs).
    report = json.loads(loadertop("snapshot", "--from", str(rec), "--json").stdout)
    plan = report["trainers"][0]["plan"]
    others_busy = plan["evidence"]["other_processes_cpus"] >= 0.25 * plan["evidence"]["cpu_set"]
    assert "Last verdict: **INPUT-BOUND" in written or (others_busy and "Last verdict: **BUSY HOST" in written), \
        (written, plan["evidence"])
    if plan["change"] is None:  # only where others took the CPUs a second worker would need
        assert others_busy, plan
        assert "No setting to change" in written, written
    else:
        assert "Change `--workers 1 -> " in written, (written, plan)
    assert f"loadertop diff {rec} AFTER.ltrec" in written
    assert "Last verdict" in recorded and "summary written to" in recorded


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
