"""Who waits for whom in a job of many ranks (pure): one function over per-rank figures, used
on one node (from the sampler's snapshots, `job_figures`) and for a fleet (from the figures
the node agents export to Prometheus).

The ranks of a DDP/FSDP job step in lockstep: the gradient all-reduce inside backward() makes
every rank wait for the slowest, so each rank's step lasts the same time and one rank alone
cannot tell waiting from working. Side by side they can (docs/RULES.md, "Jobs of many ranks"):

- data wait: the share of a rank's loop inside next() for its own loader (py-spy or the hook);
- sync: the share of its loop blocked in the gradient sync and the device waits behind it.
  With py-spy, the samples in backward() and device syncs; without it (the hook), the share
  the loop's thread was neither on a CPU, nor queued for one, nor in next() (/proc). Both hold
  compute as well as waiting (backward's own work, a step that sleeps while a device
  computes), alike on every rank of one job: what one rank has above the job's lowest is its
  wait for the others. Ranks are compared by one method, the one every rank has.

An input straggler is the rank whose data wait stands above the others' while they wait in the
sync; a step straggler the rank that waits least in the sync while the others wait for it and no
loader is behind; otherwise the job is balanced and each rank's verdict is its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, median, stdev
from typing import Literal

from ..model import Snapshot, TrainerSnapshot
from . import thresholds as T

StragglerCause = Literal["input", "step"]

# A rank waits for another's data only where its own data wait is at most this share of that
# rank's. In lockstep the ranks' waits split: balanced ranks on one slow-ish worker each read
# 0.70 and 0.55 for epochs on end (the one whose worker is a little behind shows the job's wait,
# the other part of it as sync wait), a gap of 15 points; a rank that waits for a slow shard
# reads near 0 beside its 0.8.
STRAGGLER_SHARE = 0.5


# --- who waits for whom: the one rule -------------------------------------------------------
# The monitor (`attribute`, on one node and for the fleet), the tuner's roles
# (autotune/rank_roles.py, ranks_board.py) and the alert rule (docs/prometheus/alerts.yml, tested against it) all
# say "rank B waits for rank A's data" by these two functions.


def stands_out(wait: float, others: Sequence[float], gap: float = T.RANK_GAP) -> bool:
    """A rank whose data wait is `wait` holds back ranks whose waits are `others`: its wait is
    critical and stands `gap` above their median."""
    return bool(others) and wait >= T.DATA_WAIT_CRITICAL and wait - median(others) >= gap


def waits_for(mine: float, theirs: float, gap: float = T.RANK_GAP, share: float = STRAGGLER_SHARE) -> bool:
    """A rank whose data wait is `mine` waits for one whose wait is `theirs` (in the sync):
    theirs stands `gap` above, and mine is at most `share` of it."""
    return theirs - mine >= gap and mine <= share * theirs


def input_straggler(waits: dict[int, float], gap: float = T.RANK_GAP,
                    share: float = STRAGGLER_SHARE) -> tuple[int, tuple[int, ...]] | None:
    """By their data waits alone (rank -> wait): the rank that holds the others back, and the
    ranks that wait for it; None where none does."""
    if len(waits) < 2:
        return None
    slowest = max(waits, key=lambda r: (waits[r], -r))
    others = [w for r, w in waits.items() if r != slowest]
    if not stands_out(waits[slowest], others, gap):
        return None
    waiting = tuple(sorted(r for r, w in waits.items() if r != slowest and waits_for(w, waits[slowest], gap, share)))
    return (slowest, waiting) if waiting else None


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures over a window: what the attribution compares."""

    rank: int
    node: str
    pid: int | None
    data_wait: float | None  # share of its loop in next() for its own loader
    sync_frames: float | None = None  # share in backward() and device syncs (py-spy's samples)
    sync_blocked: float | None = None  # share blocked outside next(): not on a CPU nor queued (/proc)
    steps_per_s: float | None = None
    world_size: int | None = None
    # Standard errors of the two sync shares (0: unknown): py-spy's binomial sampling error,
    # and the spread of the blocked share from tick to tick over the window.
    frames_error: float = 0.0
    blocked_error: float = 0.0


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    pid: int | None
    cause: StragglerCause


