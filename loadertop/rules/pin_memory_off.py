"""pin_memory_off: a GPU trainer copies batches from pageable memory."""

from __future__ import annotations

from . import evidence as E
from .base import FINE, UNKNOWN, WARNING, Check, Context
from .loops import loader_call, loader_change

ID = "pin_memory_off"


def check(ctx: Context) -> Check:
    t = ctx.trainer
    if not t.gpus:
        return FINE  # only with GPU evidence: on a CPU job pinning is pointless
    if t.pin_memory_thread is None or not t.workers:
        return UNKNOWN
    if t.pin_memory_thread:
        return FINE
    return ctx.found(
        ID, WARNING, "batches go to the GPU from pageable memory (no pin-memory thread)",
        E.PinMemoryOff(gpus=list(t.gpus), pin_memory_thread=False, num_workers=len(t.workers)),
        f"{loader_call(ctx.measured.loop, ['pin_memory=True'])}, and .to(device, non_blocking=True) in the loop, "
        "so host-to-device copies overlap with compute",
        change=loader_change(ctx.measured.loop, {"pin_memory": True}),
    )
