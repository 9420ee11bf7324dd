"""worker_died: a worker was killed or failed (not the normal end of an epoch)."""

from __future__ import annotations

import signal

from . import evidence as E
from .base import CRITICAL, FINE, Check, Context

ID = "worker_died"


def check(ctx: Context) -> Check:
    deaths = [e for e in ctx.events("worker_exited") if e.exit_code not in (None, 0)]
    if not deaths:
        return FINE
    e = deaths[-1]
    killed = e.exit_code & 0x7F
    how = e.detail or f"exit code {e.exit_code}"
    check_what = (
        "the kernel OOM killer (dmesg | grep -i oom) and the job's memory limit: lower batch "
        "size or num_workers, or share less per worker"
        if killed == signal.SIGKILL
        else "the worker's traceback in the training log"
    )
    return ctx.found(
        ID, CRITICAL, f"worker {e.pid} died ({how})",
        E.WorkerDied(worker_pid=e.pid, exit_code=e.exit_code, signal=killed or None, when=e.time,
                     deaths=len(deaths)),
        f"check {check_what}; the DataLoader raises in the trainer when a worker dies",
        immediate=True,
    )
