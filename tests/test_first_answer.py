"""The first answer: a starved job named within 5 s of attaching, by the live view (py-spy's
short first look, provisional until a full window confirms it) and by `snapshot --duration 5`;
the provisional verdict is the pending findings' and never stands over a raised one."""

from __future__ import annotations

import re

import pytest
from support.synth import host, snapshot, story, trainer

from loadertop.rules import Diagnoser
from loadertop.rules.verdict import first_answer

# One worker of 25 ms items, batches of 8, a 10 ms step: the loop waits ~95 %.
STARVED = ("--workers", "1", "--item-ms", "25", "--batch-size", "8", "--step-ms", "10", "--persistent",
           "--duration", "120")


def test_a_condition_not_held_yet_is_a_provisional_verdict_then_the_verdict():
    d = Diagnoser()
    history = story(12, lambda t: snapshot(t, [trainer(workers=1, wait=0.8)], host(cpu=40.0)))
    said = []
    for snap in history:
        findings = d.feed(snap)
        said.append(first_answer(snap.trainers[0], findings, d.pending()))
    # A synthetic window is 30 s: the check holds at once. Held or not, it says INPUT-BOUND.
    assert said[-1] == ("INPUT-BOUND 80%", "red", False)
    short = Diagnoser(hold_s=60.0)
    findings = short.feed(history[0])
    assert findings == [] and [f.id for f in short.pending()] == ["input_bound"]
    assert first_answer(history[0].trainers[0], findings, short.pending()) == ("INPUT-BOUND 80%", "red", True)
    # Nothing pending, nothing raised: no provisional word.
    assert first_answer(history[0].trainers[0], [], []) == ("DATA WAIT 80%", "yellow", False)


@pytest.mark.live
async def test_the_live_view_names_a_starved_job_within_5_s_then_confirms_it(job):
    from support.tui import text_of, wait_until

    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.source import LiveSource
    from loadertop.tui.widgets.header import HeaderPanel

    j = job(*STARVED)
    j.wait_ready()
    app = LoadertopApp(LiveSource([j.pid], interval_s=0.5))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.snapshot is not None, timeout=30)
        first = app.snapshot.monotonic
        header = text_of(app, HeaderPanel).splitlines()
        assert "WATCHING" in header[1] and "measuring" in header[1], header
        await wait_until(pilot, lambda: "INPUT-BOUND" in text_of(app, HeaderPanel), timeout=30)
        # On the sampler's own clock: the tick that first showed it, from the first tick.
        assert app.snapshot.monotonic - first <= 5.0, app.snapshot.monotonic - first
        line = text_of(app, HeaderPanel).splitlines()[1]
        # The length shown is the window py-spy really sampled: 3 s asked, more where its start is slow.
        said = re.search(r"provisional .*\(first (\d+) s, confirming\)", line)
        assert said and 3 <= int(said.group(1)) <= 5, line
        # The full window after the first look confirms it: no longer provisional, same word.
        await wait_until(pilot, lambda: "provisional" not in text_of(app, HeaderPanel), timeout=40)
        assert "INPUT-BOUND" in text_of(app, HeaderPanel).splitlines()[1]
        assert any(f.id == "input_bound" for f in app.findings)


@pytest.mark.live
def test_a_five_second_snapshot_names_the_problem(job):
    from support.reports import report

    j = job(*STARVED)
    j.wait_ready()
    rep = report(j.pid, duration=5)
    assert rep["trainers"][0]["verdict"].startswith("INPUT-BOUND"), rep["trainers"][0]["verdict"]
    assert "input_bound" in {f["id"] for f in rep["findings"]}
