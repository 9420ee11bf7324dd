"""shm_pressure: the trainer's /dev/shm is nearly full (a full one is "Bus error" or a hang)."""

from __future__ import annotations

import math

from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, finding

GIB = 2**30


def _size_flag(nbytes: float) -> str:
    if nbytes >= GIB:
        return f"{math.ceil(nbytes / GIB)}g"
    return f"{max(64, 64 * math.ceil(nbytes / 2**20 / 64))}m"


def check(ctx: Context) -> Check:
    shm = ctx.trainer.shm
    if shm is None or not shm.total_bytes or shm.used_bytes is None:
        return UNKNOWN
    peak = max((t.shm.used_bytes or 0) for t in ctx.history(60.0) if t.shm) or shm.used_bytes
    ratio = peak / shm.total_bytes
    if ratio < T.SHM_WARNING:
        return FINE
    level = CRITICAL if ratio >= T.SHM_CRITICAL else WARNING
    n = max(1, ctx.num_workers)
    in_flight = shm.torch_bytes or 0
    per_batch = in_flight / (2 * n) if in_flight else None  # prefetch_factor 2 by default
    need = max(2 * peak, in_flight * 2)
    evidence = {"shm_total_bytes": shm.total_bytes, "shm_peak_used_bytes": peak, "shm_used_fraction": ratio,
                "torch_shm_bytes": shm.torch_bytes, "bytes_per_batch_estimate": per_batch,
                "num_workers": ctx.num_workers, "path": shm.path}
    flag = _size_flag(need)
    return Check(level, finding(
        "shm_pressure", level, ctx,
        f"/dev/shm {ratio:.0%} full at peak ({peak / 2**20:.0f} of {shm.total_bytes / 2**20:.0f} MiB)",
        evidence,
        f"batches in flight live in /dev/shm (workers x prefetch_factor x batch bytes): give the "
        f"container --shm-size={flag} (Kubernetes: an emptyDir with medium: Memory on /dev/shm), "
        "or lower num_workers / prefetch_factor",
        {"docker": {"shm_size": flag}},
    ), immediate=True)  # one peak at the limit is the crash: no need to hold
