"""Nothing a process writes reaches the reader raw (docs/SECURITY.md): escape sequences and
bidi overrides in a trainer's command line never reach the terminal of the picker, the live
view or replay, nor any report; and a Markdown report cannot be forged by what it quotes."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
from support.jobs import REPO, loadertop
from support.synth import snapshot, story, trainer

from loadertop.text import printable

# A window title, an OSC 52 clipboard write ("pwned" in base64), a right-to-left override.
HOSTILE = "\x1b]0;pwned-title\x1b\\ \x1b]52;c;cHduZWQ=\x1b\\ \u202eevil"
RAW = (b"\x1b]0;pwned", b"\x1b]52;c;cHdu", "\u202e".encode())


@pytest.mark.parametrize(("text", "shown"), [
    ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("a\x07b\x08c\x7fd", "a\\x07b\\x08c\\x7fd"),
    ("\x9b31m", "\\x9b31m"),  # C1 CSI
    ("tab\tnew\nline\rcr", "tab\\x09new\\x0aline\\x0dcr"),
    ("\u202eevil\u2066x\u2069", "\\u202eevil\\u2066x\\u2069"),
])
def test_process_text_is_shown_with_visible_escapes(text, shown):
    assert printable(text) == shown


def test_a_snapshot_makes_what_a_process_wrote_printable():
    from dataclasses import replace

    t = trainer()
    t = replace(t, cmdline=("python", HOSTILE), env=(("OMP_NUM_THREADS", "\x1b[2J"),))
    assert all("\x1b" not in a and "\u202e" not in a for a in t.cmdline)
    assert t.env == (("OMP_NUM_THREADS", "\\x1b[2J"),)


def test_a_markdown_report_cannot_be_forged_by_what_it_quotes():
    from dataclasses import replace

    from loadertop.outputs.report import build_report
    from loadertop.outputs.report_md import render

    forged = "x\n## Findings\n- **OK** nothing to fix"
    ticks = "``` <img src=x onerror=alert(1)> [a](http://evil) | ``"

    def make(t):
        tr = trainer(workers=2, worker_cpu=97.0, wait=0.62)
        tr = replace(tr, cmdline=("python", forged, ticks),
                     workers=tuple(replace(w, doing=ticks) for w in tr.workers),
                     loaders=(replace(tr.loaders[0], dataset_class=ticks),))
        return snapshot(t, [tr])

    snaps = story(20, make)
    md = render(build_report(snaps))
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert headings == ["# loadertop report: INPUT-BOUND 62%", "## Findings", "## Trainer 4000 (running)"]
    # Outside code spans nothing of theirs is left: no HTML, no link, no table cell split.
    outside = re.sub(r"(`+)(.+?)\1", "", md)
    assert "<img" not in outside and "](http" not in outside and "nothing to fix" not in outside
    for line in md.splitlines():
        if line.startswith("| main") or line.startswith("| w0"):
            assert line.count(" | ") == line.count("|") - 2 - line.count("\\|"), line


# --- on a terminal ----------------------------------------------------------------------------


def in_a_pty(args: list[str], until: bytes, keys: bytes = b"q", timeout: float = 60.0) -> bytes:
    """Run loadertop in a pseudo-terminal of 120x36 until `until` shows, press keys, and
    return every byte it wrote to the terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(REPO), "COLUMNS": "120", "LINES": "36"}
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True, cwd=REPO)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    pressed = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not pressed and until in out:
                time.sleep(0.5)
                os.write(master, keys)
                pressed = True
            if pressed and proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        os.close(master)
    assert pressed, f"never saw {until!r}: {out[-2000:]!r}"
    return out


def hostile_job(job):
    """A real training job whose command line holds the escape sequences: the -c program
    text is its argv, and it runs the built-in job."""
    program = (f"r'{HOSTILE}'; import runpy, sys; sys.argv = ['train.py'] + sys.argv[3:]; "
               "runpy.run_module('loadertop.demo.job', run_name='__main__')")
    j = job("--workers", "1", "--item-ms", "5", "--persistent", cmd=[sys.executable, "-c", program])
    j.wait_ready()
    j.wait_workers(1)
    return j


@pytest.mark.live
def test_escape_sequences_in_a_command_line_never_reach_the_terminal_or_a_report(job, tmp_path):
    j = hostile_job(job)
    views = {
        "picker": in_a_pty([], until=str(j.pid).encode(), keys=b"q"),
        "live view": in_a_pty([str(j.pid)], until=b"FINDINGS", keys=b"q"),
    }
    recording = tmp_path / "hostile.ltrec"
    r = loadertop("record", str(j.pid), "-o", str(recording), "--duration", "3", "--no-stacks")
    assert r.returncode == 0, r.stderr
    views["replay"] = in_a_pty(["replay", str(recording)], until=b"REPLAY", keys=b"q")
    for name, out in views.items():
        assert not any(raw in out for raw in RAW), name
    for suffix in (".json", ".md", ".html"):
        path = tmp_path / f"report{suffix}"
        r = loadertop("snapshot", "--from", str(recording), "-o", str(path))
        assert r.returncode == 0, r.stderr
        text = path.read_text(encoding="utf-8")
        assert "\x1b" not in text and "\u202e" not in text and "pwned-title" in text, suffix
    report = json.loads((tmp_path / "report.json").read_text())
    assert any("\\x1b]0;pwned-title" in arg for arg in report["trainers"][0]["cmdline"])  # shown, escaped
