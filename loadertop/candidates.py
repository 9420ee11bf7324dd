"""The training processes on this machine: owners of DataLoader workers, and processes
holding a GPU context. For `loadertop` with no PID."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from .probes import procfs
from .probes.host import dataloader_owners
from .redact import redact_cmdline


@dataclass(frozen=True)
class Candidate:
    pid: int
    workers: int
    on_gpu: bool
    user: str
    command: str


def _user(pid: int) -> str:
    try:
        return psutil.Process(pid).username()
    except (psutil.Error, KeyError):  # gone, refused, or a uid with no name
        return "?"


def find_trainers(gpu_pids: Iterable[int] = ()) -> list[Candidate]:
    counts = dataloader_owners()
    gpu = set(gpu_pids)
    out = []
    for pid in sorted(set(counts) | gpu):
        try:
            args = procfs.cmdline(pid)
        except PermissionError:
            args = None
        if args is None and procfs.read_stat(pid) is None:
            continue
        out.append(Candidate(pid, counts.get(pid, 0), pid in gpu, _user(pid),
                             " ".join(redact_cmdline(args or ["?"]))))
    return out
