"""Reads the files `loadertop.watch()` publishes in a trainer's /dev/shm: exact data wait
without ptrace. Keeps recent readings per loader to give the wait over a rolling window."""

from __future__ import annotations

import os
from collections import deque

from ..hook import read_hook
from ..model import DataWait, LoaderConfig
from . import procfs

# Listing /dev/shm is not for every tick: with torch's file_system sharing strategy it holds
# a file per shared tensor (thousands), and killed jobs leave their semaphores there.
HOOK_RESCAN_S = 5.0


def _listed(folder: str, prefix: str) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".hook")]
    except OSError:
        return []


def hook_files(pid: int) -> list[str]:
    """The trainer's hook files: through its own root (a container's /dev/shm), or our
    /dev/shm when it is the same mount (another user's root is closed to us)."""
    prefix = f"loadertop-{pid}-"
    files = _listed(f"{procfs.PROC}/{pid}/root/dev/shm", prefix)
    if files:
        return files
    if procfs.same_mount_as_ours(pid, "/dev/shm"):
        return _listed("/dev/shm", prefix)
    return []


class HookReader:
    def __init__(self, rolling_s: float = 30.0) -> None:
        self.rolling_s = rolling_s
        self._readings: dict[tuple[int, float], dict[str, deque]] = {}
        self.configs: dict[tuple[int, float], dict[str, dict]] = {}
        self._files: dict[tuple[int, float], tuple[float, list[str]]] = {}  # listed at, files

    def data_wait(self, pid: int, started_at: float, now: float) -> DataWait | None:
        key = (pid, started_at)
        listed = self._files.get(key)
        if listed is None or not now - HOOK_RESCAN_S < listed[0] <= now:
            listed = self._files[key] = (now, hook_files(pid))
        read = [read_hook(f) for f in listed[1]]
        if None in read:
            del self._files[key]  # a loader's file went away: list the folder again next tick
        hooks = [h for h in read if h and h["pid"] == pid and h["started"] >= started_at - 1]
        if not hooks:
            self._readings.pop(key, None)
            return None
        per_loader = self._readings.setdefault(key, {})
        self.configs[key] = {h["name"]: {**h["config"], "batch_bytes": h["batch_bytes"]} for h in hooks}
        waited = batches = 0.0
        span = 0.0
        stalled = 0.0
        rates = []
        for h in hooks:
            # A next() in progress counts as waiting up to now.
            ongoing = max(0.0, now - h["in_next_since"]) if h["in_next_since"] else 0.0
            stalled = max(stalled, ongoing)
            readings = per_loader.setdefault(h["name"], deque())
            readings.append((now, h["wait_s"] + ongoing, h["batches"]))
            while readings and readings[0][0] < now - self.rolling_s:
                readings.popleft()
            first, last = readings[0], readings[-1]
            waited += last[1] - first[1]
            batches += last[2] - first[2]
            span = max(span, last[0] - first[0])
            if last[0] > first[0]:
                rates.append((last[2] - first[2]) / (last[0] - first[0]))
        if span <= 0:
            return None
        fraction = min(1.0, max(0.0, waited / span))
        iterable = {h["config"].get("iterable") for h in hooks} - {None}
        return DataWait(fraction=fraction, worker_wait_fraction=None, main_process_fraction=None, breakdown=(),
                        samples=int(batches), window_s=span, stalled_for_s=stalled, source="hook",
                        # The training loop's steps: its busiest loader's batches.
                        steps_per_s=max(rates) if rates else None,
                        iterable=True if True in iterable else (False if iterable else None))

    def loaders(self, pid: int, started_at: float, worker_pids: tuple[int, ...]) -> tuple[LoaderConfig, ...]:
        """Each watched loader, with the workers it published (those seen under the trainer),
        or every worker seen when it published none."""
        configs = self.configs.get((pid, started_at), {})
        out = []
        for c in configs.values():
            published = set(c.get("worker_pids") or ())
            mine = tuple(p for p in worker_pids if p in published) if published else worker_pids
            out.append(LoaderConfig(c.get("dataset_class"), c.get("num_workers"), c.get("persistent_workers"), mine,
                                    prefetch_factor=c.get("prefetch_factor"), batch_size=c.get("batch_size"),
                                    batch_bytes=c.get("batch_bytes"), iterable=c.get("iterable"), source="hook"))
        return tuple(out)

    def forget(self, live: set) -> None:
        for table in (self._readings, self.configs, self._files):
            for key in [k for k in table if k not in live]:
                del table[key]
