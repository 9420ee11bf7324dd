"""Small built-in datasets for `loadertop tune`, to try it and to test it:

    loadertop tune loadertop.tune.examples:sleepy      # I/O-like: each item waits 4 ms
    loadertop tune loadertop.tune.examples:cpu_bound   # each item computes for 2 ms
    loadertop tune loadertop.tune.examples:large       # 4 MiB samples: /dev/shm pressure

Each factory returns {"dataset": ..., **DataLoader keywords}, one of the shapes tune takes.
This module imports torch: tune imports it only in its trial processes.
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from ..demo.job import calibrate, units_for, work


def _work_per_ms() -> float:
    """Work units per ms of one free core: LOADERTOP_WORK_PER_MS where the caller timed it
    once, so that every trial (each its own process) does the same fixed work; else timed
    here, which on a busy machine makes one trial's item cheaper than another's."""
    try:
        return float(os.environ["LOADERTOP_WORK_PER_MS"])
    except (KeyError, ValueError):
        return calibrate()


class Items(Dataset):
    """`length` items of `floats` float32 each, costing `cpu_ms` of computation (a fixed loop
    count, timed once on a free core) and `sleep_ms` of waiting (a disk or a remote store)."""

    def __init__(self, length: int, floats: int = 1024, cpu_ms: float = 0.0, sleep_ms: float = 0.0) -> None:
        self.length = length
        self.floats = floats
        self.units = units_for(cpu_ms, _work_per_ms()) if cpu_ms else 0
        self.sleep_ms = sleep_ms

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if self.units:
            work(self.units)
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000.0)
        return torch.full((self.floats,), float(i % 251)), i % 10


def sleepy():
    return {"dataset": Items(100_000, sleep_ms=4.0), "batch_size": 16}


def cpu_bound():
    return {"dataset": Items(100_000, cpu_ms=2.0), "batch_size": 16}


def large():
    return {"dataset": Items(10_000, floats=2**20), "batch_size": 4}
