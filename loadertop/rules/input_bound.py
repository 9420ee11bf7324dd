"""input_bound: the training loop waits for batches from the workers."""

from __future__ import annotations

from ..text import count
from . import evidence as E
from . import plan as P
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, enough_evidence, pct, wait_above
from .cpu_oversubscribed import busiest
from .waits_for_rank import waits_for_another

ID = "input_bound"


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None or not enough_evidence(dw):
        return UNKNOWN
    m, plan = ctx.measured, ctx.plan
    if plan.cause == P.DISPATCHED:
        return _dispatched(ctx)
    wait = m.wait_workers or 0.0
    if m.loader is None or plan.cause in (P.STALLED, P.MAIN_LOADING, P.RECEIVING):
        return FINE  # a hang is loader_stalled's, the main process's own work main_process_bound's
    if not wait_above(dw, wait, T.DATA_WAIT_WARNING) or waits_for_another(ctx):
        return FINE  # a rank that waits for another: waits_for_rank says so, and what to change there
    level = CRITICAL if wait_above(dw, wait, T.DATA_WAIT_CRITICAL) else WARNING
    gpu = m.gpu_utilization
    if gpu is not None and gpu >= T.GPU_BUSY_PERCENT:
        level -= 1  # the GPU is busy all the same: the wait costs less than it seems
        if level == 0:
            return FINE
    lw = m.loader
    evidence: E.InputBound = {
        "data_wait_fraction": m.wait,
        "worker_wait_fraction": wait,
        "samples": dw.samples,
        "num_workers": lw.num_workers,
        "loader": lw.dataset_class,
        "worker_cpu_percent": None if lw.cpu is None else 100.0 * lw.cpu,
        "worker_runqueue_wait_s_per_s": lw.runqueue,
        "worker_busy_threads": lw.busy_threads,
        "worker_read_bytes_per_s": lw.read_bytes_per_s,
        "worker_disk_sleep_fraction": lw.blocked,
        "main_process_cpu_percent": None if m.main_cpu is None else 100.0 * m.main_cpu,
        "cpus": round(m.budget.cpus, 2),
        "cause": plan.cause,
        "predicted_gain": plan.gain,
    }
    if gpu is not None:
        evidence["gpu_utilization_percent"] = gpu
    title = f"data wait {pct(m.wait)} of the training loop"
    if gpu is not None:
        title += f" while GPU utilization is {gpu:.0f}%"
    why = _why(ctx)
    if plan.change("workers") is None:
        title += " with no CPU left" if plan.cause in P.OVERSUBSCRIBED or plan.limit in P.CPU_LIMITS else ""
        note = f"{why}: more workers will not help"
        cap = plan.cap_text()
        if cap and plan.cause not in P.OVERSUBSCRIBED:
            note += f" ({cap})"
        if plan.cause in P.OVERSUBSCRIBED:
            # What takes the CPUs, said here: the finding that says more may not be shown.
            note += "; " + _what_takes_the_cpus(ctx)
            if plan.trade:
                note += f"; {plan.trade}"
        elif plan.cause == P.LOADER_IO:
            note += "; read larger chunks, cache or prefetch the data closer to the job"
        else:
            note += ("; make each item cheaper (preprocess offline, decode smaller or lighter samples, cache "
                     "decoded ones) or give the job more CPUs")
        return ctx.found(ID, level, title, evidence, note, span_s=dw.window_s)
    if plan.trade:
        why += f"; {plan.trade}"
    return ctx.found(ID, level, title, evidence, why, parts=("workers",), span_s=dw.window_s)


