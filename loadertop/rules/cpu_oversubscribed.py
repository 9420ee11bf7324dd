"""cpu_oversubscribed: more runnable threads than usable CPUs; everything waits its turn."""

from __future__ import annotations

from statistics import fmean

from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, finding


def check(ctx: Context) -> Check:
    t = ctx.trainer
    waits = [p.runqueue_wait_s_per_s for p in (t.main, *t.workers)]
    if any(w is None for w in waits):
        return UNKNOWN
    runqueue = sum(waits)
    usable = ctx.usable_cpus
    load = ctx.snap.host.load_avg[0]
    if runqueue < T.RUNQUEUE_WAIT_WARNING or load < T.LOAD_PER_CPU_WARNING * usable:
        return FINE
    invol = [p.ctx_switches_involuntary_per_s for p in (t.main, *t.workers)]
    invol_per_cpu = sum(v for v in invol if v is not None) / usable
    level = CRITICAL if runqueue >= usable else WARNING
    busy = [w.busy_threads for w in t.workers if w.busy_threads is not None]
    threads = fmean(busy) if busy else 1.0
    new_n = max(1, min(ctx.num_workers, ctx.cpu_share - 1))
    change: dict = {}
    parts = []
    if new_n < ctx.num_workers:
        change["DataLoader"] = {"num_workers": new_n}
        parts.append(f"DataLoader(num_workers={ctx.num_workers} -> {new_n})")
    if threads >= T.WORKER_BUSY_THREADS:
        change["env"] = {"OMP_NUM_THREADS": "1"}
        parts.append("OMP_NUM_THREADS=1")
    suggestion = (
        " and ".join(parts) + f" so that runnable threads fit the {usable} usable CPUs"
        if parts
        else "other processes share these CPUs: give this job its own cores (taskset / cgroup "
        "cpuset) or fewer threads elsewhere"
    )
    return Check(level, finding(
        "cpu_oversubscribed", level, ctx,
        f"threads wait {runqueue:.1f} s per second to run; load {load:.1f} on {usable} usable CPUs",
        {"runqueue_wait_s_per_s": runqueue, "load_avg_1m": load, "usable_cpus": usable,
         "involuntary_ctx_switches_per_s_per_cpu": invol_per_cpu, "num_workers": ctx.num_workers},
        suggestion,
        change or None,
    ))
