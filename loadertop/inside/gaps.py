"""Data wait of a framework's own loop, from its callbacks: the loop fetches the next batch
between one batch's end and the next one's start, so that gap is the wait (plus the
framework's few µs of bookkeeping). Published through the same /dev/shm file as
`loadertop.watch()`. Used by loadertop.lightning and loadertop.huggingface."""

from __future__ import annotations

import time

from .hook import _config, _Publisher, publisher, tuner_of, worker_pids


class FetchGaps:
    """One loader kind's fetch gaps, published as a watched loader's waits; with tune=True,
    its in-place tuner changes the loader between epochs (the framework builds each epoch's
    iterator after its epoch-start callback)."""

    def __init__(self, name: str, directory: str, loop: str, tune: bool = False) -> None:
        self.name = name
        self.directory = directory
        self.loop = loop  # the framework whose callbacks these are
        self.tune = tune
        self.pub: _Publisher | None = None
        self.tuner = None
        self.fetching_since: int | None = None  # perf_counter_ns when the loop began to fetch
        self.new_iterator = False  # an epoch began: its first batch tells the workers
        self.paused = False

    def start(self, loader, new_iterator: bool = False) -> None:
        """The loop starts fetching (an epoch, a validation run, the step after one)."""
        if self.pub is None:
            self.pub = publisher(self.name, {**_config(first_loader(loader)), "loop": self.loop}, self.directory)
            if self.tune:
                self.tuner = tuner_of(self.pub, self.name)
        self.new_iterator = self.new_iterator or new_iterator
        self.fetching_since = time.perf_counter_ns()
        self.pub.entering()
        if self.tuner is not None:
            if new_iterator:
                inner = first_loader(loader)
                self.tuner.boundary(inner, framework=True)
                self.tuner.begin(inner)
            elif self.paused:
                self.tuner.resume()
        self.paused = False

    def got(self, loader, batch) -> None:
        if self.pub is None or self.fetching_since is None:
            return
        now = time.perf_counter_ns()
        self.pub.record(now - self.fetching_since, batch)
        if self.tuner is not None:
            self.tuner.delivered(now, now - self.fetching_since)
        self.fetching_since = None
        if self.new_iterator:
            # Once an epoch, not every batch: persistent and torchdata loaders keep their
            # iterator, and its workers are there by the first batch.
            self.new_iterator = False
            self.pub.publish_workers(worker_pids(getattr(first_loader(loader), "_iterator", None)))

    def pause(self) -> None:
        """The loop does something else (validation inside an epoch): not a wait for data."""
        self.fetching_since = None
        self.paused = True
        if self.pub is not None:
            self.pub.idle()
        if self.tuner is not None:
            self.tuner.end()

    def close(self) -> None:
        if self.pub is not None:
            self.pub.close()
            self.pub = None


def first_loader(loaders):
    """The first DataLoader in what a framework holds (one loader, a list, a dict, a Lightning
    CombinedLoader): its settings stand for the kind."""
    seen = 0
    stack = [loaders]
    while stack and seen < 64:
        seen += 1
        item = stack.pop(0)
        if hasattr(item, "num_workers") and hasattr(item, "dataset"):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "flattened"):
            stack.extend(item.flattened)
    return loaders