def _dispatched(ctx: Context) -> Check:
    """The loop waits for rank 0, which loads every rank's batches and broadcasts them
    (Accelerate's dispatch_batches, the default for an IterableDataset): this rank's own
    DataLoader settings change nothing; rank 0's loader, or loading per rank, does."""
    m, dw = ctx.measured, ctx.data_wait()
    wait = m.wait or 0.0
    level = CRITICAL if wait >= T.DATA_WAIT_CRITICAL else WARNING
    ranks = f"all {ctx.trainer.world_size} ranks" if ctx.trainer.world_size else "every rank"
    evidence: E.Dispatched = {"data_wait_fraction": m.wait, "dispatched_fraction": m.wait_dispatched,
                "samples": dw.samples if dw else None, "rank": ctx.trainer.rank, "cause": P.DISPATCHED}
    note = (f"Accelerate dispatches batches: rank 0 loads for {ranks} and broadcasts them, so this rank's own "
            "DataLoader settings change nothing. Give rank 0's DataLoader more workers (its own report sizes "
            "them), or let every rank load its own shard: "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))")
    title = f"data wait {pct(m.wait)} of the training loop, waiting for rank 0 to send this rank's batch"
    return ctx.found(ID, level, title, evidence, note, span_s=dw.window_s if dw else 0.0)


def _why(ctx: Context) -> str:
    """What the workers do, in the user's words, from the plan's cause."""
    m, plan = ctx.measured, ctx.plan
    lw = m.loader
    if lw is None:
        return ""
    cpu = f"{100 * lw.cpu:.0f}%" if lw.cpu is not None else "n/a"
    doing = f" in {lw.doing}" if lw.doing else ""
    # One worker is "the worker", and its figures are not "each" (counts agree in number).
    one = lw.num_workers == 1
    they, each = ("the worker", "") if one else ("the workers", " each")

    def verb(plural: str, singular: str) -> str:
        return singular if one else plural

    if plan.cause == P.LOADER_CPU:
        return f"{they} {verb('compute', 'computes')} ({cpu} CPU{each}{doing})"
    if plan.cause == P.LOADER_IO:
        read = f", reading {lw.read_bytes_per_s / 2**20:.1f} MiB/s{each}" if lw.read_bytes_per_s else ""
        return f"{they} mostly {verb('wait', 'waits')} on I/O ({cpu} CPU{each}{read}{doing})"
    if plan.cause == P.QUOTA:
        return f"{they} {verb('get', 'gets')} {cpu} CPU{each}: the trainer's CPU quota throttles {verb('them', 'it')}"
    if plan.cause == P.BUSY_HOST:
        return f"{they} {verb('get', 'gets')} {cpu} CPU{each}: other processes take the CPUs"
    if plan.cause == P.THREADS:
        busy = f"{lw.busy_threads or 0:.1f} busy threads{each}"
        return f"{they} {verb('run', 'runs')} thread pools ({busy}) on too few CPUs"
    if plan.cause == P.TOO_MANY_WORKERS:
        return f"{they} ({cpu} CPU{each}) and the loop keep the trainer's CPUs busy"
    return f"{they} {verb('are', 'is')} busy ({cpu} CPU{each}{doing})"


def _what_takes_the_cpus(ctx: Context) -> str:
    m, plan = ctx.measured, ctx.plan
    budget = m.budget
    if plan.cause == P.THREADS:
        return "the workers' thread pools outnumber the CPUs: one thread per worker (worker_threads)"
    if plan.cause == P.MAIN_THREADS:
        return "the training loop's own threads take the CPUs its workers need (main_threads)"
    if plan.cause == P.QUOTA:
        throttled = f", throttled in {budget.throttled:.0%} of its periods" if budget.throttled else ""
        return f"its {budget.quota:g}-CPU quota is what limits it{throttled}"
    if plan.cause == P.BUSY_HOST and budget.others_busy >= T.MIN_OTHERS_BUSY:
        cpus = count(budget.cpu_set, "CPU")
        return (f"other processes{busiest(ctx)} keep {budget.others_busy:.1f} of its {cpus} busy: give the job its "
                "own cores or move the other work")
    if plan.cause == P.BUSY_HOST:
        return (f"something outside the job takes its CPUs{busiest(ctx)}: give the job its own cores or move the "
                "other work")
    return "its workers ask for more CPU than its CPUs give"
