"""shm_pressure: the trainer's /dev/shm is nearly full (a full one is "Bus error" or a hang)."""

from __future__ import annotations

from . import evidence as E
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context

ID = "shm_pressure"


def check(ctx: Context) -> Check:
    shm = ctx.trainer.shm
    if shm is None or not shm.total_bytes or shm.used_bytes is None:
        return UNKNOWN
    peak = max((t.shm.used_bytes or 0) for t in ctx.history(60.0) if t.shm) or shm.used_bytes
    ratio = peak / shm.total_bytes
    if ratio < T.SHM_WARNING:
        return FINE
    level = CRITICAL if ratio >= T.SHM_CRITICAL else WARNING
    plan = ctx.plan
    evidence: E.ShmPressure = {
                "shm_total_bytes": shm.total_bytes, "shm_peak_used_bytes": peak, "shm_used_fraction": ratio,
                "torch_shm_bytes": shm.torch_bytes, "num_workers": ctx.num_workers, "path": shm.path,
                "predicted_gain": plan.gain}
    return ctx.found(
        ID, level,
        f"/dev/shm {ratio:.0%} full at peak ({peak / 2**20:.0f} of {shm.total_bytes / 2**20:.0f} MiB)",
        evidence,
        "batches in flight live in /dev/shm (workers x prefetch_factor x batch bytes): give the container a "
        "larger --shm-size (Kubernetes: an emptyDir with medium: Memory on /dev/shm)",
        parts=("shm", "workers"),
        immediate=True,  # one peak at the limit is the crash: no need to hold
    )
