"""Data wait from py-spy against the job's own measurement, py-spy's CPU, and the job's slowdown.

Workloads (the built-in job) measure in-process the time they block in next(loader) and
log it with timestamps (--truth). For each workload and sampling rate, loadertop's stack
sampler records one window; the truth over the same wall-clock window is interpolated from
the log. py-spy's CPU is its rusage as our child. The slowdown is measured inside one long
run by alternating attached and detached windows and comparing the job's steps/s.

Run: python bench/data_wait_accuracy.py [--window 10] [--rates 10,20,50,100]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.probes.stacks import StackSampler  # noqa: E402

WORKLOADS = {
    # name: demo job flags (one worker: the CPU-bound item cost sets the wait)
    "starved": ["--workers", "1", "--item-ms", "6", "--batch-size", "8", "--step-ms", "10"],
    "balanced": ["--workers", "1", "--item-ms", "4", "--batch-size", "8", "--step-ms", "22"],
    "healthy": ["--workers", "2", "--batch-size", "8", "--step-ms", "60"],
}


class Job:
    def __init__(self, flags: list[str]):
        self.truth_path = Path(tempfile.mkdtemp()) / "truth.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loadertop.demo.job", "--persistent", "--duration", "900",
             "--truth", str(self.truth_path), *flags],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.truth_path.exists() or len(self.log()) < 4:
            if time.monotonic() > deadline:
                raise RuntimeError("job did not start")
            time.sleep(0.2)

    def log(self) -> list[list[float]]:
        try:
            return json.loads(self.truth_path.read_text())["log"]
        except (OSError, ValueError):
            return []

    def at(self, epoch: float) -> tuple[float, float, float]:
        """(wait_s, elapsed_s, steps) interpolated at a wall-clock time (waits for the log)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            log = self.log()
            for a, b in zip(log, log[1:], strict=False):
                if a[0] <= epoch <= b[0]:
                    k = (epoch - a[0]) / (b[0] - a[0])
                    return tuple(a[i] + k * (b[i] - a[i]) for i in (1, 2, 3))  # type: ignore[return-value]
            time.sleep(0.2)
        raise ValueError("time outside the log")

    def truth(self, start: float, end: float) -> float:
        w0, e0, _ = self.at(start)
        w1, e1, _ = self.at(end)
        return (w1 - w0) / (e1 - e0)

    def steps_per_s(self, start: float, end: float) -> float:
        _, _, s0 = self.at(start)
        _, _, s1 = self.at(end)
        return (s1 - s0) / (end - start)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_window(job: Job, window: int, rate: int):
    """One py-spy window: (estimate, truth over it, py-spy CPU as % of a core)."""
    cpu0 = children_cpu()
    sampler = StackSampler(window_s=window, rate_hz=rate, dump_interval_s=1e9)
    sampler.watch({job.proc.pid: ()})
    deadline = time.monotonic() + window + 20
    while not sampler.windows(job.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    windows = sampler.windows(job.proc.pid)
    sampler.stop_after_window()
    sampler.close()
    if not windows:
        raise RuntimeError("no window")
    start, end, dw = windows[0]
    time.sleep(0.6)  # the truth log is written every 0.5 s
    cpu = (children_cpu() - cpu0) / (end - start) * 100
    return dw.fraction, job.truth(start, end), cpu, dw.samples, start, end


def accuracy(window: int, rates: list[int], repeats: int) -> None:
    print(f"\n### Accuracy ({window} s windows, {repeats} per cell)\n")
    print("| workload | rate | truth (job's own) | loadertop | error (pts, mean / worst) | samples "
          "| py-spy CPU |")
    print("|---|---|---|---|---|---|---|")
    for name, flags in WORKLOADS.items():
        job = Job(flags)
        try:
            time.sleep(2)
            for rate in rates:
                rows = [one_window(job, window, rate) for _ in range(repeats)]
                errors = [abs(r[0] - r[1]) * 100 for r in rows]
                print(f"| {name} | {rate} Hz | {statistics.fmean(r[1] for r in rows):.1%} "
                      f"| {statistics.fmean(r[0] for r in rows):.1%} "
                      f"| {statistics.fmean(errors):.1f} / {max(errors):.1f} "
                      f"| {statistics.fmean(r[3] for r in rows):.0f} "
                      f"| {statistics.fmean(r[2] for r in rows):.2f}% |", flush=True)
        finally:
            job.stop()


def slowdown(window: int, rate: int, pairs: int) -> None:
    print(f"\n### Slowdown ({pairs} alternating pairs of {window} s windows, {rate} Hz, one run)\n")
    print("| workload | steps/s detached | steps/s attached | ratio |")
    print("|---|---|---|---|")
    for name in ("balanced", "healthy"):
        job = Job(WORKLOADS[name])
        try:
            time.sleep(2)
            detached, attached = [], []
            for _ in range(pairs):
                t0 = time.time()
                time.sleep(window)
                time.sleep(0.6)
                detached.append(job.steps_per_s(t0, t0 + window))
                *_, start, end = one_window(job, window, rate)
                attached.append(job.steps_per_s(start, end))
            d, a = statistics.fmean(detached), statistics.fmean(attached)
            print(f"| {name} | {d:.1f} | {a:.1f} | {a / d:.3f} |", flush=True)
        finally:
            job.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--rates", default="10,20,50,100")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pairs", type=int, default=4)
    args = p.parse_args()
    accuracy(args.window, [int(r) for r in args.rates.split(",")], args.repeats)
    slowdown(args.window, 10, args.pairs)


if __name__ == "__main__":
    main()
