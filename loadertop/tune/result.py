"""What a tune is asked (TuneSpec), the machine it ran on, and what it found (TuneResult):
plain records that the runner fills and the outputs read, so that the outputs never import
the code that starts processes."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import psutil

from ..probes import host as host_probe
from . import grid
from .grid import Config, Summary


@dataclass
class TuneSpec:
    factory: str
    batch_size: int | None = None
    collate: str | None = None
    budget_s: float = 90.0
    workers: list[int] | None = None
    prefetch: list[int] = field(default_factory=lambda: [2, 4])
    pin_memory: str = "auto"  # auto | on | off
    per_step_ms: float | None = None
    first_batch_timeout_s: float = 60.0
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)

    @property
    def metric(self) -> str:
        """With an emulated step each batch is a step; without one, samples are what count."""
        return "steps/s" if self.per_step_ms else "samples/s"


@dataclass
class Machine:
    usable_cpus: int
    other_trainers: int  # DataLoader trainers already running on this machine
    cpu_share: int
    memory_available: int | None

    @classmethod
    def read(cls) -> Machine:
        usable = host_probe.usable_cpus(0) or psutil.cpu_count() or 1
        others = host_probe.scan_dataloaders()[1]
        mem = psutil.virtual_memory().available
        return cls(usable, others, max(1, usable // (others + 1)), mem)


@dataclass
class TuneResult:
    spec: TuneSpec
    machine: Machine
    summaries: list[Summary]
    recommendation: grid.Recommendation | None
    batch_size: int | None
    dataset: str | None
    extra_kwargs: tuple[str, ...]
    cuda: bool
    elapsed_s: float
    stopped: bool  # Ctrl-C
    metric: str  # "samples/s" or "steps/s"
    skipped: tuple[Config, ...] = ()  # not run: the budget was overrun
