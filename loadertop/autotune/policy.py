"""What the in-place tuner decides, from measured stretches of batches (pure: no I/O).

A stretch is a run of batches at one setting, timed by the hook: its steps per second and
their noise (the spread of its chunks). One change at a time, measured interleaved: the
setting kept (A), the trial (B), then A again. B is kept only when it beats both readings of
A by more than their noise and by more than the host moved A between them (a busy host's
other work comes and goes: a trial compared with the stretch before it alone wins or loses
with the host's load). Where A moved more than its noise and B's result is not clear, B and
A are measured once more. The next setting to try is the
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
# CPUs by which the other processes' load during a trial may differ from theirs while the
# setting kept was read around it: beyond, the trial is measured once more.
HOST_MOVED_CPUS = 0.5
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
    def others_busy(self) -> float | None:
        """CPUs other processes kept busy on the loop's CPUs over the stretch, where read."""
        budget = getattr(self.measured, "budget", None)
        return getattr(budget, "others_busy", None)

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


@dataclass(frozen=True)
class Bracketed:
    """A trial against the setting kept, measured before it and after it."""

    gain: float  # the trial's steps/s against the mean of the two readings of the setting kept
    noise: float  # T.NOISE_Z standard errors of that ratio, and how far the host moved it
    moved: float  # half the relative difference of the two readings of the setting kept
    statistical: float  # the noise of the three stretches alone
    host_moved: float = 0.0  # CPUs the other processes' load during the trial differed from theirs around it


def bracket(trial: Stretch, before: Stretch, after: Stretch) -> Bracketed:
    """trial's steps/s against the setting kept, read before and after it: a drift of the
    host's load that is linear over the three cancels in the mean; what it moved beyond that
    (a step) is counted as noise."""
    reference = (before.rate + after.rate) / 2
    if reference <= 0:
        return Bracketed(0.0, math.inf, 0.0, math.inf)
    gain = trial.rate / reference - 1.0
    moved = abs(after.rate - before.rate) / reference / 2
    statistical = T.NOISE_Z * math.hypot(trial.relative_error,
                                         math.hypot(before.relative_error, after.relative_error) / 2)
    others = (trial.others_busy, before.others_busy, after.others_busy)
    host_moved = abs(others[0] - (others[1] + others[2]) / 2) if None not in others else 0.0  # type: ignore[operator]
    return Bracketed(gain, math.hypot(statistical, moved), moved, statistical, host_moved)


def revert_reason(b: Bracketed, kept: str) -> str:
    """Why a bracketed trial was not kept, in one line."""
    if not math.isfinite(b.noise):
        return "too few batches to tell it from " + kept
    if b.host_moved >= HOST_MOVED_CPUS:
        return f"other processes used {b.host_moved:.1f} CPUs more or less during it than around it"
    if b.gain <= -b.noise:
        return f"slower than {kept} measured before and after it"
    if b.moved > b.statistical:
        return f"not clear of the host's load, which moved {kept} by ±{b.moved:.0%} around it"
    if b.gain > b.noise:
        return f"a gain under {MIN_MEASURED_GAIN:.0%} is not worth a change"
    return f"within the noise of {kept} measured before and after it"


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
    # The model's predicted gain of a move over the kept setting, where it gives one: carried
    # by the trial's decisions, so that what it measured is read beside what was predicted.
    predicted: tuple[tuple[Knobs, float], ...] = ()


class Explorer:
    """The tuner's search over settings: one trial at a time, judged by measurement."""

    def __init__(self, start: Knobs) -> None:
        self.kept = start  # the setting the loop runs on when no trial is in flight
        self.kept_stretch: Stretch | None = None  # its latest measurement
        self.trial: Knobs | None = None
        # The trial's measurement while the setting kept is measured again after it (A B A).
        self.trial_stretch: Stretch | None = None
        self.trial_predicted: float | None = None  # the model's gain for the trial in flight
        self.rounds = 0  # rounds of the trial in flight (one more where the host moved)
        self.measured: dict[Knobs, Stretch] = {}  # every setting's latest measurement
        self.rejected: set[Knobs] = set()  # trials measured no better than the setting kept then
        self.replaced: set[Knobs] = set()  # settings a faster one replaced
        self.trials = 0
        self.settled = False

    @property
    def current(self) -> Knobs:
        """The setting the loop should run on now: the trial, or the setting kept (also while
        it is measured again after the trial)."""
        return self.trial if self.trial is not None and self.trial_stretch is None else self.kept

    @property
    def bracketing(self) -> bool:
        """The trial is measured: the setting kept runs again to read the host after it."""
        return self.trial_stretch is not None

    @property
    def against(self) -> Stretch | None:
        """The stretch the one in progress is judged against (None: the setting kept's own)."""
        if self.trial is None:
            return None
        return self.trial_stretch or self.kept_stretch

    def drop_trial(self) -> None:
        """The trial in flight is dropped unjudged (another rank decides meanwhile)."""
        self.trial, self.trial_stretch, self.rounds, self.trial_predicted = None, None, 0, None

    def judge(self, stretch: Stretch) -> Decision | None:
        """A stretch measured at the current setting: after the trial's and the setting kept's
        once more, the trial is kept or reverted."""
        self.measured[stretch.knobs] = stretch
        if self.trial is None or self.kept_stretch is None:
            self.kept_stretch = stretch
            return None
        if self.trial_stretch is None:
            self.trial_stretch = stretch  # B: now A again
            return None
        old, trial, predicted = self.kept, self.trial, self.trial_predicted
        b = bracket(self.trial_stretch, self.kept_stretch, stretch)
        if self.rounds == 0 and (b.host_moved >= HOST_MOVED_CPUS or (
                abs(b.gain) <= b.noise and b.moved > b.statistical)):
            # The other processes' load differed during the trial, or the setting kept moved
            # more than its noise and left the trial unclear: once more.
            self.kept_stretch, self.trial_stretch, self.rounds = stretch, None, 1
            return None
        if better(b.gain, b.noise):
            self.replaced.add(old)
            self.kept, self.kept_stretch = trial, self.trial_stretch
            self.drop_trial()
            return Decision("keep", old, trial, b.gain, b.noise, predicted=predicted)
        self.rejected.add(trial)
        self.kept_stretch = stretch
        self.drop_trial()
        return Decision("revert", trial, old, b.gain, b.noise, reason=revert_reason(b, old.short(trial)),
                        predicted=predicted)

    def propose(self, proposal: Proposal) -> Decision | None:
        """The next trial, or settling: from the kept setting's latest measurement."""
        if self.settled or self.trial is not None:
            return None
        for knobs, why in proposal.moves:
            if knobs != self.kept and knobs not in self.rejected | self.replaced and self.trials < MAX_TRIALS:
                self.trial, self.trial_stretch, self.rounds = knobs, None, 0
                self.trial_predicted = dict(proposal.predicted).get(knobs)
                self.trials += 1
                return Decision("try", self.kept, knobs, reason=why, predicted=self.trial_predicted)
        self.settled = True
        tried = sorted(self.rejected, key=lambda k: (k.num_workers, k.prefetch_factor or 0))
        reason = "no other setting is likely to be faster" if not tried else \
            f"{', '.join(k.short(self.kept) for k in tried)} measured no faster"
        return Decision("settle", self.kept, self.kept, reason=reason)
