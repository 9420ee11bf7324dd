"""What the in-place tuner decides, from measured stretches of batches (pure: no I/O).

A stretch is a run of batches at one setting, timed by the hook: its steps per second and
their noise (the spread of its chunks). One change at a time: the tuner tries a setting,
measures it over the next stretch, and keeps it only when it beat the setting before by
more than the noise of the two; otherwise it goes back. The next setting to try is the
plan's (the throughput model's choice, rules/plan.py), else a neighbour in worker count
that the measurements make plausible: more workers only while the loop still waits for
data (the wait bounds what faster loading can gain), fewer only while the trainer's CPUs
are contended. Exploring stops once neither neighbour of the kept setting is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import fmean, stdev
from typing import Any

from ..model import Decision, Knobs
from ..rules import thresholds as T

# A change is kept when its measured gain clears T.NOISE_Z standard errors of the difference
# (two stretches' chunk spreads combined), and this share whatever the noise: a smaller gain
# is not worth a change.
MIN_MEASURED_GAIN = 0.02
# Worker counts the neighbours step through: fine where one worker is a large share, coarse
# where it is not.
LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Chunks a stretch is cut into for its noise: each chunk's rate is one reading.
MAX_CHUNKS = 12
MIN_CHUNK_BATCHES = 4
# Trials before the tuner settles whatever it found: a bound on exploring, not a target.
MAX_TRIALS = 8


def with_workers(knobs: Knobs, n: int) -> Knobs:
    """knobs with n workers (the threads as they are); from 0, torch's default prefetch."""
    if n == 0:
        return replace(knobs, num_workers=0, prefetch_factor=None, worker_threads=None)
    return replace(knobs, num_workers=n, prefetch_factor=knobs.prefetch_factor or 2)


@dataclass(frozen=True)
class Stretch:
    """A run of batches at one setting, as the hook timed them."""

    knobs: Knobs
    batches: int
    seconds: float  # the loop's time over these batches, inside next() and out of it
    wait_s: float  # of it, inside next(): the data wait
    chunks: tuple[float, ...]  # batches per second of consecutive chunks of the stretch
    measured: Any = field(default=None, compare=False, repr=False)  # what the plan reads (rules.measure.Measured)

    @property
    def rate(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return min(1.0, self.wait_s / self.seconds) if self.seconds > 0 else 0.0

    @property
    def relative_error(self) -> float:
        """The standard error of the rate, as a share of it; infinite with too few chunks."""
        if len(self.chunks) < 3 or self.rate <= 0:
            return math.inf
        return stdev(self.chunks) / math.sqrt(len(self.chunks)) / fmean(self.chunks)


def chunk_rates(durations: list[float]) -> tuple[float, ...]:
    """Batches per second of up to MAX_CHUNKS equal runs of consecutive batch durations."""
    n = len(durations)
    k = min(MAX_CHUNKS, n // MIN_CHUNK_BATCHES)
    if k < 1:
        return ()
    out = []
    for i in range(k):
        part = durations[i * n // k : (i + 1) * n // k]
        total = sum(part)
        if total > 0:
            out.append(len(part) / total)
    return tuple(out)


def compare(new: Stretch, old: Stretch) -> tuple[float, float]:
    """(gain, noise): new's steps/s against old's, and T.NOISE_Z standard errors of that ratio."""
    gain = new.rate / old.rate - 1.0 if old.rate > 0 else 0.0
    noise = T.NOISE_Z * math.hypot(new.relative_error, old.relative_error)
    return gain, noise


def better(gain: float, noise: float) -> bool:
    return gain > max(noise, MIN_MEASURED_GAIN)


def neighbours(n: int, low: int, high: int) -> tuple[int | None, int | None]:
    """The worker counts next to n on the ladder, within [low, high] (None: there is none)."""
    below = [v for v in LADDER if low <= v < n]
    above = [v for v in LADDER if n < v <= high]
    return (below[-1] if below else None), (above[0] if above else None)


@dataclass(frozen=True)
class Proposal:
    """Where the model and the measurements of the kept setting say to look next: settings
    in the order to try them, each with why."""

    moves: tuple[tuple[Knobs, str], ...] = ()


class Explorer:
    """The tuner's search over settings: one trial at a time, judged by measurement."""

    def __init__(self, start: Knobs) -> None:
        self.kept = start  # the setting the loop runs on when no trial is in flight
        self.kept_stretch: Stretch | None = None  # its latest measurement
        self.trial: Knobs | None = None
        self.measured: dict[Knobs, Stretch] = {}  # every setting's latest measurement
        self.rejected: set[Knobs] = set()  # trials measured no better than the setting kept then
        self.replaced: set[Knobs] = set()  # settings a faster one replaced
        self.trials = 0
        self.settled = False

    @property
    def current(self) -> Knobs:
        """The setting the loop should run on now."""
        return self.trial or self.kept

    def judge(self, stretch: Stretch) -> Decision | None:
        """A stretch measured at the current setting: a trial is kept or reverted."""
        self.measured[stretch.knobs] = stretch
        if self.trial is None or self.kept_stretch is None:
            self.kept_stretch = stretch
            return None
        gain, noise = compare(stretch, self.kept_stretch)
        old, trial = self.kept, self.trial
        self.trial = None
        if better(gain, noise):
            self.replaced.add(old)
            self.kept, self.kept_stretch = trial, stretch
            return Decision("keep", old, trial, gain, noise)
        self.rejected.add(trial)
        return Decision("revert", trial, old, gain, noise)

    def propose(self, proposal: Proposal) -> Decision | None:
        """The next trial, or settling: from the kept setting's latest measurement."""
        if self.settled or self.trial is not None:
            return None
        for knobs, why in proposal.moves:
            if knobs != self.kept and knobs not in self.rejected | self.replaced and self.trials < MAX_TRIALS:
                self.trial = knobs
                self.trials += 1
                return Decision("try", self.kept, knobs, reason=why)
        self.settled = True
        tried = sorted(self.rejected, key=lambda k: (k.num_workers, k.prefetch_factor or 0))
        reason = "no other setting is likely to be faster" if not tried else \
            f"{', '.join(k.short(self.kept) for k in tried)} measured no faster"
        return Decision("settle", self.kept, self.kept, reason=reason)
