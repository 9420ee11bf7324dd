"""Where the TUI's snapshots come from: a live sampler (with py-spy and the diagnoser) or a
scripted stream (tests, and recordings later). Headless: no Textual import here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..model import Finding, Snapshot
from ..rules import Diagnoser


class LiveSource:
    """Samples real jobs. `next()` runs one tick: call it from a worker thread only."""

    live = True

    def __init__(self, pids: list[int], interval_s: float = 1.0, stacks: bool = True) -> None:
        from ..probes.stacks import StackSampler
        from ..sampler import Sampler

        self.stacks = StackSampler(window_s=5, rolling_s=30.0, dump_interval_s=2.0) if stacks else None
        self.sampler = Sampler(pids, interval_s=interval_s, stacks=self.stacks)
        self.diagnoser = Diagnoser()

    @property
    def interval_s(self) -> float:
        return self.sampler.interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self.sampler.interval_s = value

    def next(self) -> tuple[Snapshot, list[Finding]] | None:
        snap = self.sampler.tick()
        return snap, self.diagnoser.feed(snap)

    def close(self) -> None:
        self.sampler.close()


class ScriptedSource:
    """Plays prepared snapshots, one per `next()`; then returns None (the stream ended)."""

    live = False
    lockstep = True  # every snapshot reaches the screen: none is dropped

    def __init__(self, snapshots: Iterable[Snapshot], interval_s: float = 0.05) -> None:
        self._it: Iterator[Snapshot] = iter(snapshots)
        self.interval_s = interval_s
        self.diagnoser = Diagnoser()

    def next(self) -> tuple[Snapshot, list[Finding]] | None:
        snap = next(self._it, None)
        if snap is None:
            return None
        return snap, self.diagnoser.feed(snap)

    def close(self) -> None:
        pass
