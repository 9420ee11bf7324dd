"""worker_memory_growth: copy-on-read; workers' private memory grows while RSS stays flat.

Warm-up is not a leak: a worker's first MEMORY_WARMUP_S are left out, and growth must keep
its pace (the later half of the readings as steep as the earlier, where warm-up flattens)
and matter (memory would run out within MEMORY_GROWTH_MATTERS_HOURS at that pace)."""

from __future__ import annotations

from statistics import fmean

from . import evidence as E
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context

ID = "worker_memory_growth"


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope (per second) and R² of y over t."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    stt = sum((t - mt) ** 2 for t, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    sty = sum((t - mt) * (y - my) for t, y in points)
    if stt == 0 or syy == 0:
        return 0.0, 0.0
    return sty / stt, sty * sty / (stt * syy)


def _keeps_pace(points: list[tuple[float, float]]) -> bool:
    """The later half grows at least MEMORY_GROWTH_KEEPS_PACE as fast as the earlier half."""
    half = len(points) // 2
    early, late = _fit(points[: half + 1])[0], _fit(points[half:])[0]
    return early > 0 and late >= T.MEMORY_GROWTH_KEEPS_PACE * early


def check(ctx: Context) -> Check:
    history = ctx.timed_history(600.0)
    per_worker: dict[int, dict[float, float]] = {}
    for _, t in history:
        for w in t.workers:
            if (w.memory_sampled_at is not None and w.uss_bytes is not None
                    and w.memory_sampled_at - w.started_at >= T.MEMORY_WARMUP_S):
                # One point per smaps reading, not per tick.
                per_worker.setdefault(w.pid, {})[w.memory_sampled_at] = float(w.uss_bytes)
    series = [sorted(points.items()) for points in per_worker.values()
              if len(points) >= T.MEMORY_GROWTH_MIN_POINTS
              and max(points) - min(points) >= T.MEMORY_GROWTH_MIN_WINDOW_S]
    if not series:
        return UNKNOWN
    fits = [_fit(points) for points in series]
    span = max(points[-1][0] - points[0][0] for points in series)
    slope = fmean(f[0] for f in fits)  # bytes per second of one worker
    fit = min(f[1] for f in fits)
    per_min = slope * 60
    if per_min < T.MEMORY_GROWTH_MIN_BYTES_PER_MIN or fit < T.MEMORY_GROWTH_MIN_FIT:
        return FINE
    if not all(_keeps_pace(points) for points in series):
        return FINE  # slowing down: warm-up (caches, allocator arenas) settling
    rss = [(when, fmean(w.rss_bytes or 0 for w in t.workers)) for when, t in history
           if t.workers and all(w.rss_bytes is not None for w in t.workers)]
    rss_slope = _fit(rss)[0] if len(rss) >= 2 else 0.0
    if rss_slope > T.RSS_GROWTH_SHARE * slope:
        return FINE  # RSS grows as fast: real allocation, not copy-on-read
    n = max(1, len(ctx.trainer.workers))
    available = ctx.measured.memory_available
    hours = available / (slope * n) / 3600 if available and slope > 0 else None
    if hours is not None and hours > T.MEMORY_GROWTH_MATTERS_HOURS:
        return FINE  # real, but memory would last longer than a training run
    level = CRITICAL if hours is not None and hours < T.MEMORY_GROWTH_CRITICAL_HOURS else WARNING
    return ctx.found(
        ID, level,
        f"each worker's private memory grows {per_min / 2**20:.1f} MiB/min while RSS stays flat"
        + (f"; memory runs out in ~{hours:.1f} h" if hours is not None else ""),
        E.WorkerMemoryGrowth(uss_growth_bytes_per_min_per_worker=per_min, fit_r2=fit, workers=n,
                             rss_growth_bytes_per_min=rss_slope * 60, window_s=span, hours_to_oom=hours,
                             mem_available_bytes=available),
        "copy-on-read: reading Python objects (lists, dicts of paths or labels) in workers "
        "touches their refcounts and copies the pages. Keep dataset metadata in numpy arrays, "
        "pyarrow tables or one bytes blob instead of lists and dicts of Python objects",
        span_s=span,  # the fit already covers its window
    )
