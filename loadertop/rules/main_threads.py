"""main_threads: the training loop's own thread pool (torch's intra-op threads, OpenMP, MKL)
takes the CPUs its workers need. torch starts one intra-op thread per CPU; on a small step
they spin between tiny parallel regions, and with the workers' threads they outnumber the
CPUs. The change is a thread limit where the user sets it, sized from the CPUs the workers
leave, with the plan's predicted effect (the plan weighs it with the worker count)."""

from __future__ import annotations

from ..text import count
from . import evidence as E
from . import plan as P
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context

ID = "main_threads"


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    m, plan = ctx.measured, ctx.plan
    if plan.cause == P.UNKNOWN and dw is None:
        return UNKNOWN
    if plan.cause != P.MAIN_THREADS:
        return FINE
    busy = m.main_busy_threads
    n = P.main_threads_limit(m)
    steps = dw.steps_per_s if dw is not None else None
    per_step = m.main_cpu / steps if m.main_cpu is not None and steps else None
    gain = plan.gain
    level = CRITICAL if gain is not None and gain >= 0.2 else WARNING
    evidence: E.MainThreads = {
        "main_busy_threads": round(busy, 2), "main_cpu_percent": None if m.main_cpu is None else 100.0 * m.main_cpu,
        "main_runqueue_wait_s_per_s": round(m.main_runqueue, 3),
        "main_cpu_s_per_step": None if per_step is None else round(per_step, 4),
        "proposed_main_threads": n, "cpus": round(m.budget.cpus, 2), "num_workers": m.num_workers,
        "data_wait_fraction": m.wait, "predicted_gain": gain}
    lw = m.loader
    workers = f" beside {count(lw.num_workers, 'worker')}" if lw is not None and lw.num_workers else ""
    cost = f" ({per_step * 1000:.0f} ms of CPU per step)" if per_step is not None else ""
    title = (f"the training loop runs {busy:.1f} busy threads{workers} on {m.budget.cpus:.1f} CPUs{cost}: "
             "they take the CPUs its workers need")
    note = (f"limit the loop's threads where they are set: at launch (torch reads OMP_NUM_THREADS and "
            f"MKL_NUM_THREADS at start), or torch.set_num_threads({n}) in the script; a thread count can "
            "change float reductions in their last bits")
    return ctx.found(ID, level, title, evidence, note, parts=("workers", "threads"), span_s=dw.window_s if dw else 0.0)
