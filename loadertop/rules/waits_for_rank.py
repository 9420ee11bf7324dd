"""waits_for_rank: a rank of a lockstep job spends its loop waiting in the gradient sync for
another rank (rules/ranks.py says who). Its own loader and step are not the problem: nothing to
change on this rank, the straggler's finding says what to change there."""

from __future__ import annotations

from . import evidence as E
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, pct
from .ranks import Attribution

ID = "waits_for_rank"


def job_of(ctx: Context) -> Attribution | None:
    return ctx.jobs.get(ctx.trainer.job)


def _with_straggler(ctx: Context) -> Attribution | None:
    """This rank's job, where its ranks compared name a straggler."""
    job = job_of(ctx) if ctx.trainer.rank is not None else None
    return job if job is not None and job.straggler is not None else None


def waits_for_another(ctx: Context) -> bool:
    """This rank waits in the gradient sync for another: its own data wait is slack the sync
    absorbs (a faster loader here only lengthens its wait there), so no loader change on this
    rank speeds the job."""
    job = _with_straggler(ctx)
    return job is not None and ctx.trainer.rank in job.waiting


def waited_for(ctx: Context) -> bool:
    """This rank is the one its lockstep job waits for: any loss on it is the whole job's."""
    job = _with_straggler(ctx)
    return job is not None and job.straggler is not None and job.straggler.rank == ctx.trainer.rank


def evidence_of(ctx: Context, job: Attribution) -> E._Ranks:
    straggler = job.straggler
    assert straggler is not None
    mine = next((r for r in job.ranks if r.rank == ctx.trainer.rank), None)
    theirs = next((r for r in job.ranks if r.rank == straggler.rank), None)
    return {"rank": ctx.trainer.rank or 0, "ranks_seen": len(job.ranks), "world_size": job.world_size,
            "straggler_rank": straggler.rank, "straggler_pid": straggler.pid, "straggler_node": straggler.node,
            "cause": straggler.cause, "method": job.method,
            "data_wait_fraction": mine.data_wait if mine else None,
            "straggler_data_wait_fraction": theirs.data_wait if theirs else None}


def of_job(job: Attribution) -> str:
    seen = len(job.ranks)
    return f"{seen} of {job.world_size}" if job.world_size and job.world_size != seen else f"{seen}"


def check(ctx: Context) -> Check:
    if ctx.trainer.rank is None:
        return FINE
    job = job_of(ctx)
    if job is None or job.method is None:
        return UNKNOWN
    straggler = job.straggler
    if straggler is None or ctx.trainer.rank not in job.waiting:
        return FINE
    wait = job.wait_of(ctx.trainer.rank)
    level = CRITICAL if wait is not None and wait >= 2 * T.RANK_WAIT else WARNING
    evidence: E.WaitsForRank = {**evidence_of(ctx, job), "wait_for_ranks_fraction": wait}
    where = "" if straggler.node == ctx.snap.host.hostname else f" on {straggler.node}"
    if straggler.cause == "input":
        title = (f"waits {pct(wait)} of its loop for rank {straggler.rank}{where}, whose loader is behind "
                 f"(data wait {pct(evidence['straggler_data_wait_fraction'])} there, "
                 f"{pct(evidence['data_wait_fraction'])} here)")
        note = (f"the job runs at rank {straggler.rank}'s pace, not this rank's: its finding input_bound sizes "
                f"its loader for the node (ranks of {of_job(job)})")
    else:
        title = f"waits {pct(wait)} of its loop for rank {straggler.rank}{where}, whose own step is the slowest"
        note = (f"no loader change helps: rank {straggler.rank}'s step takes longer than this rank's; "
                "look at what differs there (a slower or shared device, CPUs it shares, longer samples in its shard)")
    return ctx.found(ID, level, title, evidence, note, span_s=span(ctx))


def span(ctx: Context) -> float:
    """How far back the comparison's evidence reaches: the data wait's window."""
    dw = ctx.data_wait()
    return dw.window_s if dw is not None else 0.0
