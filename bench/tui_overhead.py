"""The TUI's own CPU in a real terminal (tmux) attached to an 8-worker job, and the time to
first data. CPU is read from /proc for loadertop and, separately, its py-spy children
(their rusage shows in loadertop's cutime/cstime once reaped). loadertop's own CPU is also
split by thread (/proc/<pid>/task/<tid>/stat, named from a py-spy dump of the monitor):
the UI (Textual's event loop and redraw), the sampler (ticks, smaps, rules), Textual's
input thread, the stack and exit watchers.

Run: python bench/tui_overhead.py [--seconds 60] [--warmup 3] [--workers 8] [--interval S] [--no-stacks]
     [--busy] [--size 160x48]
(--warmup 40: steady state, past the first dump of each worker found on attach)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TCK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (field 3 first)."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds."""
    fields = stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / TCK, (int(fields[13]) + int(fields[14])) / TCK


# Python thread names (py-spy's) -> what they do in loadertop.
THREAD_ROLES = {"MainThread": "UI", "loadertop-stacks": "stacks", "loadertop-exits": "exits",
                "textual-input": "input", "textual-output": "output"}


def thread_ticks(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = stat_fields(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def thread_roles(pid: int) -> dict[int, str]:
    """tid -> role; Textual's thread worker (named asyncio_N by its executor) is the sampler."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    dump = subprocess.run([pyspy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                          text=True).stdout
    names = {int(t): n for t, n in re.findall(r'Thread (\d+) \(\w+\): "([^"]+)"', dump)}
    return {t: THREAD_ROLES.get(n, "sampler" if n.startswith("asyncio_") else "other") for t, n in names.items()}


def workers_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after first data before measuring")
    p.add_argument("--no-stacks", action="store_true")
    p.add_argument("--interval", type=float, help="loadertop's --interval (its default when not given)")
    p.add_argument("--busy", action="store_true",
                   help="bench/peers.py's job instead: CPU-bound workers and a spinning step fill both CPUs")
    p.add_argument("--size", default="120x36", help="the terminal, COLSxROWS (peers.py uses 160x48)")
    args = p.parse_args()
    load = (["--item-ms", "6", "--batch-size", "4", "--step-ms", "10"] if args.busy
            else ["--sleep-ms", "20", "--batch-size", "4", "--step-ms", "20"])
    job = subprocess.Popen([sys.executable, "-m", "loadertop.demo.job", "--workers", str(args.workers),
                            "--persistent", *load, "--duration", str(args.seconds + args.warmup + 60)], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cols, rows = args.size.split("x")
    name = f"bench-{uuid.uuid4().hex[:6]}"
    try:
        deadline = time.monotonic() + 60
        while len(workers_of(job.pid)) < args.workers:
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        workers = workers_of(job.pid)
        flags = (" --no-stacks" if args.no_stacks else "") + (f" --interval {args.interval:g}" if args.interval else "")
        started = time.monotonic()
        # exec: the pane's process is loadertop itself (its children are py-spy runs).
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", cols, "-y", rows,
                        f"cd {REPO} && exec {sys.executable} -m loadertop {job.pid}{flags}"], check=True)
        first = None
        while time.monotonic() - started < 30:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                    text=True).stdout
            if all(str(w) in screen for w in workers):
                first = time.monotonic() - started
                break
            time.sleep(0.02)
        monitor = int(subprocess.run(["tmux", "list-panes", "-t", name, "-F", "#{pane_pid}"],
                                     capture_output=True, text=True).stdout.split()[0])
        with open(f"/proc/{monitor}/cmdline", "rb") as f:
            assert b"loadertop" in f.read(), "the pane's process is not loadertop"
        time.sleep(args.warmup)  # past start-up (imports, first py-spy window)
        roles = thread_roles(monitor)
        own0, kids0 = cpu_seconds(monitor)
        threads0 = thread_ticks(monitor)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        own1, kids1 = cpu_seconds(monitor)
        threads1 = thread_ticks(monitor)
        wall = time.monotonic() - t0
        by_role: dict[str, float] = {}
        for tid, ticks in threads1.items():
            role = roles.get(tid, "other")
            by_role[role] = by_role.get(role, 0.0) + (ticks - threads0.get(tid, 0)) / TCK
        split = ", ".join(f"{role} {100 * by_role.get(role, 0.0) / wall:.2f}%"
                          for role in ("UI", "sampler", "input", "stacks", "exits", "output", "other"))
        print(f"| TUI in tmux {args.size}, {args.workers} {'busy ' if args.busy else ''}workers{flags} "
              f"| {100 * (own1 - own0) / wall:.2f}% ({split}) | {100 * (kids1 - kids0) / wall:.2f}% "
              f"| {100 * (own1 - own0 + kids1 - kids0) / wall:.2f}% "
              f"| {first:.2f} s |" if first else "| first data not seen |")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


if __name__ == "__main__":
    main()
