"""The real TUI in a real terminal (tmux), as a person over SSH would run it."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest
from support.jobs import PYTHON, REPO, descendants, state, wait_for, worker_pids

# A real demo job in a real terminal (tmux).
pytestmark = [pytest.mark.live, pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")]


class Tmux:
    def __init__(self, command: str, width: int = 120, height: int = 36) -> None:
        self.name = f"lt-{uuid.uuid4().hex[:8]}"
        self.status = f"/tmp/{self.name}.status"
        wrapped = f"cd {REPO} && {command}; echo $? > {self.status}; sleep 30"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                        wrapped], check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def exit_status(self, timeout: float = 20) -> int:
        def read():
            try:
                with open(self.status) as f:
                    return f.read().strip() or None
            except OSError:
                return None

        return int(wait_for(read, timeout, what="loadertop to exit"))

    def pane_pid(self) -> int:
        out = subprocess.run(["tmux", "list-panes", "-t", self.name, "-F", "#{pane_pid}"], capture_output=True,
                             text=True).stdout
        return int(out.split()[0])

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def tmux():
    sessions = []

    def start(command: str, **kw) -> Tmux:
        t = Tmux(command, **kw)
        sessions.append(t)
        return t

    yield start
    for t in sessions:
        t.close()


def test_monitor_shows_worker_pids_and_quits_cleanly(watched_job, tmux):
    j = watched_job
    workers = j.wait_workers(2)
    term = tmux(f"{PYTHON} -m loadertop {j.pid}")
    wait_for(lambda: all(str(w) in term.screen() for w in workers), 30, what="worker PIDs on screen")
    screen = term.screen()
    assert "WORKER" in screen and "FINDINGS" in screen
    term.keys("q")
    assert term.exit_status() == 0
    assert j.proc.poll() is None, "quitting the monitor must not touch the job"


def test_demo_at_80x24_shows_the_finding_and_leaves_nothing_running(tmux):
    term = tmux(f"{PYTHON} -m loadertop demo", width=80, height=24)
    shell = term.pane_pid()

    def demo_job():
        pids = [p for p in descendants(shell) if worker_pids(p)]
        return pids[0] if pids else None

    trainer = wait_for(demo_job, 60, what="the demo job and its workers")
    started = [trainer, *worker_pids(trainer)]
    wait_for(lambda: "input_bound" in term.screen(), 60, what="the input_bound finding")
    assert "INPUT-BOUND" in term.screen()
    term.keys("q")
    assert term.exit_status() == 0
    time.sleep(0.5)
    # A zombie is dead; it waits for its (new) parent to reap it.
    alive = [p for p in started if state(p) not in (None, "Z")]
    assert alive == [], f"demo processes left running: {alive}"
