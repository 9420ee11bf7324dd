"""A trainer's figures over a whole report, each with its noise (pure): what `loadertop diff`
compares between a run before a change and one after it, so that "+50 % steps/s" is told from
a wobble.

A figure read as a rate between two ticks (CPU; the hook's steps/s and data wait, from the
change in its running totals) is split into a few blocks of ticks (batch means: blocks long
enough that one block's wobble does not carry into the next); the mean of every tick is the
run's figure, the blocks' spread / sqrt(blocks) its standard error. py-spy's data wait is read
over rolling windows: it is taken at ticks whose windows do not overlap, walking back from the
last; one window alone has its binomial sampling error. A figure with no spread to tell has no
stderr (shown as such, never as exact).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean, stdev

from ..model import Snapshot, TrainerSnapshot

BLOCKS = 5  # batch means: at most this many blocks of ticks


def figure(value: float | None, stderr: float | None, readings: int) -> dict:
    return {"value": _r(value), "stderr": _r(stderr), "readings": readings}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def windowed(points: Sequence[tuple[float, float, float]]) -> dict:
    """(tick time, value, its window in s) per tick, in order: the readings of disjoint windows."""
    picked: list[float] = []
    edge = math.inf
    for at, value, window in reversed(points):
        if at <= edge + 1e-6:
            picked.append(value)
            edge = at - max(window, 1e-3)
    if not picked:
        return figure(None, None, 0)
    error = stdev(picked) / math.sqrt(len(picked)) if len(picked) >= 2 else None
    return figure(fmean(picked), error, len(picked))


def per_tick(values: Sequence[float]) -> dict:
    """Rates between ticks: the mean, and the standard error of a few blocks' means."""
    if not values:
        return figure(None, None, 0)
    blocks = min(BLOCKS, len(values) // 2)
    error = None
    if blocks >= 2:
        size = len(values) / blocks
        means = [fmean(values[round(i * size):round((i + 1) * size)]) for i in range(blocks)]
        error = stdev(means) / math.sqrt(blocks)
    return figure(fmean(values), error, len(values))


def run_figures(last: TrainerSnapshot, snapshots: Sequence[Snapshot]) -> dict[str, dict]:
    """steps/s, data wait, the workers' and the main process's CPU, /dev/shm used: each over the
    report's running ticks of this trainer, with its standard error."""
    seen = [(s.monotonic, t) for s in snapshots for t in s.trainers
            if (t.pid, t.started_at) == (last.pid, last.started_at) and t.status == "running"]
    steps, hook_waits = _hook_rates(seen)
    waits = [(at, t.data_wait.fraction, t.data_wait.window_s) for at, t in seen
             if t.data_wait is not None and t.data_wait.fraction is not None]
    wait = per_tick(hook_waits) if len(hook_waits) >= 2 else windowed(waits)
    dw = last.data_wait
    one_pyspy_window = dw is not None and dw.source == "py-spy" and dw.samples > 0 and dw.fraction is not None
    if wait["readings"] == 1 and one_pyspy_window and dw is not None and dw.fraction is not None:
        # One window of py-spy's samples: its binomial sampling error.
        wait = figure(dw.fraction, math.sqrt(dw.fraction * (1 - dw.fraction) / dw.samples), 1)
    workers = [sum(w.cpu_percent for w in t.workers if w.cpu_percent is not None) for _, t in seen
               if t.workers and any(w.cpu_percent is not None for w in t.workers)]
    main = [t.main.cpu_percent for _, t in seen if t.main.cpu_percent is not None]
    shm = [float(t.shm.used_bytes) for _, t in seen if t.shm is not None and t.shm.used_bytes is not None]
    return {
        "steps_per_s": per_tick(steps),
        "data_wait": wait,
        "workers_cpu_percent": per_tick(workers),
        "main_cpu_percent": per_tick(main),
        "shm_used_bytes": per_tick(shm),
    }


def _hook_rates(seen: Sequence[tuple[float, TrainerSnapshot]]) -> tuple[list[float], list[float]]:
    """Each tick's own steps/s and data wait, from the change in the hook's running totals since
    the tick before (a counter that goes back is a new run: that tick is skipped)."""
    steps: list[float] = []
    waits: list[float] = []
    prev: tuple[float, int, float] | None = None
    for at, t in seen:
        dw = t.data_wait
        if dw is None or dw.batches_total is None or dw.waited_total_s is None:
            prev = None
            continue
        if prev is not None and at > prev[0] and dw.batches_total >= prev[1] and dw.waited_total_s >= prev[2]:
            dt = at - prev[0]
            steps.append((dw.batches_total - prev[1]) / dt)
            waits.append(min(1.0, (dw.waited_total_s - prev[2]) / dt))
        prev = (at, dw.batches_total, dw.waited_total_s)
    return steps, waits
