"""main_process_bound: the trainer's main thread does the loading work itself."""

from __future__ import annotations

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
)


def check(ctx: Context) -> Check:
    dw = ctx.data_wait()
    if dw is None or not enough_evidence(dw):
        return UNKNOWN
    if dw.stalled_for_s >= T.STALL_S:
        return FINE  # a hang, not a cost: loader_stalled says so
    # Workers idle with their batches done: all of the wait is receiving them, including the
    # fd hand-shakes that py-spy files under waiting for a worker.
    receiving = ctx.num_workers > 0 and ctx.loader_ahead
    main = dw.fraction if receiving else dw.main_process_fraction
    if main is None:
        return UNKNOWN
    if not wait_above(dw, main, T.DATA_WAIT_WARNING):
        return FINE
    if not receiving and main < (dw.worker_wait_fraction or 0.0):
        return FINE
    level = CRITICAL if wait_above(dw, main, T.DATA_WAIT_CRITICAL) else WARNING
    evidence = {"main_process_fraction": main, "data_wait_fraction": dw.fraction,
                "num_workers": ctx.num_workers, "samples": dw.samples, "usable_cpus": ctx.usable_cpus,
                "workers_waiting_for_indices": ctx.loader_ahead}
    if ctx.num_workers == 0:
        new_n = max(1, min(4, ctx.cpu_share - 1))
        after = predicted_wait(main, 1, 1 + new_n) if new_n else main
        return Check(level, finding(
            "main_process_bound", level, ctx,
            f"the main process loads every batch itself ({pct(main)} of the loop, num_workers=0)",
            evidence,
            f"DataLoader(num_workers=0 -> {new_n}, persistent_workers=True) moves loading into "
            f"worker processes, in parallel with training: data wait ~{pct(main)} -> ~{pct(after)}",
            {"DataLoader": {"num_workers": new_n, "persistent_workers": True}},
        ), span_s=dw.window_s)
    return Check(level, finding(
        "main_process_bound", level, ctx,
        f"the main process spends {pct(main)} of the loop receiving batches that workers have ready",
        evidence,
        "more workers will not help: each tensor storage in a batch is a separate shared-memory "
        "hand-over (by default a file-descriptor hand-shake with the sending worker), so return "
        "fewer, larger tensors (not many small ones, objects or Python lists) and collate in the "
        "workers; torch.multiprocessing.set_sharing_strategy('file_system') skips the hand-shake, "
        "and on a busy machine the trainer needs a free CPU to receive",
        None,
    ), span_s=dw.window_s)
