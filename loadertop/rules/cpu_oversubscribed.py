"""cpu_oversubscribed: the trainer's threads wait for CPUs they cannot get: its quota runs
out, other processes take them, or its own workers ask for more than it has."""

from __future__ import annotations

from ..text import count
from . import evidence as E
from . import plan as P
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context
from .measure import queued_s_per_s

ID = "cpu_oversubscribed"
NAMED = 3  # the busiest processes a reason names


def check(ctx: Context) -> Check:
    t = ctx.trainer
    read = [queued_s_per_s(p) for p in (t.main, *t.workers)]
    waits = [w for w in read if w is not None]
    if len(waits) < len(read):
        return UNKNOWN
    m, plan = ctx.measured, ctx.plan
    budget = m.budget
    if plan.cause == P.TOO_MANY_WORKERS and budget.shared_with:
        return FINE  # other DataLoader jobs share the CPUs: too_many_workers says how to split them
    if plan.cause not in P.OVERSUBSCRIBED:
        return FINE
    if plan.cause == P.TOO_MANY_WORKERS and plan.change("workers") is None:
        return FINE  # its own workers keep its CPUs busy: saturated, which input_bound says, not a fault
    runqueue = sum(waits)
    throttled = budget.throttled or 0.0
    if runqueue < T.RUNQUEUE_WAIT_WARNING and throttled < T.THROTTLED_SHARE:
        return FINE
    level = CRITICAL if runqueue >= budget.cpus or throttled >= T.THROTTLED_CRITICAL else WARNING
    evidence: E.CpuOversubscribed = {
                "runqueue_wait_s_per_s": runqueue, "cpus": round(budget.cpus, 2), "cpu_set": budget.cpu_set,
                "cpu_quota": budget.quota, "throttled_fraction": budget.throttled,
                "other_processes_cpus": round(budget.others_busy, 2), "trainer_cpus_used": budget.used,
                "load_avg_1m": ctx.snap.host.load_avg[0], "num_workers": m.num_workers, "cause": plan.cause,
                "predicted_gain": plan.gain,
                # The gain the note states: with more CPUs, not with a setting (predicted_gain).
                "with_more_cpus": ({"cpus": plan.bigger_budget[0], "predicted_gain": plan.bigger_budget[1]}
                                   if plan.bigger_budget else None),
                "busiest_processes": [{"pid": p.pid, "name": p.comm, "user": p.user, "cpus": p.cores}
                                      for p in ctx.snap.host.busiest]}
    if plan.cause == P.QUOTA:
        title = (f"the trainer's {budget.quota:g}-CPU quota runs out in {throttled:.0%} of its periods; "
                 f"its threads wait {runqueue:.1f} s per second to run")
        note = "its CPU quota is the limit, not the loader"
        if plan.bigger_budget:
            cpus, gain = plan.bigger_budget
            note += (f": a {cpus:g}-CPU quota (docker --cpus={cpus:g}, Kubernetes resources.limits.cpu: "
                     f"{cpus:g}) predicts ~{gain:+.0%} steps/s")
    elif plan.cause == P.BUSY_HOST and budget.others_busy >= T.MIN_OTHERS_BUSY:
        title = (f"other processes keep {budget.others_busy:.1f} of the trainer's {count(budget.cpu_set, 'CPU')} busy; "
                 f"its threads wait {runqueue:.1f} s per second to run")
        note = (f"the CPUs are taken by other processes{busiest(ctx)}, not by the loader: give the job its own "
                "cores (taskset, a cgroup cpuset, a dedicated node) or move the other work")
        if plan.bigger_budget:
            cpus, gain = plan.bigger_budget
            note += f"; with {cpus:g} CPUs of its own ~{gain:+.0%} steps/s"
        if plan.trade:
            note += f"; {plan.trade}"
    elif plan.cause == P.BUSY_HOST:
        # Its threads queue though it uses few of its CPUs, and the busy CPUs were not read:
        # no figure for the others, never a made-up one.
        used = f"{budget.used:.1f}" if budget.used is not None else "n/a"
        title = (f"the trainer's threads wait {runqueue:.1f} s per second to run while it uses {used} of its "
                 f"{count(budget.cpu_set, 'CPU')}")
        note = (f"something outside the job takes its CPUs{busiest(ctx)}: give the job its own cores (taskset, "
                "a cgroup cpuset, a dedicated node) or move the other work")
        if plan.trade:
            note += f"; {plan.trade}"
    elif plan.cause == P.THREADS:
        lw = m.loader
        busy = lw.num_workers * (lw.busy_threads or 1.0) if lw else 0.0
        title = f"{busy:.0f} busy worker threads on {budget.cpus:.1f} CPUs; threads wait {runqueue:.1f} s per second"
        note = "the workers' thread pools outnumber the CPUs: one thread per worker"
    else:
        title = f"the trainer's threads wait {runqueue:.1f} s per second for its {budget.cpus:.1f} CPUs"
        note = "its workers ask for more CPU than it has"
    return ctx.found(ID, level, title, evidence, note, parts=("workers", "threads"))


def busiest(ctx: Context) -> str:
    """' (stress-ng of bob 0.9 CPU, ...)': the processes the host scan saw use the most CPU
    outside the watched jobs, where it saw any; with what they add up to where that is less
    than the CPUs the others were said to keep busy (a list of 0.4 and 0.3 named for "1.7"
    read as the whole)."""
    top = ctx.snap.host.busiest[:NAMED]
    if not top:
        return ""
    named = ", ".join(f"{p.comm} of {p.user} {p.cores:.1f} CPU" for p in top)
    total = sum(p.cores for p in top)
    others = ctx.measured.budget.others_busy
    if others - total >= T.MIN_OTHERS_BUSY:
        return f" (the busiest: {named}; {total:.1f} of the {others:.1f} together, the rest spread over others)"
    return f" ({named})"
