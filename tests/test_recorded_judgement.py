"""A recording stores each tick's judgement beside its figures (issue 41): `replay`,
`snapshot --from`, the summary and `diff` show what the recorder judged then, not what this
loadertop would judge again; a recording without one (or with one that does not read back) is
judged again, and a stored judgement's words are made printable like every other file's."""

from __future__ import annotations

import dataclasses
import json

import pytest
from support.ranks import INPUT, job_story
from support.synth import host, snapshot, story, trainer

from loadertop import cli
from loadertop.outputs import judgement, summary
from loadertop.outputs.record import Recorder, read
from loadertop.rules import Diagnoser
from loadertop.rules.diagnosis import Verdict, frozen
from loadertop.tui.source import ScriptedSource


@pytest.fixture(autouse=True)
def python_ignores_sigpipe():
    import signal

    yield
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def starved():
    return story(24, lambda s: snapshot(s, [trainer(workers=2, worker_cpu=97.0, wait=0.73, usable=2, loaders=())],
                                        host(cpu_count=2, cpu=90.0)))


def judged_story(snaps):
    diagnoser = Diagnoser()
    out = []
    for s in snaps:
        diagnoser.feed(s)
        out.append(diagnoser.diagnosis)
    return out


@pytest.mark.parametrize("snaps", [starved(), job_story(INPUT)], ids=["one trainer", "two ranks"])
def test_a_judgement_reads_back_as_it_was_made(snaps):
    for made in judged_story(snaps)[-3:]:
        stored = json.loads(json.dumps(judgement.encode(made)))  # as a recording holds it
        assert judgement.decode(stored) == made
    assert made.verdicts and made.plans and made.findings
    if len(snaps[-1].trainers) == 2:
        assert made.job_verdicts and made.jobs and judgement.decode(stored).job_verdicts == made.job_verdicts


def write(path, snaps, judged):
    r = Recorder(str(path))
    for s, d in zip(snaps, judged, strict=True):
        r.write(s, None if d is None else judgement.encode(d))
    r.close()
    return str(path)


def said_otherwise(d, text="INPUT-BOUND 41%", change="set num_workers=3 (as judged when recorded)"):
    """d with every trainer's verdict replaced: a judgement this loadertop would not make again."""
    return dataclasses.replace(d, verdicts=frozen({k: Verdict(text, "red", change=change) for k in d.verdicts}))


def test_every_view_of_a_recording_shows_the_judgement_stored_with_it(tmp_path, capsys):
    snaps = starved()
    judged = [said_otherwise(d) for d in judged_story(snaps)]
    path = write(tmp_path / "run.ltrec", snaps, judged)
    assert read(path).judged[-1] is not None
    # snapshot --from
    assert cli.main(["snapshot", "--from", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == report["trainers"][0]["verdict"] == "INPUT-BOUND 41%"
    # replay: each tick, and after a seek
    replay = ScriptedSource(snaps, judged=read(path).judged)
    for _ in range(3):
        snap, d = replay.next()
        assert d.verdict(snap.trainers[0]).change == "set num_workers=3 (as judged when recorded)"
    _, d = replay.seek(10)
    assert d.verdict(snaps[9].trainers[0]).text == "INPUT-BOUND 41%"
    assert not replay.diagnoser.diagnosis.verdicts  # every tick's judgement was stored: none made again
    # the summary and diff
    text = summary.render(cli.report_of_recording(snaps, read(path).judged), False, recording=path)
    assert "Last verdict: **INPUT-BOUND 41%**" in text
    out = tmp_path / "diff.json"
    assert cli.main(["diff", path, path, "-o", str(out)]) == 0
    (t,) = json.loads(out.read_text())["trainers"]
    assert t["verdict_before"] == t["verdict_after"] == "INPUT-BOUND 41%"


def test_a_recording_without_judgements_is_judged_again(tmp_path, capsys):
    snaps = starved()
    path = write(tmp_path / "old.ltrec", snaps, [None] * len(snaps))
    assert read(path).judged == [None] * len(snaps)
    assert cli.main(["snapshot", "--from", path, "--json"]) == 0
    expected = judged_story(snaps)[-1].verdict(snaps[-1].trainers[0]).text
    assert json.loads(capsys.readouterr().out)["verdict"] == expected != "INPUT-BOUND 41%"


def test_a_stored_judgement_is_made_printable_and_a_damaged_one_is_judged_again(tmp_path, capsys):
    snaps = starved()
    hostile = [said_otherwise(d, text="INPUT-BOUND\x1b]52;c;cHduZWQ=\x07 \x1b[2J\u202e 41%") for d in judged_story(snaps)]
    path = write(tmp_path / "hostile.ltrec", snaps, hostile)
    assert cli.main(["snapshot", "--from", path, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["verdict"]
    assert said.startswith("INPUT-BOUND") and not any(c in said for c in "\x1b\x07\u202e")
    # A verdict that is not text: that tick's judgement is none, and it is judged again.
    stored = judgement.encode(judged_story(snaps)[-1])
    stored["verdicts"][0]["verdict"]["text"] = 7
    assert judgement.decode(stored) is None
    assert judgement.decode({"version": 99}) is None and judgement.decode("INPUT-BOUND") is None


def test_the_summary_of_a_job_of_ranks_opens_with_the_jobs_verdict():
    # The bench read the live header's "OVERSUBSCRIBED on rank 1" beside a summary whose first
    # verdict was rank 0's own: a job of ranks is summarised with its own answer first.
    from loadertop.outputs.report import build_report

    report = build_report(job_story(INPUT))
    text = summary.render(report, False)
    first = next(line for line in text.splitlines() if "verdict" in line)
    assert first == f"- The job's verdict: **{report['verdict']}**." and "rank 1" in report["verdict"]
