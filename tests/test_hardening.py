"""Hardening: no secret in any output (recording, exporter, screen; the report has its own
test), no shell anywhere, report files never written through a symlink, a hung py-spy, and
a long churn of workers that must leave loadertop's memory, descriptors and children flat."""

from __future__ import annotations

import ast
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.exporter import free_port, scrape
from support.jobs import REPO, descendants, loadertop, python_sleeper, state, wait_for
from support.tui import wait_until

SECRETS = ("k-secret-9", "t-secret-8", "p-secret-7", "url-secret-6", "wandb-secret-1234", "WANDB_API_KEY")


@pytest.fixture
def secret_target():
    """A process with secrets on its command line and in its environment."""
    p = subprocess.Popen(
        # A Python process (loadertop refuses one that is not Python and starts none).
        [sys.executable, "-c", "import time; time.sleep(60)", "--api-key", "k-secret-9", "--token=t-secret-8",
         "PASSWORD=p-secret-7", "https://user:url-secret-6@host/data"],
        env={"PATH": os.environ["PATH"], "WANDB_API_KEY": "wandb-secret-1234", "OMP_NUM_THREADS": "2"},
        start_new_session=True,
    )
    yield p
    p.kill()
    p.wait()


def _no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} in the {where}"


def test_secrets_never_reach_a_recording(secret_target, tmp_path):
    from loadertop.outputs.record import read

    out = tmp_path / "r.ltrec"
    r = loadertop("record", str(secret_target.pid), "-o", str(out), "--duration", "2", "--interval", "0.5",
                  "--no-stacks")
    assert r.returncode == 0, r.stderr
    snaps = read(str(out)).snapshots
    assert snaps and "--api-key" in snaps[-1].trainers[0].cmdline  # the command line is there, redacted
    _no_secret(repr(snaps), "recording")
    _no_secret(out.read_bytes().decode("latin-1"), "recording file")


@pytest.mark.live
def test_secrets_never_reach_the_exporter(secret_target):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "export", str(secret_target.pid), "--listen",
                             f"127.0.0.1:{port}", "--interval", "0.5", "--no-stacks"], cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: t if f'pid="{secret_target.pid}"' in (t := scrape(port)) else None, 30,
                        what="a scrape with the target")
        _no_secret(text, "exporter")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)


async def test_secrets_never_reach_the_screen(secret_target):
    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.source import LiveSource

    app = LoadertopApp(LiveSource([secret_target.pid], interval_s=0.5, stacks=False))
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_until(pilot, lambda: app.ticks_shown > 1, timeout=20)
        await pilot.pause(0.2)
        screen = app.export_screenshot()
        assert "--api-key" in screen  # the command line is on screen, redacted
        _no_secret(screen, "screen")
        await pilot.press("q")


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def test_no_shell_anywhere_and_subprocesses_get_argument_lists():
    for path in (REPO / "loadertop").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for call in _calls(tree):
            name = ast.unparse(call.func)
            assert name not in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"), (
                f"{path}:{call.lineno} runs a shell")
            for kw in call.keywords:
                if kw.arg == "shell":
                    assert isinstance(kw.value, ast.Constant) and kw.value.value is False, f"{path}:{call.lineno}"
            if name in ("subprocess.run", "subprocess.Popen", "subprocess.check_output") and call.args:
                assert not isinstance(call.args[0], (ast.Constant, ast.JoinedStr)), (
                    f"{path}:{call.lineno}: a command string, not an argument list")


def test_a_report_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    target = python_sleeper(seconds=30)
    try:
        r = loadertop("snapshot", str(target.pid), "--duration", "0.5", "--interval", "0.25", "--no-stacks",
                      "-o", str(link))
    finally:
        target.kill()
        target.wait()
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "report.json" in r.stderr and "symbolic link" in r.stderr
    assert victim.read_text() == "keep me"
    fallback = r.stderr.strip().rsplit("report saved to ", 1)[1]
    assert os.path.getsize(fallback) > 0  # what was sampled is kept
    os.remove(fallback)


