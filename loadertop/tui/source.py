"""Where the TUI's snapshots come from: a live sampler (with py-spy and the diagnoser) or a
scripted stream (tests, and recordings later). Headless: no Textual import here."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from ..model import Snapshot
from ..rules import Diagnoser
from ..rules.diagnosis import Diagnosis
from . import LIVE_INTERVAL_S


class Source(Protocol):
    """What the app reads snapshots from."""

    live: bool  # real jobs now (the header says LIVE), not a replay
    lockstep: bool  # every snapshot must reach the screen: wait for the UI, never drop one
    interval_s: float  # seconds between two `next()` calls; the app may change it
    diagnoser: Diagnoser  # fed in the sampler's thread only: the UI reads each tick's Diagnosis

    def next(self) -> tuple[Snapshot, Diagnosis] | None:
        """The next snapshot and its judgement; None when the stream has ended."""
        ...

    def close(self) -> None: ...


SMAPS_S_PER_S = 0.001  # smaps read time a second of watching: each of 8 workers every ~80 s here


class LiveSource:
    """Samples real jobs. `next()` runs one tick: call it from a worker thread only."""

    live = True
    lockstep = False  # a slow screen skips snapshots rather than falling behind the jobs

    def __init__(self, pids: list[int], interval_s: float = LIVE_INTERVAL_S, stacks: bool = True) -> None:
        from ..probes.processes import ProcessSampler
        from ..probes.stacks import LIVE, StackSampler
        from ..sampler import Sampler

        # What the live view costs is mostly py-spy and smaps (docs/BENCHMARKS.md §3): the
        # LIVE py-spy profile, and a small smaps budget a second, whatever the tick, that
        # refreshes each worker's USS/PSS every minute or two (copy-on-read growth is slow).
        self.stacks = StackSampler.of(LIVE) if stacks else None
        self.processes = ProcessSampler(slow_budget_s=SMAPS_S_PER_S * interval_s)
        self.sampler = Sampler(pids, interval_s=interval_s, stacks=self.stacks, processes=self.processes)
        self.diagnoser = Diagnoser()
        self._first = True

    @property
    def interval_s(self) -> float:
        return self.sampler.interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self.sampler.interval_s = value
        self.processes.slow_budget_s = SMAPS_S_PER_S * value

    def next(self) -> tuple[Snapshot, Diagnosis] | None:
        # The first tick reads every process's threads and memory at once, whatever the budget:
        # the first answer needs them (busy threads, run-queue waits) within seconds, not minutes.
        snap = self.sampler.tick(complete=self._first)
        self._first = False
        self.diagnoser.feed(snap)
        return snap, self.diagnoser.diagnosis

    def close(self) -> None:
        self.sampler.close()


class ScriptedSource:
    """Plays prepared snapshots (tests, recordings), one per `next()`; None at the end.
    `seek` moves to any snapshot, and the judgement there.

    `judged`: each snapshot's judgement as a recording stored it (outputs/judgement.py): a
    replay shows what was judged then; a tick with none is judged here, by the diagnosis folded
    up to it (only then: a recording that stores every tick's is never judged again)."""

    live = False
    lockstep = True  # every snapshot reaches the screen: none is dropped

    def __init__(self, snapshots: Iterable[Snapshot], interval_s: float = 0.05,
                 judged: Sequence[dict | None] = ()) -> None:
        self.snapshots = list(snapshots)
        self.judged = list(judged)
        self.position = 0
        self.interval_s = interval_s
        self.diagnoser = Diagnoser()
        self._fed = 0  # the diagnoser has been fed snapshots[:_fed]
        self._lock = threading.Lock()

    def _said(self, index: int) -> Diagnosis:
        from ..outputs import judgement

        stored = judgement.at(self.judged, index)
        if stored is not None:
            return stored
        if self._fed > index + 1:  # back in time: fold again from the start
            self.diagnoser, self._fed = Diagnoser(), 0
        for snap in self.snapshots[self._fed: index + 1]:
            self.diagnoser.feed(snap)
        self._fed = max(self._fed, index + 1)
        return self.diagnoser.diagnosis

    def next(self) -> tuple[Snapshot, Diagnosis] | None:
        with self._lock:
            if self.position >= len(self.snapshots):
                return None
            snap = self.snapshots[self.position]
            self.position += 1
            return snap, self._said(self.position - 1)

    def seek(self, position: int) -> tuple[list[Snapshot], Diagnosis]:
        """Go to snapshot `position`; returns the snapshots up to it and the judgement there."""
        with self._lock:
            self.position = max(1, min(len(self.snapshots), position))
            return self.snapshots[: self.position], self._said(self.position - 1)

    def close(self) -> None:
        pass
