"""loader_stalled: the loop waits for data while no worker gets anything done: a hang."""

from __future__ import annotations

from . import evidence as E
from .base import CRITICAL, FINE, UNKNOWN, Check, Context

ID = "loader_stalled"

SEEN = {"stopped": "stopped", "idle": "idle (no CPU, nothing wakes them)",
        "one frame": "stuck on one line in every stack"}


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None:
        return UNKNOWN
    how = ctx.hang
    if how is None:
        return FINE
    window = ctx.history(dw.stalled_for_s)
    cpus = [w.cpu_percent for t in window for w in t.workers if w.cpu_percent is not None]
    doing = {w.pid: (w.status if w.status == "stopped" else w.doing or w.status) for w in ctx.trainer.workers}
    return ctx.found(
        ID, CRITICAL,
        f"training has waited {dw.stalled_for_s:.0f} s for a batch while every worker is {SEEN[how]}",
        E.LoaderStalled(stalled_for_s=dw.stalled_for_s, workers=doing, how=how,
                        max_worker_cpu_percent=max(cpus) if cpus else None),
        "a hang, not a slow loader: more workers will not help. Look at the workers' stacks (py-spy dump "
        "--pid PID). Usual causes: a stopped worker (SIGSTOP, a debugger), a fork-unsafe library used in the "
        "dataset (open file handles, threads, CUDA before fork: use multiprocessing_context='spawn'), a "
        "deadlock on a lock held at fork, a read that never returns (a network file system), or a full "
        "/dev/shm",
        span_s=dw.stalled_for_s,
        immediate=True,  # the stall already lasted; holding it longer only hides a hang
    )
