"""too_many_workers: the loaders on this machine ask for more CPUs than it has."""

from __future__ import annotations

from . import thresholds as T
from .base import FINE, UNKNOWN, WARNING, Check, Context, finding


def check(ctx: Context) -> Check:
    host = ctx.snap.host
    total = host.dataloader_workers
    if total is None or host.cpu_percent is None:
        return UNKNOWN
    usable = ctx.usable_cpus
    sharing = ctx.trainers_sharing
    if total <= usable or host.cpu_percent < T.HOST_BUSY_PERCENT or sharing < 2:
        return FINE  # one trainer's own count is input_bound's and cpu_oversubscribed's business
    share = max(1, usable // sharing - 1)
    if ctx.num_workers <= share:
        return FINE
    return Check(WARNING, finding(
        "too_many_workers", WARNING, ctx,
        f"{total} DataLoader workers of {sharing} trainers share {usable} usable CPUs",
        {"workers_on_host": total, "trainers_on_host": sharing, "usable_cpus": usable,
         "host_cpu_percent": host.cpu_percent, "num_workers": ctx.num_workers},
        f"split the CPUs between the trainers: {usable} CPUs / {sharing} trainers leaves each "
        f"DataLoader(num_workers={ctx.num_workers} -> {share}) (one CPU for its main process)",
        {"DataLoader": {"num_workers": share}},
    ))
