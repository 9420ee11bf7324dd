"""One recording, one answer (issue 41): the live view's header at the job's last tick at work,
`replay` at that tick, `snapshot --from`, the summary written beside a recording, `diff` and the
exporter all show the verdict the diagnoser said there. On the review's recording they gave four
answers (EXITED with no data wait, INPUT-BOUND 73 %, no findings, `num_workers unset -> 2`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from support.synth import host, snapshot, story, trainer

from loadertop import cli
from loadertop.outputs import summary
from loadertop.outputs.record import Recorder
from loadertop.rules import Diagnoser
from loadertop.tui.source import ScriptedSource


@pytest.fixture(autouse=True)
def python_ignores_sigpipe():
    """`cli.main` restores SIGPIPE's default for the command line (`snapshot | head`); in the
    test process that would end the run at the next write to a closed socket."""
    import signal

    yield
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def recording(tmp_path, at_work: int = 24, name: str = "run.ltrec"):
    """A starved job with 2 workers (py-spy read only one worker's id), then its exit."""
    def make(s: int):
        t = trainer(workers=2, worker_cpu=97.0, wait=0.73, usable=2, loaders=())
        workers = (replace(t.workers[0], worker_id=None), t.workers[1]) if s % 2 else t.workers
        t = replace(t, workers=workers)
        if s >= at_work:
            t = replace(t, status="exited", data_wait=None, workers=())
        return snapshot(s, [t], host(cpu_count=2, cpu=90.0))

    snaps = story(at_work + 3, make)
    path = tmp_path / name
    r = Recorder(str(path))
    for s in snaps:
        r.write(s)
    r.close()
    return str(path), snaps


def test_every_view_of_one_recording_gives_the_verdict_judged_at_its_last_tick_at_work(tmp_path, capsys):
    path, snaps = recording(tmp_path)
    at_work = summary.while_running(snaps)
    # The live view, as it judged the last tick at work.
    live = Diagnoser()
    for s in at_work:
        live.feed(s)
    said = live.diagnosis.verdict(at_work[-1].trainers[0])
    assert said.text.startswith("INPUT-BOUND") and not said.provisional
    # replay, stepped to that tick.
    replay = ScriptedSource(snaps)
    _, diagnosis = replay.seek(len(at_work))
    assert diagnosis.verdict(at_work[-1].trainers[0]).text == said.text
    # snapshot --from.
    assert cli.main(["snapshot", "--from", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == report["trainers"][0]["verdict"] == said.text
    # The summary beside the recording.
    text = summary.render(cli.report_of_recording(snaps), summary.ended(snaps), recording=path)
    assert f"Last verdict: **{said.text}**" in text
    # diff of the recording with itself: the same verdict, no setting changed.
    out = tmp_path / "diff.json"
    assert cli.main(["diff", path, path, "-o", str(out)]) == 0
    compared = json.loads(out.read_text())
    (t,) = compared["trainers"]
    assert t["verdict_before"] == t["verdict_after"] == said.text and t["settings"] == []
    # Markdown and HTML name the workers alike (w0, w1: the id read at any time in the window).
    md = tmp_path / "r.md"
    page = tmp_path / "r.html"
    assert cli.main(["snapshot", "--from", path, "-o", str(md)]) == 0
    assert cli.main(["snapshot", "--from", path, "-o", str(page)]) == 0
    assert "w?" not in md.read_text() and "w?" not in page.read_text()
    assert md.read_text().splitlines()[0] == f"# loadertop report: {said.text}"


def test_diff_reads_the_workers_seen_where_no_one_read_num_workers(tmp_path):
    from loadertop.outputs.diff import diff
    from loadertop.outputs.report import build_report

    hooked = story(20, lambda s: snapshot(s, [trainer(workers=2)]))
    plain = story(20, lambda s: snapshot(s, [trainer(workers=2, loaders=())]))
    both = diff(build_report(plain), build_report(hooked))
    assert both["trainers"][0]["settings"] == [], both["trainers"][0]["settings"]
    three = story(20, lambda s: snapshot(s, [trainer(workers=3, loaders=())]))
    (row,) = diff(build_report(plain), build_report(three))["trainers"][0]["settings"]
    assert (row["before"], row["after"]) == (2, 3)


def test_snapshot_on_a_terminal_prints_the_answer_and_json_when_piped(tmp_path):
    import os
    import pty
    import subprocess
    import sys

    path, _ = recording(tmp_path)
    cmd = [sys.executable, "-m", "loadertop", "snapshot", "--from", path]
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert json.loads(piped.stdout)["schema"] == "loadertop.report/2"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=follower, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = seen.decode()
    lines = text.splitlines()
    assert lines[0].startswith("loadertop: INPUT-BOUND"), text
    assert any(line.split()[:2] == ["WORKER", "PID"] for line in lines) and "w0" in text and "{" not in text


def test_record_summarises_what_it_wrote_never_its_file_read_back(tmp_path, monkeypatch, capsys):
    # The fourth review: in a folder another user can write to, a FIFO swapped in for the
    # recording hung root's `record` when it read its file back for the summary.
    from loadertop import sampler

    _, snaps = recording(tmp_path, name="unused.ltrec")

    class Replay:
        interval_s = 1.0

        def __init__(self, *a, **kw):
            pass

        def close(self):
            pass

    def ticks(sampler_, duration_s, on_snapshot, before_last=None):
        for s in snaps:
            on_snapshot(s)

    def never(path):
        raise AssertionError(f"record read {path} back")

    monkeypatch.setattr(sampler, "Sampler", Replay)
    monkeypatch.setattr(sampler, "run_ticks", ticks)
    from loadertop.cli import record_command, report_files

    monkeypatch.setattr(record_command, "check_pids", lambda pids: None)
    monkeypatch.setattr(report_files, "read_recording", never)
    out = tmp_path / "run.ltrec"
    assert cli.main(["record", "4000", "-o", str(out), "--no-stacks"]) == 0
    summary_md = (tmp_path / "run.summary.md").read_text()
    assert "Last verdict: **INPUT-BOUND" in summary_md and "the job ended" in summary_md
