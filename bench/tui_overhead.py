"""The TUI's own CPU in a real terminal (tmux) attached to an 8-worker job, and the time to
first data. CPU is read from /proc for loadertop and, separately, its py-spy children
(their rusage shows in loadertop's cutime/cstime once reaped).

Run: python bench/tui_overhead.py [--seconds 60] [--warmup 3] [--workers 8]
(--warmup 40: steady state, past the first dump of each worker found on attach)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK, (int(fields[13]) + int(fields[14])) / TCK


def workers_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after first data before measuring")
    p.add_argument("--no-stacks", action="store_true")
    args = p.parse_args()
    job = subprocess.Popen([sys.executable, "-m", "loadertop.demo_job", "--workers", str(args.workers),
                            "--persistent", "--sleep-ms", "20", "--batch-size", "4", "--step-ms", "20",
                            "--duration", str(args.seconds + args.warmup + 60)], cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    try:
        deadline = time.monotonic() + 60
        while len(workers_of(job.pid)) < args.workers:
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        workers = workers_of(job.pid)
        flags = " --no-stacks" if args.no_stacks else ""
        started = time.monotonic()
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "36",
                        f"cd {REPO} && {sys.executable} -m loadertop {job.pid}{flags}"], check=True)
        first = None
        while time.monotonic() - started < 30:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                    text=True).stdout
            if all(str(w) in screen for w in workers):
                first = time.monotonic() - started
                break
            time.sleep(0.02)
        pane = int(subprocess.run(["tmux", "list-panes", "-t", name, "-F", "#{pane_pid}"], capture_output=True,
                                  text=True).stdout.split()[0])
        time.sleep(args.warmup)  # past start-up (imports, first py-spy window)
        with open(f"/proc/{pane}/task/{pane}/children") as f:
            kids = [int(k) for k in f.read().split()]
        monitor = kids[0] if kids else pane
        own0, kids0 = cpu_seconds(monitor)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        own1, kids1 = cpu_seconds(monitor)
        wall = time.monotonic() - t0
        print(f"| TUI in tmux, {args.workers} workers{' (no py-spy)' if args.no_stacks else ''} "
              f"| {100 * (own1 - own0) / wall:.2f}% | {100 * (kids1 - kids0) / wall:.2f}% "
              f"| {100 * (own1 - own0 + kids1 - kids0) / wall:.2f}% "
              f"| {first:.2f} s |" if first else "| first data not seen |")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


if __name__ == "__main__":
    main()
