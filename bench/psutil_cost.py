"""What a tick's per-process reads cost through psutil against loadertop's raw /proc readers.

A tick needs, per process: state, parent, CPU ticks, start time, RSS, threads and context
switches. loadertop reads and parses /proc/<pid>/stat and /proc/<pid>/status itself
(procfs.read_stat, procfs.read_ctx_switches, with procfs.ProcFiles keeping the files open
between ticks, as ProcessSampler does); psutil gets the same through `Process.oneshot()`.
Both run over the same sleeping child processes, interleaved round by round, fastest of 5
calls per round, median over rounds.

Run: python bench/psutil_cost.py [--processes 32] [--rounds 100]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tick_cost import timed  # noqa: E402  (bench/ is the script's folder)

from loadertop.probes import procfs  # noqa: E402


def raw(pids: list[int], files: procfs.ProcFiles) -> None:
    for pid in pids:  # what ProcessSampler.sample reads and parses for each process a tick
        procfs.read_stat(pid, files=files)
        procfs.read_ctx_switches(pid, files)


def with_psutil(procs: list[psutil.Process]) -> None:
    for p in procs:
        with p.oneshot():
            p.status()
            p.ppid()
            p.cpu_times()
            p.create_time()
            p.memory_info()
            p.num_threads()
            p.num_ctx_switches()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=32)
    p.add_argument("--rounds", type=int, default=100)
    args = p.parse_args()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                for _ in range(args.processes)]
    try:
        pids = [c.pid for c in children]
        files = procfs.ProcFiles()
        procs = [psutil.Process(pid) for pid in pids]
        times: dict[str, list[float]] = {"raw /proc": [], "psutil oneshot": []}
        for _ in range(args.rounds):
            times["raw /proc"].append(timed(raw, pids, files, repeat=5))
            times["psutil oneshot"].append(timed(with_psutil, procs, repeat=5))
        per = {k: statistics.median(v) / len(pids) * 1e6 for k, v in times.items()}
        for name, us in per.items():
            print(f"{name:<16} {us:6.1f} µs a process")
        print(f"psutil / raw: {per['psutil oneshot'] / per['raw /proc']:.2f}x")
    finally:
        for c in children:
            c.kill()
            c.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
