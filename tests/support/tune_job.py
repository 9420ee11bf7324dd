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
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

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


class Sharded(IterableDataset):
    """Items 0..length-1, each worker yielding its share (i % workers == worker id): the epoch
    yields every item once whatever the count, in an order that depends on it."""

    def __init__(self, length: int, sleep_ms: float, batches_of: int = 0) -> None:
        self.length = length
        self.sleep_ms = sleep_ms
        self.batches_of = batches_of  # > 0: it batches itself (webdataset's `.batched(n)`)

    def __iter__(self):
        info = get_worker_info()
        wid, count = (info.id, info.num_workers) if info is not None else (0, 1)
        batch: list[int] = []
        for i in range(wid, self.length, count):
            time.sleep(self.sleep_ms / 1000.0)
            if not self.batches_of:
                yield torch.tensor(i)
                continue
            batch.append(i)
            if len(batch) == self.batches_of:
                yield torch.tensor(batch)
                batch = []
        if batch:
            yield torch.tensor(batch)


def fail_first_change(loader, start: int) -> None:
    """The first iterator started at another worker count fails as on a full /dev/shm (where
    torch's queues cannot be made): a change the tuner makes cannot start."""
    build = loader._get_iterator
    failed = []

    def get_iterator():
        if loader.num_workers != start and not failed:
            failed.append(loader.num_workers)
            raise OSError(28, "No space left on device")
        return build()

    loader._get_iterator = get_iterator


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
    p.add_argument("--iterable", action="store_true", help="an IterableDataset sharded by worker")
    p.add_argument("--self-batching", action="store_true",
                   help="with --iterable: the dataset yields batches, the loader has batch_size=None")
    p.add_argument("--fail-change", action="store_true", help="the first change's iterator fails to start")
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
    batches_of = args.batch_size if args.self_batching else 0
    dataset = Sharded(args.items, args.sleep_ms, batches_of) if args.iterable else Indexed(args.items, args.sleep_ms)
    kwargs = dict(batch_size=None if batches_of else args.batch_size, shuffle=not args.iterable, num_workers=args.workers,
                  persistent_workers=args.persistent and args.workers > 0)
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(dataset, **kwargs)
    else:
        loader = DataLoader(dataset, **kwargs)
    if args.fail_change:
        fail_first_change(loader, args.workers)
    watched = (loadertop.watch(loader, name="tuned", tune=True, shards_by_worker=args.iterable)
               if args.tune else loader)
    batches: list[list[int]] = []
    epochs: list[list[int]] = []  # every item each epoch yielded
    workers: list[int] = []
    epoch_workers: list[list[int]] = []  # the worker counts each epoch's batches came from
    pids: set[int] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(args.epochs):
            epochs.append([])
            counts = set()
            for batch in watched:
                batches.append(batch.tolist())
                epochs[-1].extend(batch.tolist())
                counts.add(loader.num_workers)
                workers.append(loader.num_workers)
                it = loader._iterator
                pids.update(w.pid for w in getattr(it, "_workers", ()) if w.pid)
                torch.rand(3)  # the step's own draw from the global RNG
                time.sleep(args.step_ms / 1000.0)
            epoch_workers.append(sorted(counts))
    tune = watched._tuner.as_dict() if args.tune else None
    alive = loader._iterator is not None and getattr(loader._iterator, "_workers", None) or []
    current = {w.pid for w in alive}
    gone = sorted(pids - current)
    print(json.dumps({
        "batches": batches, "epochs": epochs, "epoch_workers": epoch_workers, "workers": workers, "tune": tune,
        "warnings": [str(w.message) for w in caught if "loadertop" in str(w.message)],
        "old_workers_left": [pid for pid in gone if os.path.exists(f"/proc/{pid}")],
        "old_workers": len(gone), "torch_segments": torch_segments(),
    }))


if __name__ == "__main__":
    main()
