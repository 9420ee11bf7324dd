"""input_bound: the training loop waits for batches from the workers."""

from __future__ import annotations

import math

from . import thresholds as T
from .base import (
    CRITICAL,
    FINE,
    UNKNOWN,
    WARNING,
    Check,
    Context,
    enough_evidence,
    finding,
    pct,
    predicted_wait,
    wait_above,
    workers_for,
)


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None or not enough_evidence(dw):
        return UNKNOWN
    if ctx.num_workers == 0 or not wait_above(dw, dw.fraction, T.DATA_WAIT_WARNING):
        return FINE  # with num_workers=0 the main process loads: main_process_bound says so
    if (dw.main_process_fraction or 0.0) > (dw.worker_wait_fraction or 0.0):
        return FINE  # the main process itself is the bottleneck, not the workers
    if ctx.loader_ahead:
        return FINE  # the workers have the batches ready: main_process_bound says why the loop waits
    level = CRITICAL if wait_above(dw, dw.fraction, T.DATA_WAIT_CRITICAL) else WARNING
    wait = dw.fraction
    n = ctx.num_workers
    cpu = ctx.worker_cpu
    evidence = {
        "data_wait_fraction": wait,
        "worker_wait_fraction": dw.worker_wait_fraction,
        "samples": dw.samples,
        "num_workers": n,
        "worker_cpu_percent": cpu,
        "usable_cpus": ctx.usable_cpus,
        "trainers_sharing_cpus": ctx.trainers_sharing,
        "idle_cpus": ctx.idle_cpus,
        "main_process_cpus": ctx.main_cpus,
    }
    gpu = ctx.gpu_utilization()
    if gpu is not None:
        evidence["gpu_utilization_percent"] = gpu
    doing = sorted({w.doing for w in ctx.trainer.workers if w.doing})
    busy = f"; workers are in {doing[0]}" if doing else ""
    title = f"data wait {pct(wait)} of the training loop"
    if gpu is not None:
        title += f" while GPU utilization is {gpu:.0f}%"
    idle = ctx.idle_cpus
    if cpu is not None and cpu >= T.WORKER_CPU_BOUND:
        # CPU-bound workers: more workers, as many as idle CPUs and this trainer's share (beside
        # what its main process needs) allow.
        room = workers_for(idle) if idle is not None else 0
        new_n = min(ctx.worker_cpus, n + room)
        if new_n > n:
            after = predicted_wait(wait, n, new_n)
            return Check(level, finding(
                "input_bound", level, ctx, title, evidence,
                f"workers at {cpu:.0f}% CPU with {idle:.1f} usable CPUs idle: "
                f"DataLoader(num_workers={n} -> {new_n}) should cut data wait from ~{pct(wait)} "
                f"toward ~{pct(after)}",
                {"DataLoader": {"num_workers": new_n}},
            ), span_s=dw.window_s)
        if room > 0:
            full = (f"this trainer's {ctx.cpu_share} usable CPUs are taken by its {n} "
                    f"worker{'s' if n != 1 else ''} and its main process (~{ctx.main_cpus:.1f} CPUs)")
        else:
            full = f"this trainer's {ctx.cpu_share} usable CPUs are busy"
        return Check(level, finding(
            "input_bound", level, ctx, title + " with no CPU left", evidence,
            f"workers at {cpu:.0f}% CPU and {full}{busy}: "
            "more workers will not help; make each item cheaper (preprocess offline, decode "
            "smaller or lighter images, cache decoded samples) or give the job more CPUs",
            None,
        ), span_s=dw.window_s)
    if cpu is not None and cpu < T.WORKER_IO_BOUND:
        # Workers mostly sleep (I/O): more workers than cores pay off, and a deeper prefetch.
        target = math.ceil(n / max(0.05, 1.0 - wait))
        new_n = max(n + 1, min(target, ctx.cpu_share * T.IO_WORKERS_PER_CPU))
        after = predicted_wait(wait, n, new_n)
        return Check(level, finding(
            "input_bound", level, ctx, title + " (workers wait on I/O)", evidence,
            f"workers use only {cpu:.0f}% CPU: they wait on I/O{busy}. "
            f"DataLoader(num_workers={n} -> {new_n}, prefetch_factor=4) should cut data wait "
            f"from ~{pct(wait)} toward ~{pct(after)}; I/O-bound loaders may run more workers "
            "than cores",
            {"DataLoader": {"num_workers": new_n, "prefetch_factor": 4}},
        ), span_s=dw.window_s)
    new_n = min(ctx.worker_cpus, n + 1)
    change = {"DataLoader": {"num_workers": new_n}} if new_n > n else None
    text = (
        f"try DataLoader(num_workers={n} -> {new_n}) and watch data wait"
        if change
        else "no CPU share left for more workers: make each item cheaper"
    )
    return Check(level, finding("input_bound", level, ctx, title, evidence, text + busy, change),
                 span_s=dw.window_s)
