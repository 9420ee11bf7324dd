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
    if dw is None or not enough_evidence(dw) or dw.main_process_fraction is None:
        return UNKNOWN
    main = dw.main_process_fraction
    if not wait_above(dw, main, T.DATA_WAIT_WARNING) or main < (dw.worker_wait_fraction or 0.0):
        return FINE
    level = CRITICAL if wait_above(dw, main, T.DATA_WAIT_CRITICAL) else WARNING
    evidence = {"main_process_fraction": main, "data_wait_fraction": dw.fraction,
                "num_workers": ctx.num_workers, "samples": dw.samples, "usable_cpus": ctx.usable_cpus}
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
        f"the main process spends {pct(main)} of the loop unpacking batches from workers",
        evidence,
        "batches are expensive to hand over: return fewer, larger tensors (not many small "
        "objects or Python lists), collate in the workers, and use pin_memory=True when "
        "training on a GPU",
        None,
    ), span_s=dw.window_s)
