"""worker_threads: each worker runs a thread pool (OpenMP/MKL/OpenCV) besides its own thread."""

from __future__ import annotations

from statistics import fmean

from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, finding


def check(ctx: Context) -> Check:
    workers = ctx.trainer.workers
    busy = [w.busy_threads for w in workers if w.busy_threads is not None]
    if not workers or not busy:
        return UNKNOWN
    mean_busy = fmean(busy)
    if mean_busy < T.WORKER_BUSY_THREADS:
        return FINE
    total = sum(busy)
    level = CRITICAL if total > ctx.usable_cpus else WARNING
    env = ctx.trainer.env_dict
    evidence = {
        "busy_threads_per_worker": mean_busy,
        "threads_per_worker": fmean(w.threads or 0 for w in workers),
        "workers": len(workers),
        "busy_threads_total": total,
        "usable_cpus": ctx.usable_cpus,
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS"),
    }
    return Check(level, finding(
        "worker_threads", level, ctx,
        f"workers run {mean_busy:.1f} busy threads each ({total} on {ctx.usable_cpus} usable CPUs)",
        evidence,
        "each worker should compute on one thread: set OMP_NUM_THREADS=1 (and MKL_NUM_THREADS=1) "
        "in the job's environment, or call torch.set_num_threads(1) and cv2.setNumThreads(0) in "
        "worker_init_fn",
        {"env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
         "DataLoader": {"worker_init_fn": "lambda _: torch.set_num_threads(1)"}},
    ))
