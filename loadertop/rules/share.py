"""What one more worker gets on a busy host (pure): the kernel's fair scheduler shares a
contended CPU first between scheduling groups (cgroups by their CPU weight; in the root group,
with `kernel.sched_autogroup_enabled=1`, one group per session), then between the runnable
threads inside a group. So a job with more runnable threads takes a larger share only from the
processes of its own group; against other groups it has its group's share whatever it runs.

Measured here beside two busy loops on 2 CPUs (shared/DESIGN.md): with the loops in the job's
session a 2nd worker gave +41 %; with the job in a session of its own (`setsid`, as launchers
do), -3 %. The model below says +50 % and 0 % for those two hosts.

The inputs are what the host scan saw: CPUs each busy process outside the job used, by group.
A process that used BUSY_RUNNABLE_CORES or more of a contended CPU is taken to want a whole one
(it runs whenever it can: it is held back by the contention, not by itself); a lighter one, what
it used. Equal weights (the default): a group whose weight was changed is not read.
"""

from __future__ import annotations

from dataclasses import dataclass

from .measure import Measured

BUSY_RUNNABLE_CORES = 0.3


def waterfill(cpus: float, demands: list[float]) -> list[float]:
    """Each group's CPUs under equal weights: an equal split, none past what it asks, what a
    group leaves shared by the others."""
    out = [0.0] * len(demands)
    left = cpus
    open_ = [i for i, d in enumerate(demands) if d > 0]
    while open_ and left > 1e-9:
        each = left / len(open_)
        sated = [i for i in open_ if demands[i] - out[i] <= each]
        if not sated:
            for i in open_:
                out[i] += each
            break
        for i in sated:
            left -= demands[i] - out[i]
            out[i] = demands[i]
        open_ = [i for i in open_ if i not in sated]
    return out


def runnable(cores: float) -> float:
    """The CPUs a busy process wants, from what it used on a contended host."""
    return 1.0 if cores >= BUSY_RUNNABLE_CORES else cores


def job_share(cpus: float, threads: float, same_group: float, other_groups: list[float]) -> float:
    """The CPUs a job with `threads` runnable threads gets: its group's share, split by thread
    with the `same_group` threads of other processes in its group."""
    if threads <= 0:
        return 0.0
    group = waterfill(cpus, [threads + same_group, *other_groups])[0]
    return group * threads / (threads + same_group)


@dataclass(frozen=True)
class Trade:
    """One more worker on a busy host: the share of the CPUs it gives the job, and whom it is
    taken from."""

    gain: float  # the job's CPUs with one more runnable worker, relative to now, less 1
    same_group: float  # CPUs the other processes of the job's group want
    other_groups: int  # other groups that keep CPUs busy

    def text(self, names: str) -> str:
        if self.gain <= 0.0 or self.same_group <= 0.0:
            groups = "another busy group" if self.other_groups == 1 else f"{self.other_groups} other busy groups"
            return (f"the job already has its scheduling group's share of the CPUs (against {groups}): more "
                    "workers will not get it more")
        return (f"one more worker takes a larger share of the CPUs from the processes of the job's own scheduling "
                f"group{names} (~{self.gain:+.0%} CPU for the job): the host gets no faster, and they get slower")


def one_more_worker(m: Measured, extra: float = 1.0) -> Trade | None:
    """What `extra` runnable workers more give the job on its CPUs, where the host's groups were
    read; None where they were not."""
    budget = m.budget
    if budget.same_group is None:
        return None
    lw = m.loader
    workers = lw.num_workers * min(1.0, max(lw.demand, 0.0)) if lw is not None else 0.0
    threads = workers + min(1.0, m.main_demand)
    same = sum(runnable(p.cores) for p in budget.same_group)
    others = [sum(runnable(p.cores) for p in group) for group in budget.other_groups]
    now = job_share(budget.cpu_set, threads, same, others)
    more = job_share(budget.cpu_set, threads + extra, same, others)
    return Trade(more / now - 1.0 if now > 0 else 0.0, same, len(others))
