"""record -> report and record -> replay round trips on a real job; report formats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.jobs import REPO, loadertop, wait_for

from loadertop.outputs import record


def test_record_then_report_from_the_recording(watched_job, tmp_path):
    j = watched_job
    path = tmp_path / "job.ltrec"
    r = loadertop("record", str(j.pid), "-o", str(path), "--duration", "3", "--interval", "0.5", "--no-stacks")
    assert r.returncode == 0, r.stderr
    recording = record.read(str(path))
    assert recording.problem is None and len(recording.snapshots) == 7
    assert {w.pid for w in recording.snapshots[-1].trainers[0].workers} == j.wait_workers(2)
    # Each tick's judgement is stored beside it, and reads back (the views show it).
    from loadertop.outputs import judgement

    said = [judgement.decode(d) for d in recording.judged]
    assert len(said) == 7 and all(d is not None and d.verdicts for d in said)
    for suffix in (".json", ".md", ".html"):
        out = tmp_path / f"report{suffix}"
        r = loadertop("snapshot", "--from", str(path), "-o", str(out))
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        for w in recording.snapshots[-1].trainers[0].workers:
            assert str(w.pid) in text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["samples"] == 7
    assert report["verdict"] == said[-1].verdict(recording.snapshots[-1].trainers[0]).text
    html = (tmp_path / "report.html").read_text()
    assert "<svg" in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_killed_recorder_leaves_a_readable_file(watched_job, tmp_path):
    j = watched_job
    path = tmp_path / "killed.ltrec"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "record", str(j.pid), "-o", str(path),
                             "--interval", "0.2", "--no-stacks"], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: path.exists() and len(record.read(str(path)).snapshots) >= 5, 30, what="5 snapshots")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = record.read(str(path))
    assert len(got.snapshots) >= 5 and got.snapshots[0].trainers[0].pid == j.pid


def test_corrupt_and_foreign_files_are_one_line(tmp_path):
    foreign = tmp_path / "x.ltrec"
    foreign.write_text("hello")
    for args in (["snapshot", "--from", str(foreign)], ["replay", str(foreign)],
                 ["snapshot", "--from", str(tmp_path / "missing.ltrec")]):
        r = loadertop(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_report_formats_by_extension(tmp_path):
    r = loadertop("snapshot", "--from", "x.ltrec", "-o", str(tmp_path / "r.pdf"))
    assert r.returncode == 2 and ".html" in r.stderr


def test_replay_in_a_terminal(watched_job, tmp_path):
    import shutil

    if not shutil.which("tmux"):
        pytest.skip("needs tmux")
    j = watched_job
    path = tmp_path / "job.ltrec"
    assert loadertop("record", str(j.pid), "-o", str(path), "--duration", "2", "--interval", "0.5",
                     "--no-stacks").returncode == 0
    workers = {str(w.pid) for w in record.read(str(path)).snapshots[-1].trainers[0].workers}
    name = f"replay-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "36",
                    f"cd {REPO} && {sys.executable} -m loadertop replay {path}; sleep 20"], check=True)
    try:
        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

        wait_for(lambda: all(w in screen() for w in workers) and "REPLAY" in screen(), 30, what="replay")
        subprocess.run(["tmux", "send-keys", "-t", name, "q"])
        time.sleep(0.5)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
