"""Jobs of several ranks in the tests: torchrun jobs (live) and synthetic ranks (support.synth)."""

from __future__ import annotations

import shutil
from pathlib import Path

from loadertop.model import DataWait
from support.jobs import PYTHON
from support.synth import host, process, snapshot, story, trainer

TORCHRUN = shutil.which("torchrun") or str(Path(PYTHON).parent / "torchrun")


COMMON = ("--dist", "--ddp", "--workers", "1", "--persistent", "--batch-size", "8", "--duration", "300")


JOBS = {
    # A slow shard: rank 1's items take 10 ms to read, rank 0's 0.5 ms.
    "slow-loader": ("--sleep-ms", "0.5", "--slow-rank", "1", "--slow-sleep-ms", "10", "--step-ms", "5"),
    # A slower device: rank 1's step does 25 ms of its own CPU work, rank 0's 1 ms; loaders fast.
    "slow-step": ("--item-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "1", "--slow-rank", "1",
                  "--slow-step-cpu-ms", "25"),
    # Alike ranks: both loaders fast, both steps alike.
    "balanced": ("--sleep-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "5"),
}


JOB = "run:ddp-7"


def rank_wait(wait: float, backward: float, samples: int = 400, steps: float | None = None,
              source: str = "py-spy") -> DataWait:
    other = max(0.0, 1.0 - wait - backward)
    breakdown = (("forward", other / 2), ("backward", backward), ("optimizer", 0.0), ("device_sync", 0.0),
                 ("other", other / 2)) if source == "py-spy" else ()
    return DataWait(wait, wait, 0.0, breakdown, samples, 10.0, 0.0, source=source, steps_per_s=steps)


def rank(r: int, wait: float, backward: float, cpu: float = 0.1, world: int = 2, source: str = "py-spy",
         workers: int = 1, **kw):
    pid = 5000 + 100 * r
    return trainer(workers=workers, worker_cpu=20.0, pid=pid, rank=r, local_rank=r, world_size=world, job_pid=4000,
                   job_id=JOB, wait=rank_wait(wait, backward, source=source),
                   main=process(pid, 100 * cpu, threads=6, main_thread_cpu=cpu, main_thread_runqueue_s_per_s=0.0),
                   **kw)


def job_story(ranks, seconds: int = 30):
    return story(seconds, lambda t: snapshot(t, ranks, host(cpu=40.0)))


INPUT = [rank(0, 0.02, 0.94, cpu=0.04), rank(1, 0.93, 0.02, cpu=0.05)]


STEP = [rank(0, 0.03, 0.80, cpu=0.15), rank(1, 0.04, 0.05, cpu=0.9)]


BALANCED = [rank(0, 0.30, 0.30, cpu=0.5), rank(1, 0.33, 0.28, cpu=0.5)]
