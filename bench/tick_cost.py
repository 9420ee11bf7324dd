"""Cost of one sampler tick against the floor of reading /proc/<pid>/stat + status raw.

For each worker count, a real training job (workers that mostly sleep) is started; then,
side by side in one process and interleaved round by round:
  floor   open, read and close /proc/<pid>/stat and /proc/<pid>/status of the trainer and
          every worker (the issue's floor)
  pread   the same two files kept open and re-read with pread: what the sampler does
  cheap   a full Sampler.tick() with the slow cadence switched off (discovery, the trainer's
          threads for the pin-memory thread, host, shm, rates)
  full    Sampler.tick() as shipped: smaps/maps/threads refreshed on the staggered cadence
and the slow part of those full ticks alone (mean and worst tick), measured after a first
pass in which every process is read once (reported apart: it runs on a boosted credit).
floor, pread and cheap take the fastest of 5 back-to-back calls per round (the machine is
shared and noisy); full is one call per round, as a tick really runs. The last lines fit
cost = fixed + per process × processes over all counts (least squares).
Run: python bench/tick_cost.py [--counts 1,8,32,128] [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.probes.gpu import GpuProbe  # noqa: E402
from loadertop.probes.processes import ProcessSampler  # noqa: E402
from loadertop.sampler import Sampler  # noqa: E402


def workers_of(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for c in f.read().split():
                with open(f"/proc/{c}/comm") as g:
                    if g.read().strip() == "pt_data_worker":
                        out.append(int(c))
    return out


def _raw(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def floor_read(pids: list[int]) -> None:
    """The floor: the two files, read raw, with no parsing at all."""
    for pid in pids:
        _raw(f"/proc/{pid}/stat")
        _raw(f"/proc/{pid}/status")


class KeptOpen:
    """The floor with the files kept open, as the sampler keeps them."""

    def __init__(self, pids: list[int]) -> None:
        self.fds = [os.open(f"/proc/{pid}/{name}", os.O_RDONLY) for pid in pids for name in ("stat", "status")]

    def read(self) -> None:
        for fd in self.fds:
            os.pread(fd, 65536, 0)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def timed(fn, *args, repeat: int = 1) -> float:
    """The fastest of `repeat` back-to-back calls: the cost without cold caches or preemption."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


class NoGpu:
    def nvmlInit(self):
        raise ImportError


def measure(n: int, rounds: int) -> dict:
    cmd = [sys.executable, "-m", "loadertop.demo.job", "--workers", str(n), "--persistent",
           "--sleep-ms", "2000", "--step-ms", "1", "--batch-size", "1", "--duration", "600"]
    job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(workers_of(job.pid)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers did not start")
            time.sleep(0.2)
        time.sleep(1.0)
        pids = [job.pid, *workers_of(job.pid)]
        cheap = Sampler([job.pid], gpu=GpuProbe(lib=NoGpu()),
                        processes=ProcessSampler(slow_interval_s=1e9, slow_budget_s=0.0))
        full = Sampler([job.pid], gpu=GpuProbe(lib=NoGpu()))
        cheap.processes.refresh_slow = lambda *a, **k: None  # cadence off: cheap fields only
        slow_t: list[float] = []
        refresh = full.processes.refresh_slow

        def timed_refresh(*a, **k):
            started = time.perf_counter()
            refresh(*a, **k)
            slow_t.append(time.perf_counter() - started)

        full.processes.refresh_slow = timed_refresh
        # The first pass after attach: every process read once (with the first-read boost).
        fill_started = time.monotonic()
        while not all(p.uss_bytes is not None for t in full.tick().trainers for p in (t.main, *t.workers)):
            time.sleep(0.05)
        fill_s, fill_ticks, fill_slow = time.monotonic() - fill_started, len(slow_t), slow_t[:]
        slow_t.clear()
        kept = KeptOpen(pids)
        floor_t, pread_t, cheap_t, full_t = [], [], [], []
        for _ in range(rounds):
            floor_t.append(timed(floor_read, pids, repeat=5))
            pread_t.append(timed(kept.read, repeat=5))
            cheap_t.append(timed(cheap.tick, repeat=5))
            full_t.append(timed(full.tick))
            time.sleep(0.05)
        kept.close()
        full.close()
        cheap.close()
        rss = sum(int(_raw(f"/proc/{p}/statm").split()[1]) for p in pids) * os.sysconf("SC_PAGE_SIZE")
        med = statistics.median
        return {
            "workers": n,
            "processes": len(pids),
            "rss_gib": rss / 2**30,
            "floor_us": med(floor_t) * 1e6,
            "pread_us": med(pread_t) * 1e6,
            "cheap_us": med(cheap_t) * 1e6,
            "full_us": med(full_t) * 1e6,
            "full_p95_us": sorted(full_t)[int(0.95 * len(full_t))] * 1e6,
            "fill_s": fill_s,
            "fill_ticks": fill_ticks,
            "fill_mean_ms": statistics.fmean(fill_slow) * 1e3,
            "fill_max_ms": max(fill_slow) * 1e3,
            "slow_mean_ms": statistics.fmean(slow_t) * 1e3,
            "slow_max_ms": max(slow_t) * 1e3,
        }
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--counts", default="1,8,32,128")
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    print("| workers | processes | RSS (GiB) | floor stat+status | same, kept open | cheap tick | ratio "
          "| full tick (median / p95) | slow part per tick (mean / worst) "
          "| first pass: ticks, slow part (mean / worst) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in (int(c) for c in args.counts.split(",")):
        r = measure(n, args.rounds)
        rows.append(r)
        print(f"| {r['workers']} | {r['processes']} | {r['rss_gib']:.1f} | {r['floor_us']:.0f} µs "
              f"| {r['pread_us']:.0f} µs | {r['cheap_us']:.0f} µs | {r['cheap_us'] / r['floor_us']:.2f}× "
              f"| {r['full_us']:.0f} / {r['full_p95_us']:.0f} µs "
              f"| {r['slow_mean_ms']:.1f} / {r['slow_max_ms']:.1f} ms "
              f"| {r['fill_ticks']} ticks, {r['fill_mean_ms']:.1f} / {r['fill_max_ms']:.1f} ms |",
              flush=True)
    if len(rows) > 1:
        procs = [r["processes"] for r in rows]
        lines = {name: statistics.linear_regression(procs, [r[f"{name}_us"] for r in rows])
                 for name in ("floor", "pread", "cheap")}
        print("\nper process: " + ", ".join(f"{k} {v.slope:.1f} µs" for k, v in lines.items())
              + f"; cheap/floor {lines['cheap'].slope / lines['floor'].slope:.2f}×"
              + "\nfixed per tick: " + ", ".join(f"{k} {v.intercept:.0f} µs" for k, v in lines.items()))


if __name__ == "__main__":
    main()
