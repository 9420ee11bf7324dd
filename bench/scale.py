"""Scale: 8 trainers x 16 workers on one machine (workers that mostly sleep: an item takes
2 s of waiting), all watched by one loadertop.

Measures, in one run:
  tick     Sampler.tick() over all 8 jobs: mean, p95 and worst wall time, and the CPU time
           of loadertop's process as a share of a core at a 1 s interval; how long until every
           worker has USS/PSS (the staggered slow cadence)
  tui      the real Textual app on a LiveSource of the 8 jobs (headless, Pilot): time from a
           key press (sort, next trainer) to the screen having processed it, while the
           sampler thread ticks at 1 s
Run: python bench/scale.py [--trainers 8] [--workers 16] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.probes.processes import ProcessSampler  # noqa: E402
from loadertop.sampler import Sampler  # noqa: E402


def workers_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return len(f.read().split())
    except OSError:
        return 0


def start_jobs(trainers: int, workers: int) -> list[subprocess.Popen]:
    jobs = []
    for _ in range(trainers):
        jobs.append(subprocess.Popen(
            [sys.executable, "-m", "loadertop.demo.job", "--workers", str(workers), "--persistent",
             "--sleep-ms", "2000", "--batch-size", "1", "--step-ms", "1", "--duration", "100000"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    deadline = time.monotonic() + 300
    while any(workers_of(j.pid) < workers for j in jobs):
        assert time.monotonic() < deadline, "jobs did not start"
        time.sleep(0.5)
    return jobs


def bench_ticks(pids: list[int], seconds: float, workers_total: int) -> None:
    processes = ProcessSampler()
    sampler = Sampler(pids, interval_s=1.0, processes=processes)
    costs, full_at, covered = [], None, 0.0
    start = time.monotonic()
    cpu0 = time.process_time()  # the tick's thread and the exit watch's, not wall time
    try:
        sampler.tick()  # first sight: no rates yet
        while time.monotonic() - start < seconds:
            t0 = time.perf_counter()
            snap = sampler.tick()
            costs.append(time.perf_counter() - t0)
            shown = [w for t in snap.trainers for w in t.workers]
            covered = sum(w.uss_bytes is not None for w in shown) / max(1, workers_total)
            if full_at is None and len(shown) == workers_total and covered == 1.0:
                full_at = time.monotonic() - start
            time.sleep(max(0.0, 1.0 - costs[-1]))
    finally:
        cpu = (time.process_time() - cpu0) / (time.monotonic() - start)
        sampler.close()
    costs.sort()
    p95 = costs[int(0.95 * (len(costs) - 1))]
    uss = f"every worker's USS after {full_at:.0f} s" if full_at is not None else (
        f"{covered:.0%} of workers with USS after {seconds:.0f} s")
    print(f"| tick, {len(pids)} trainers x {workers_total // len(pids)} workers | "
          f"mean {1000 * statistics.fmean(costs):.1f} ms | p95 {1000 * p95:.1f} ms | worst {1000 * costs[-1]:.1f} ms | "
          f"{100 * cpu:.1f}% of a core at 1 s (CPU time) | {uss} |")


async def bench_tui(pids: list[int], presses: int) -> None:
    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.source import LiveSource

    app = LoadertopApp(LiveSource(pids, interval_s=1.0, stacks=False))
    latencies = []
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while app.ticks_shown < 3:
            assert time.monotonic() < deadline, "no data"
            await pilot.pause(0.1)
        for i in range(presses):
            t0 = time.perf_counter()
            await pilot.press("o" if i % 2 else "tab")
            await pilot.pause()  # until the app has processed the key and refreshed
            latencies.append(time.perf_counter() - t0)
            await pilot.pause(0.3)
        await pilot.press("q")
    latencies.sort()
    print(f"| TUI key to screen, {len(pids)} trainers | median {1000 * statistics.median(latencies):.0f} ms | "
          f"worst {1000 * latencies[-1]:.0f} ms | {presses} presses while sampling at 1 s |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trainers", type=int, default=8)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30)
    args = p.parse_args()
    jobs = start_jobs(args.trainers, args.workers)
    try:
        pids = [j.pid for j in jobs]
        bench_ticks(pids, args.seconds, args.trainers * args.workers)
        asyncio.run(bench_tui(pids, presses=20))
    finally:
        for j in jobs:
            try:
                os.killpg(j.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            j.wait()


if __name__ == "__main__":
    main()
