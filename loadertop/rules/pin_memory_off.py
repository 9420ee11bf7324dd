"""pin_memory_off: a GPU trainer copies batches from pageable memory."""

from __future__ import annotations

from .base import FINE, UNKNOWN, Check, Context, finding


def check(ctx: Context) -> Check:
    t = ctx.trainer
    if not t.gpus:
        return FINE  # only with GPU evidence: on a CPU job pinning is pointless
    if t.pin_memory_thread is None or not t.workers:
        return UNKNOWN
    if t.pin_memory_thread:
        return FINE
    return Check(0 + 1, finding(
        "pin_memory_off", 1, ctx,
        "batches go to the GPU from pageable memory (no pin-memory thread)",
        {"gpus": list(t.gpus), "pin_memory_thread": False, "num_workers": len(t.workers)},
        "DataLoader(pin_memory=True), and .to(device, non_blocking=True) in the loop, so host-to-"
        "device copies overlap with compute",
        {"DataLoader": {"pin_memory": True}},
    ))
