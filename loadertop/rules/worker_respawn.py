"""worker_respawn: workers are re-created every epoch (persistent_workers=False)."""

from __future__ import annotations

from ..text import count
from . import evidence as E
from . import thresholds as T
from .base import FINE, UNKNOWN, WARNING, Check, Context
from .loops import loader_call, loader_change

ID = "worker_respawn"


def check(ctx: Context) -> Check:
    history = ctx.history(T.RESPAWN_WINDOW_S)
    if len(history) < 2:
        return UNKNOWN
    respawns = history[-1].worker_respawns - history[0].worker_respawns
    if history[0] is history[-1] or respawns < T.RESPAWN_MIN:
        return FINE
    if ctx.persistent_workers:
        return FINE
    starts = [e.time for e in ctx.events("worker_started")]
    exits = [e.time for e in ctx.events("worker_exited")]
    # Start-up cost: from the previous generation's exit to the new workers' first sight.
    gaps = [min(s - x for x in exits if x <= s) for s in starts if any(x <= s for x in exits)]
    seconds = ctx.snap.monotonic - ctx.recent[0].monotonic if ctx.recent else 0.0
    n = ctx.num_workers or len(ctx.trainer.workers)
    generations = respawns / max(1, n)
    evidence: E.WorkerRespawn = {"respawns": respawns, "window_s": seconds, "generations": generations,
                "num_workers": n, "restart_gap_s": max(gaps) if gaps else None}
    every = seconds / generations if generations else None
    return ctx.found(
        ID, WARNING,
        f"{count(respawns, 'worker')} re-created in {seconds:.0f} s" + (f" (every ~{every:.0f} s)" if every else ""),
        evidence,
        "each epoch starts its workers again (dataset copied or re-imported, caches lost): "
        f"{loader_call(ctx.measured.loop, ['persistent_workers=True'])} keeps them alive across epochs",
        change=loader_change(ctx.measured.loop, {"persistent_workers": True}),
    )
