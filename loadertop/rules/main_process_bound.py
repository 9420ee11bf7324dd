"""main_process_bound: the trainer's main thread does the loading work itself."""

from __future__ import annotations

from . import evidence as E
from . import plan as P
from . import thresholds as T
from .base import CRITICAL, FINE, UNKNOWN, WARNING, Check, Context, enough_evidence, pct, wait_above
from .waits_for_rank import waits_for_another

ID = "main_process_bound"


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None or not enough_evidence(dw):
        return UNKNOWN
    m, plan = ctx.measured, ctx.plan
    if plan.cause == P.STALLED:
        return FINE  # a hang, not a cost: loader_stalled says so
    receiving = plan.cause == P.RECEIVING
    main = m.wait if receiving else m.wait_main
    if main is None:
        return UNKNOWN
    if plan.cause not in (P.MAIN_LOADING, P.RECEIVING) or not wait_above(dw, main, T.DATA_WAIT_WARNING):
        return FINE
    if waits_for_another(ctx):
        return FINE  # its wait is slack the gradient sync absorbs: waits_for_rank says so
    level = CRITICAL if wait_above(dw, main, T.DATA_WAIT_CRITICAL) else WARNING
    evidence: E.MainProcessBound = {
                "main_process_fraction": main, "data_wait_fraction": m.wait, "num_workers": m.num_workers,
                "samples": dw.samples, "cpus": round(m.budget.cpus, 2),
                "workers_waiting_for_indices": bool(m.loader and m.loader.ahead),
                "predicted_gain": plan.gain}
    if m.num_workers == 0:
        note = "loading moves into worker processes, in parallel with training"
        if m.iterable:
            note += ("; an IterableDataset must shard its stream across workers with "
                     "torch.utils.data.get_worker_info(), or every worker yields the whole dataset")
        return ctx.found(ID, level, f"the main process loads every batch itself ({pct(main)} of the loop, "
                         "num_workers=0)", evidence, note, parts=("workers",), span_s=dw.window_s)
    title = (f"the main process spends {pct(main)} of the loop receiving batches that workers have ready"
             if receiving else f"the main process spends {pct(main)} of the loop on loading work inside next()")
    return ctx.found(ID, level, title, evidence,
                     "more workers will not help: each tensor storage in a batch is a separate shared-memory "
                     "hand-over (by default a file-descriptor hand-shake with the sending worker), so return "
                     "fewer, larger tensors (not many small ones, objects or Python lists) and collate in the "
                     "workers; torch.multiprocessing.set_sharing_strategy('file_system') skips the hand-shake, "
                     "and on a busy machine the trainer needs a free CPU to receive", span_s=dw.window_s)
