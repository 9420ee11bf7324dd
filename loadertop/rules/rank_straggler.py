"""rank_straggler: the rank the others of a lockstep job wait for, where its own step (not its
loader) is what is slow. An input straggler has input_bound, which sizes its loader."""

from __future__ import annotations

from . import evidence as E
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, pct
from .waits_for_rank import evidence_of, job_of, of_job, span

ID = "rank_straggler"


def check(ctx: Context) -> Check:
    if ctx.trainer.rank is None:
        return FINE
    job = job_of(ctx)
    if job is None or job.method is None:
        return UNKNOWN
    straggler = job.straggler
    if straggler is None or straggler.rank != ctx.trainer.rank or straggler.cause != "step":
        return FINE
    level = CRITICAL if job.cost is not None and job.cost >= 0.3 else WARNING
    evidence: E.RankStraggler = {**evidence_of(ctx, job), "others_wait_fraction": job.cost,
                                 "waiting_ranks": list(job.waiting)}
    n = len(job.waiting)
    who = "the other rank waits" if n == 1 else f"{n} other ranks wait"
    whose = "its" if n == 1 else "their"
    return ctx.found(ID, level, f"the job's slowest step: {who} {pct(job.cost)} of {whose} loop for this rank",
                     evidence,
                     f"no loader change helps (data wait {pct(evidence['data_wait_fraction'])} here): this rank's "
                     "own step is longer than the others'; look at what differs on it (a slower or shared device, "
                     f"CPUs it shares, longer samples in its shard) (ranks of {of_job(job)})", span_s=span(ctx))
