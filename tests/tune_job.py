"""A seeded training loop for tests/test_autotune_live.py: it records the sample indices of
every batch and the worker count each batch came from, with or without `tune=True`, and
says at the end what it saw (one JSON line on stdout).

Items sleep --sleep-ms (a slow disk), so more workers are faster on any machine and the
tuner has a change to make; the step draws from the global RNG as a real one does
(dropout, augmentation in the loop), so a tuner that consumed the RNG would show in the
sample order.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

import loadertop
from loadertop.autotune import tuner as TU


class Indexed(Dataset):
    def __init__(self, length: int, sleep_ms: float) -> None:
        self.length = length
        self.sleep_ms = sleep_ms

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        time.sleep(self.sleep_ms / 1000.0)
        return torch.tensor(i)


def torch_segments() -> int | None:
    """torch's shared-memory segments this process maps now (None: /proc is hidden)."""
    try:
        with open("/proc/self/maps") as f:
            return len(set(re.findall(r"/dev/shm/(torch_\S+)", f.read())))
    except OSError:
        return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tune", action="store_true")
    p.add_argument("--stateful", action="store_true", help="torchdata's StatefulDataLoader, one long epoch")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--items", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sleep-ms", type=float, default=8.0)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--stretch-s", type=float, default=None, help="the tuner's least stretch (tests: shorter)")
    args = p.parse_args()
    if args.stretch_s is not None:
        TU.MIN_STRETCH_S = TU.MID_EPOCH_STRETCH_S = args.stretch_s
    torch.manual_seed(0)
    torch.set_num_threads(1)
    kwargs = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                  persistent_workers=args.persistent and args.workers > 0)
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(Indexed(args.items, args.sleep_ms), **kwargs)
    else:
        loader = DataLoader(Indexed(args.items, args.sleep_ms), **kwargs)
    watched = loadertop.watch(loader, name="tuned", tune=args.tune) if args.tune else loader
    batches: list[list[int]] = []
    workers: list[int] = []
    pids: set[int] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(args.epochs):
            for batch in watched:
                batches.append(batch.tolist())
                workers.append(loader.num_workers)
                it = loader._iterator
                pids.update(w.pid for w in getattr(it, "_workers", ()) if w.pid)
                torch.rand(3)  # the step's own draw from the global RNG
                time.sleep(args.step_ms / 1000.0)
    tune = watched._tuner.as_dict() if args.tune else None
    alive = loader._iterator is not None and getattr(loader._iterator, "_workers", None) or []
    current = {w.pid for w in alive}
    gone = sorted(pids - current)
    print(json.dumps({
        "batches": batches, "workers": workers, "tune": tune,
        "warnings": [str(w.message) for w in caught if "loadertop" in str(w.message)],
        "old_workers_left": [pid for pid in gone if os.path.exists(f"/proc/{pid}")],
        "old_workers": len(gone), "torch_segments": torch_segments(),
    }))


if __name__ == "__main__":
    main()