@pytest.mark.live
def test_a_hung_py_spy_times_out_with_a_notice_and_sampling_goes_on(job):
    from loadertop.probes.stacks import StackSampler
    from loadertop.sampler import Sampler

    j = job("--workers", "1", "--persistent", "--item-ms", "5")
    j.wait_ready()
    stacks = StackSampler(window_s=1, rolling_s=30.0, dump_interval_s=60.0)
    sampler = Sampler([j.pid], interval_s=0.25, stacks=stacks)
    stopped = []
    try:
        # Freeze py-spy's record of the trainer, as a hung ptrace would.
        def frozen_record():
            sampler.tick()
            for p in descendants(os.getpid()):
                try:
                    args = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"record" in args and str(j.pid).encode() in args and state(p) not in ("T", "Z", None):
                    os.kill(p, signal.SIGSTOP)
                    stopped.append(p)
                    return p
            return None

        wait_for(frozen_record, 20, interval=0.05, what="py-spy recording the trainer")
        notices = []

        def told():
            snap = sampler.tick()
            assert snap.trainers and snap.trainers[0].main.cpu_percent is not None  # still sampling
            notices[:] = [n for n in snap.notices if "did not finish" in n.message]
            return notices

        wait_for(told, 40, interval=0.25, what="a notice about the hung py-spy")
        assert "retrying" in notices[0].message
        # The hung py-spy is killed, not left behind.
        wait_for(lambda: all(state(p) in (None, "Z") for p in stopped), 10, what="the hung py-spy gone")
    finally:
        for p in stopped:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sampler.close()  # and its stack sampler


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _open_fds() -> int:
    """The fewest open over a second: a py-spy run in flight holds pipes for a moment."""
    counts = []
    for _ in range(10):
        counts.append(len(os.listdir("/proc/self/fd")))
        time.sleep(0.1)
    return min(counts)


def _zombie_children() -> list[int]:
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] == "Z":
                out.append(int(name))
    return out


@pytest.mark.live
def test_hundreds_of_workers_churning_leave_loadertop_flat(job):
    """An hour of epoch-by-epoch respawns, compressed: one-batch epochs without persistent
    workers re-create both workers several times a second. Everything loadertop keeps per
    process must go with the process."""
    from loadertop.probes.stacks import StackSampler
    from loadertop.rules import Diagnoser
    from loadertop.sampler import History, Sampler

    j = job("--workers", "2", "--epoch-items", "8", "--batch-size", "8", "--step-ms", "1", "--duration", "300")
    j.wait_ready()
    stacks = StackSampler(window_s=2, rolling_s=20.0, dump_interval_s=0.5)
    sampler = Sampler([j.pid], interval_s=0.1, stacks=stacks)
    history = History(maxlen=200)
    diagnoser = Diagnoser()
    seen: set[tuple[int, float]] = set()
    try:
        def run(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                snap = sampler.tick()
                history.append(snap)
                diagnoser.feed(snap)
                for t in snap.trainers:
                    pids = [w.pid for w in t.workers]
                    assert len(pids) == len(set(pids)), "a worker shown twice"
                    seen.update((w.pid, w.started_at) for w in t.workers)
                time.sleep(0.1)

        run(6)  # warm: imports, caches, the first py-spy windows
        gc.collect()
        rss0, fds0, seen0 = _rss_kib(), _open_fds(), len(seen)
        run(10)
        gc.collect()
        rss1, fds1 = _rss_kib(), _open_fds()
        churned = len(seen) - seen0
        assert churned >= 40, f"only {churned} workers churned"
        assert fds1 <= fds0 + 4, (fds0, fds1)
        assert rss1 - rss0 < 6 * 1024, f"RSS grew {rss1 - rss0} KiB over {churned} workers"
        assert len(history) <= 200
        assert len(sampler.processes._prev) < 20 and len(sampler.processes.python_helpers) < 20
        # The stack thread reaps each py-spy it started as soon as it sees it exit: one that
        # has just exited may be a zombie for a moment, none may stay one.
        wait_for(lambda: _zombie_children() == [], 5, what="every py-spy reaped (none left as a zombie)")
    finally:
        sampler.close()  # and its stack sampler
