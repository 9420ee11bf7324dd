"""loader_stalled: the loop waits for data while no worker does anything: a hang."""

from __future__ import annotations

from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, Check, Context, finding


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None:
        return UNKNOWN
    workers = ctx.trainer.workers
    if dw.stalled_for_s < T.STALL_S or not workers:
        return FINE
    window = ctx.history(dw.stalled_for_s)
    stopped = all(w.status == "stopped" for w in workers)
    cpus = [w.cpu_percent for t in window for w in t.workers if w.cpu_percent is not None]
    idle = stopped or (bool(cpus) and max(cpus) < T.IDLE_WORKER_CPU)
    if not idle:
        return FINE
    doing = {w.pid: (w.status if w.status == "stopped" else w.doing or w.status) for w in workers}
    return Check(CRITICAL, finding(
        "loader_stalled", CRITICAL, ctx,
        f"training has waited {dw.stalled_for_s:.0f} s for a batch while every worker is "
        + ("stopped" if stopped else "idle"),
        {"stalled_for_s": dw.stalled_for_s, "workers": doing,
         "max_worker_cpu_percent": max(cpus) if cpus else None},
        "a hang: look at the workers' stacks (py-spy dump --pid PID). Usual causes: a stopped "
        "worker (SIGSTOP, a debugger), a fork-unsafe library used in the dataset (open file "
        "handles, threads, CUDA before fork: use multiprocessing_context='spawn'), a deadlock "
        "on a lock held at fork, or a full /dev/shm",
        None,
    ), span_s=dw.stalled_for_s)