@dataclass(frozen=True)
class Attribution:
    """The job's ranks compared: the straggler (or None: balanced, or cannot tell), the ranks
    that wait for it, each rank's wait for the others (share of its loop, where measured),
    and what the straggler costs the job (the share of the waiting ranks' loop they wait)."""

    ranks: tuple[RankFigures, ...]  # by rank
    straggler: Straggler | None
    waiting: tuple[int, ...] = ()
    waits: tuple[tuple[int, float], ...] = ()  # (rank, its wait for the others)
    cost: float | None = None
    method: Literal["frames", "blocked"] | None = None

    @property
    def balanced(self) -> bool:
        return self.straggler is None and len(self.ranks) >= 2 and self.method is not None

    def wait_of(self, rank: int) -> float | None:
        return dict(self.waits).get(rank)

    @property
    def world_size(self) -> int | None:
        sizes = {r.world_size for r in self.ranks if r.world_size}
        return max(sizes) if sizes else None


def attribute(ranks: Sequence[RankFigures]) -> Attribution:
    """Who the job waits for, from its ranks' figures side by side."""
    ranks = tuple(sorted(ranks, key=lambda r: r.rank))
    if len(ranks) < 2:
        return Attribution(ranks, None)
    method, syncs = _sync_method(ranks)
    floor = min(syncs.values(), default=0.0)
    waits = {rank: max(0.0, s - floor) for rank, s in syncs.items()}
    # A wait counts past RANK_WAIT and past the noise of the two shares it compares: two
    # balanced ranks sampled ~100 times each by py-spy differ by 10-15 points by chance, and
    # on a crowded host their blocked shares swing as much while one is descheduled.
    lowest = min(ranks, key=lambda r: syncs.get(r.rank, 0.0)) if syncs else None

    def in_sync(r: RankFigures) -> bool:
        """It waits for the others in the gradient sync, past the noise."""
        margin = _noise(r, lowest, method) if lowest is not None else 0.0
        return waits.get(r.rank, 0.0) >= T.RANK_WAIT + margin
    waits_t = tuple(sorted(waits.items()))
    by_data = input_straggler({r.rank: r.data_wait for r in ranks if r.data_wait is not None})
    if by_data is not None:
        # The others wait for it where the sync says so too; a job whose ranks do not step in
        # lockstep (no gradient sync) has no one waiting.
        slowest = next(r for r in ranks if r.rank == by_data[0])
        waiting = tuple(r.rank for r in ranks if r.rank in by_data[1] and in_sync(r))
        if waiting:
            cost = median(waits[r] for r in waiting)
            return Attribution(ranks, _straggler(slowest, "input"), waiting, waits_t, cost, method)
    if waits and lowest is not None:
        fastest_sync = lowest  # the rank that waits least in the sync: the others wait for it
        waiting = tuple(r.rank for r in ranks if r is not fastest_sync and in_sync(r))
        behind = fastest_sync.data_wait is not None and fastest_sync.data_wait >= T.DATA_WAIT_CRITICAL
        # Most of the others wait for it (one slow rank among many, not one fast one).
        if waiting and 2 * len(waiting) >= len(ranks) - 1 and not behind:
            cost = median(waits[r] for r in waiting)
            return Attribution(ranks, _straggler(fastest_sync, "step"), waiting, waits_t, cost, method)
    return Attribution(ranks, None, (), waits_t, None, method)


def _noise(r: RankFigures, lowest: RankFigures, method: Literal["frames", "blocked"] | None) -> float:
    """Two standard errors of the difference of two ranks' sync shares."""
    def error(x: RankFigures) -> float:
        return x.frames_error if method == "frames" else x.blocked_error if method == "blocked" else 0.0
    return T.NOISE_Z * math.hypot(error(r), error(lowest))


def _straggler(r: RankFigures, cause: StragglerCause) -> Straggler:
    return Straggler(r.rank, r.node, r.pid, cause)


