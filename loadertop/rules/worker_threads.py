"""worker_threads: each worker runs a thread pool (OpenMP/MKL/OpenBLAS/OpenCV) besides its own
thread, and the pools outnumber the CPUs."""

from __future__ import annotations

from statistics import fmean

from . import evidence as E
from . import plan as P
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context

ID = "worker_threads"


def check(ctx: Context) -> Check:
    workers = ctx.trainer.workers
    busy = [w.busy_threads for w in workers if w.busy_threads is not None]
    if not workers or not busy:
        return UNKNOWN
    m, plan = ctx.measured, ctx.plan
    if plan.cause != P.THREADS:
        return FINE  # pools that fit the CPUs cost nothing; the plan sizes workers with them
    mean_busy = fmean(busy)
    total = sum(busy)
    level = CRITICAL if total > m.budget.cpus else WARNING
    lw = m.loader
    pools = lw.thread_pools if lw else ()
    env = m.env
    evidence: E.WorkerThreads = {
        "busy_threads_per_worker": mean_busy,
        "threads_per_worker": fmean(w.threads or 0 for w in workers),
        "workers": len(workers),
        "busy_threads_total": total,
        "cpus": round(m.budget.cpus, 2),
        "thread_pools": list(pools),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS"),
        "main_process_busy_threads": m.main_busy_threads,
    }
    named = f" ({', '.join(pools)})" if pools else ""
    if "env" in (plan.thread_change or {}):
        note = "each worker should compute on one thread: a pool per worker only makes them wait for each other"
    elif env.get("OMP_NUM_THREADS") == "1":
        note = (f"OMP_NUM_THREADS=1 is already set, yet the pools{named} run: they are sized in code or "
                "ignore it (OpenCV, torch.set_num_threads, threadpoolctl): limit them in each worker")
    else:
        note = ("the main process computes on several threads itself, so the limit goes in the workers only, "
                "not in the environment")
    return ctx.found(ID, level,
                     f"workers run {mean_busy:.1f} busy threads each{named}: {total} on {m.budget.cpus:.1f} CPUs",
                     evidence, note, parts=("threads",))
