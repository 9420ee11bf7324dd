"""Overhead against peers: loadertop (headless `record` and `export`, and the TUI in tmux),
`top -b`, `glances` and `py-spy top` attached in turn to the same 8-worker job, each run
between two runs with no monitor, in one session.

For each monitor: its own CPU (the monitor and every process under it, reaped children
included, as a share of one core) and its peak RSS (the same tree), and the job's steps/s
against the mean of the unmonitored runs just before and after it. The job saturates both
CPUs of this machine (CPU-bound workers and a spinning step), so every cycle a monitor takes
shows up as lost steps.

Run: python bench/peers.py [--seconds 30] [--workers 8] [--glances PATH] [--warmup 5] [--only NAME,...]
     [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def cpu_s(root: int) -> float:
    """utime+stime of the tree, plus what its members reaped (cutime+cstime)."""
    total = 0
    for p in tree(root):
        f = _stat(p)
        if f:
            total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / TCK


def rss(root: int) -> int:
    total = 0
    for p in tree(root):
        f = _stat(p)
        if f:
            total += int(f[21]) * PAGE
    return total


def steps(truth: str) -> tuple[float, int]:
    with open(truth) as f:
        d = json.load(f)
    return d["elapsed_s"], d["steps"]


def wait_steps_after(truth: str, t: float) -> tuple[float, int]:
    """The job rewrites its truth every ~0.5 s: the first entry written at or after t."""
    while True:
        try:
            e, s = steps(truth)
            if os.path.getmtime(truth) >= t:
                return e, s
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)


def measure(truth: str, seconds: float, root: int | None) -> dict:
    t0 = time.time()
    e0, s0 = wait_steps_after(truth, t0)
    c0 = cpu_s(root) if root else 0.0
    w0 = time.monotonic()
    peak = 0
    while time.monotonic() - w0 < seconds:
        if root:
            peak = max(peak, rss(root))
        time.sleep(1.0)
    c1 = cpu_s(root) if root else 0.0
    wall = time.monotonic() - w0
    e1, s1 = wait_steps_after(truth, time.time())
    return {"steps_per_s": (s1 - s0) / (e1 - e0), "cpu_pct": 100 * (c1 - c0) / wall, "rss": peak}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--glances", default=shutil.which("glances"), help="a glances executable")
    p.add_argument("--pyspy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    p.add_argument("--warmup", type=float, default=5, help="seconds after attaching before measuring (5)")
    p.add_argument("--only", default="", help="run the monitors whose name contains one of these (comma-separated)")
    p.add_argument("--rounds", type=int, default=1, help="attach the monitors in turn this many times (1)")
    args = p.parse_args()
    py = sys.executable
    truth = tempfile.mktemp(suffix=".json")
    job = subprocess.Popen([py, "-m", "loadertop.demo.job", "--workers", str(args.workers), "--persistent",
                            "--item-ms", "6", "--batch-size", "4", "--step-ms", "10", "--truth", truth,
                            "--duration", "100000"], cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    pid = job.pid
    rec = tempfile.mktemp(suffix=".ltrec")
    monitors = {
        "loadertop record (headless, 1 s ticks, py-spy on)": (
            False, [py, "-m", "loadertop", "record", str(pid), "-o", rec]),
        "loadertop export (headless, 5 s ticks, py-spy duty cycle)": (
            False, [py, "-m", "loadertop", "export", str(pid), "--listen", "127.0.0.1:19464"]),
        "loadertop TUI in tmux (its default 2 s ticks, py-spy on)": (True, f"{py} -m loadertop {pid}"),
        "top -b -d 1": (False, ["top", "-b", "-d", "1"]),
        "glances in tmux (2 s refresh)": (True, f"{args.glances} --disable-plugin sensors,docker"),
        "py-spy top in tmux (trainer only)": (True, f"{args.pyspy} top --pid {pid}"),
    }
    rows = []
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(truth):
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        time.sleep(5)  # workers up, warm
        base = [measure(truth, args.seconds, None)]
        wanted = [w for w in args.only.split(",") if w] or [""]
        for name, (in_tmux, cmd) in list(monitors.items()) * args.rounds:
            if ("glances" in name and not args.glances) or not any(w in name for w in wanted):
                continue
            session = None
            proc = None
            if in_tmux:
                session = f"peer-{uuid.uuid4().hex[:6]}"
                subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "48",
                                f"cd {REPO} && exec {cmd}"], check=True)
                root = int(subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
                                          capture_output=True, text=True).stdout.split()[0])
            else:
                proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
                root = proc.pid
            try:
                time.sleep(args.warmup)  # past start-up: imports, the first py-spy window
                m = measure(truth, args.seconds, root)
            finally:
                if session:
                    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
                if proc:
                    os.killpg(proc.pid, signal.SIGINT)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            time.sleep(2)
            base.append(measure(truth, args.seconds, None))
            ref = (base[-2]["steps_per_s"] + base[-1]["steps_per_s"]) / 2
            rows.append((name, m["cpu_pct"], m["rss"], m["steps_per_s"] / ref))
            print(f"| {name} | {m['cpu_pct']:.2f}% | {m['rss'] / 2**20:.0f} MiB | {m['steps_per_s'] / ref:.3f} |",
                  flush=True)
        spread = [b["steps_per_s"] for b in base]
        print(f"unmonitored steps/s over the session: {min(spread):.1f} .. {max(spread):.1f} "
              f"({len(spread)} runs of {args.seconds:.0f} s)")
    finally:
        os.killpg(pid, signal.SIGKILL)
        job.wait()
        for f in (truth, rec):
            if os.path.exists(f):
                os.remove(f)


if __name__ == "__main__":
    main()
