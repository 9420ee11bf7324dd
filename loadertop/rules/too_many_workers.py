"""too_many_workers: DataLoader jobs that share CPUs ask for more of them than there are."""

from __future__ import annotations

from . import evidence as E
from . import plan as P
from . import thresholds as T
from .base import FINE, UNKNOWN, WARNING, Check, Context
from .waits_for_rank import waited_for

ID = "too_many_workers"


def check(ctx: Context) -> Check:
    host = ctx.snap.host
    if host.dataloader_workers is None or host.cpu_percent is None:
        return UNKNOWN
    m, plan = ctx.measured, ctx.plan
    budget = m.budget
    if plan.cause != P.TOO_MANY_WORKERS or not budget.shared_with or host.cpu_percent < T.HOST_BUSY_PERCENT:
        return FINE
    # Only a job that asks for more than its share (what its workers and its main process
    # use and wait to use), and where fewer workers is the change: a job whose share covers
    # its workers and its main process has none too many.
    fewer = plan.change("workers") is not None and plan.chosen.num_workers < plan.now.num_workers
    lw = m.loader
    demand = m.main_demand + (lw.demand * lw.num_workers if lw is not None else 0.0)
    if not fewer or demand <= budget.cpus + T.POOL_SLACK_CPUS:
        return FINE
    if (plan.gain or 0.0) < T.MIN_GAIN and waited_for(ctx):
        return FINE  # fewer workers "at no real loss" is still a loss on the rank the whole job waits for
    return ctx.found(ID, WARNING,
                     f"{budget.shared_with + 1} DataLoader jobs share {budget.cpu_set} CPUs; this one's share is "
                     f"{budget.cpus:.1f}",
                     E.TooManyWorkers(workers_on_host=host.dataloader_workers,
                                      trainers_sharing_cpus=budget.shared_with + 1, cpus=round(budget.cpus, 2),
                                      cpu_set=budget.cpu_set, host_cpu_percent=host.cpu_percent,
                                      num_workers=m.num_workers, predicted_gain=plan.gain),
                     "split the CPUs between the jobs: each worker beyond a job's share only waits for a CPU",
                     parts=("workers",))