def _sync_method(ranks: Sequence[RankFigures]) -> tuple[Literal["frames", "blocked"] | None, dict[int, float]]:
    """One method every rank has: py-spy's frames first, else /proc's blocked share."""
    if all(r.sync_frames is not None for r in ranks):
        return "frames", {r.rank: r.sync_frames or 0.0 for r in ranks}
    if all(r.sync_blocked is not None for r in ranks):
        return "blocked", {r.rank: r.sync_blocked or 0.0 for r in ranks}
    return None, {}


# --- from the sampler's snapshots (one node) --------------------------------------------------


def rank_figures(snap: Snapshot, trainer: TrainerSnapshot, recent: Sequence[Snapshot]) -> RankFigures | None:
    """A running rank's figures over its data wait's window; None for a process with no rank."""
    if trainer.rank is None or trainer.status != "running":
        return None
    dw = trainer.data_wait
    wait = dw.fraction if dw is not None else None
    frames = None
    frames_error = 0.0
    if dw is not None and dw.source == "py-spy" and dw.samples >= T.MIN_STACK_SAMPLES:
        parts = dict(dw.breakdown)
        frames = parts.get("backward", 0.0) + parts.get("device_sync", 0.0)
        frames_error = math.sqrt(frames * (1 - frames) / dw.samples)
    window = dw.window_s if dw is not None else T.WINDOW_MIN_S
    span = max(T.WINDOW_MIN_S, min(T.WINDOW_MAX_S, window))
    key = (trainer.pid, trainer.started_at)
    own = [t for s in recent if s.monotonic >= snap.monotonic - span for t in s.trainers
           if (t.pid, t.started_at) == key]
    blocked, blocked_error = None, 0.0
    # The main thread's time on a CPU and queued for one, tick by tick (each tick's figures
    # are rates since the one before): a few ticks at least, for their spread.
    ticks = [(t.main.main_thread_cpu, t.main.main_thread_runqueue_s_per_s or 0.0) for t in own
             if t.main.main_thread_cpu is not None]
    if len(ticks) >= T.MIN_RANK_TICKS and wait is not None:
        # What of next() is blocked (the rest is the loop's own loading work, on a CPU).
        in_next = max(0.0, wait - (dw.main_process_fraction or 0.0) if dw is not None else wait)
        shares = [1.0 - cpu - queued - in_next for cpu, queued in ticks]
        blocked = max(0.0, fmean(shares))
        blocked_error = stdev(shares) / math.sqrt(len(shares))
    return RankFigures(trainer.rank, snap.host.hostname, trainer.pid, wait, frames, blocked,
                       dw.steps_per_s if dw is not None else None, trainer.world_size,
                       frames_error=frames_error, blocked_error=blocked_error)


def jobs_of(snap: Snapshot) -> dict[str, list[TrainerSnapshot]]:
    """The running trainers of each job, by the job's name."""
    out: dict[str, list[TrainerSnapshot]] = {}
    for t in snap.trainers:
        out.setdefault(t.job, []).append(t)
    return out


def attributions(snap: Snapshot, recent: Sequence[Snapshot]) -> dict[str, Attribution]:
    """Each job of the snapshot with two ranks or more, its ranks compared. The diagnoser
    works it out once a tick and hands it to every rank's rules and to every output
    (Diagnosis.jobs)."""
    out = {}
    for job, trainers in jobs_of(snap).items():
        figures = [f for t in trainers if (f := rank_figures(snap, t, recent)) is not None]
        if len({f.rank for f in figures}) >= 2:
            out[job] = attribute(figures)
    return out


def view_order(snap: Snapshot, compared: dict[str, Attribution]) -> list[TrainerSnapshot]:
    """The trainers as a job view lists them: job by job, in each the rank the others wait
    for first, then the ranks by their own data wait (what they would cost if the straggler
    were fixed), then by rank."""
    out: list[TrainerSnapshot] = []
    for job, trainers in jobs_of(snap).items():
        att = compared.get(job)
        straggler = att.straggler.pid if att is not None and att.straggler is not None else None

        def cost(t: TrainerSnapshot, straggler: int | None = straggler) -> tuple:
            wait = t.data_wait.fraction if t.data_wait is not None and t.data_wait.fraction is not None else -1.0
            return (t.pid != straggler, -wait, t.rank if t.rank is not None else -1, t.pid)

        out += sorted(trainers, key=cost)
    return out
