"""What `loadertop tune` tries and what it recommends: pure functions over measured trials.

The grid: num_workers × prefetch_factor × pin_memory, persistent workers on, bounded by this
job's share of the usable CPUs. The recommendation is the "Goldilocks" point: the cheapest
setting (fewest workers, then the shallowest prefetch, then no pinning) whose throughput is
within TOLERANCE of the best, or indistinguishable from it, among the settings that stayed
within the memory and /dev/shm limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean, stdev

# The monitor's thresholds, the same numbers for measured settings: within TOLERANCE of the
# best; a peak /dev/shm use above SHM_LIMIT of its size, or a loader's PSS above MEMORY_LIMIT
# of the memory available at start, is left out; NOISE_Z; at most MAX_WORKERS.
from ..rules.thresholds import MAX_WORKERS, MEMORY_LIMIT, NOISE_Z, SHM_LIMIT, TOLERANCE


@dataclass(frozen=True, order=True)
class Config:
    """Ordered by cost: the first of two equally fast settings is the cheaper one."""

    num_workers: int
    prefetch_factor: int | None  # None with num_workers=0: there is nothing to prefetch
    pin_memory: bool

    def label(self) -> str:
        parts = [f"workers={self.num_workers}"]
        if self.prefetch_factor is not None:
            parts.append(f"prefetch={self.prefetch_factor}")
        if self.pin_memory:
            parts.append("pin")
        return " ".join(parts)

    def dataloader_line(self, batch_size: int | None, extra: tuple[str, ...] = ()) -> str:
        args = ["dataset"]
        if batch_size:
            args.append(f"batch_size={batch_size}")
        args.append(f"num_workers={self.num_workers}")
        if self.num_workers > 0:
            args += [f"prefetch_factor={self.prefetch_factor}", "persistent_workers=True"]
        args.append(f"pin_memory={self.pin_memory}")
        args += [f"{k}=..." for k in extra]
        return f"DataLoader({', '.join(args)})"


def default_workers(cpu_share: int) -> list[int]:
    """0, then powers of two up to twice this job's CPUs (I/O-bound loaders gain past the
    cores), with the CPU count itself and one less (a CPU left for the training loop)."""
    cpu_share = max(1, cpu_share)
    top = min(MAX_WORKERS, 2 * cpu_share)
    values = {0, 1, cpu_share, max(1, cpu_share - 1), top}
    n = 2
    while n <= top:
        values.add(n)
        n *= 2
    return sorted(v for v in values if v <= top)


def grid(workers: list[int], prefetch: list[int], pin: list[bool]) -> list[Config]:
    configs = set()
    for w in workers:
        for p in pin:
            if w == 0:
                configs.add(Config(0, None, p))
            else:
                configs.update(Config(w, f, p) for f in prefetch)
    return sorted(configs)


@dataclass
class Trial:
    """One run of one configuration."""

    config: Config
    rate: float | None = None  # samples/s, or steps/s with an emulated step
    chunk_rates: list[float] = field(default_factory=list)
    batches_per_s: float | None = None
    samples_per_s: float | None = None
    data_wait: float | None = None  # share of the window spent in next(loader)
    first_batch_s: float | None = None
    worker_cpu_percent: float | None = None  # mean of one worker
    main_cpu_percent: float | None = None
    busy_threads_per_worker: float | None = None
    ctx_switches_per_s: float | None = None  # all processes, voluntary + involuntary
    rss_bytes: int | None = None  # peak, main process and workers
    pss_bytes: int | None = None  # at the end of the window, where smaps could be read
    uss_bytes: int | None = None
    shm_peak_bytes: int | None = None
    shm_total_bytes: int | None = None
    error: str | None = None
    stopped: bool = False  # Ctrl-C during this trial


@dataclass
class Summary:
    """Every run of one configuration, pooled."""

    config: Config
    trials: list[Trial]
    rate: float | None
    stderr: float | None
    excluded: str | None  # why it cannot be recommended (an error, a limit)

    @property
    def last(self) -> Trial:
        return self.trials[-1]

    def mean(self, name: str):
        values = [getattr(t, name) for t in self.trials if getattr(t, name) is not None]
        if not values:
            return None
        return max(values) if name.endswith("_bytes") else fmean(values)


def summarize(config: Config, trials: list[Trial], memory_available: int | None) -> Summary:
    good = [t for t in trials if t.error is None and t.rate is not None]
    rates = [t.rate for t in good if t.rate is not None]
    rate = fmean(rates) if rates else None
    stderr = None
    if good:
        chunks = [r for t in good for r in t.chunk_rates]
        within = stdev(chunks) / len(chunks) ** 0.5 if len(chunks) >= 2 else 0.0
        # Runs of the same setting differ more than chunks of one run (the machine's other
        # load, where the workers landed): the spread of the repeats bounds the error too.
        between = (max(rates) - min(rates)) / 2 if len(rates) >= 2 else 0.0
        stderr = max(within, between)
    excluded = None
    errors = [t.error for t in trials if t.error]
    if errors and not good:
        excluded = errors[-1]
    else:
        shm = [(t.shm_peak_bytes, t.shm_total_bytes) for t in good if t.shm_peak_bytes and t.shm_total_bytes]
        worst = max((used / total for used, total in shm), default=0.0)
        if worst > SHM_LIMIT:
            excluded = f"/dev/shm peaked at {worst:.0%} of its size"
        pss = max((t.pss_bytes or t.rss_bytes or 0 for t in good), default=0)
        if memory_available and pss > MEMORY_LIMIT * memory_available:
            excluded = f"used {pss / 2**30:.1f} GiB of {memory_available / 2**30:.1f} GiB available"
    return Summary(config, trials, rate, stderr, excluded)


def indistinguishable(a: Summary, b: Summary) -> bool:
    if a.rate is None or b.rate is None:
        return False
    error = ((a.stderr or 0.0) ** 2 + (b.stderr or 0.0) ** 2) ** 0.5
    return abs(a.rate - b.rate) <= NOISE_Z * error


@dataclass(frozen=True)
class Recommendation:
    best: Summary
    chosen: Summary
    ties: tuple[Config, ...]  # settings indistinguishable from the best
    reasons: tuple[str, ...]


def rate_of(s: Summary) -> float:
    """The rate of a measured setting (one that `usable` kept)."""
    if s.rate is None:
        raise ValueError(f"{s.config.label()} was not measured")
    return s.rate


def usable(summaries: list[Summary]) -> list[Summary]:
    """The settings that were measured and may be recommended."""
    return [s for s in summaries if s.excluded is None and s.rate is not None]


def fastest(summaries: list[Summary]) -> Summary | None:
    return max(usable(summaries), key=rate_of, default=None)


def still_climbing(summaries: list[Summary]) -> Summary | None:
    """The fastest setting when it has the most workers tried and is clearly faster than any
    with fewer: the curve has not flattened at the edge of the grid."""
    best = fastest(summaries)
    if best is None:
        return None
    top = max(s.config.num_workers for s in summaries)
    below = [rate_of(s) for s in usable(summaries) if s.config.num_workers < top]
    if best.config.num_workers != top or not below or rate_of(best) <= max(below) * (1 + 2 * TOLERANCE):
        return None
    return best


def recommend(summaries: list[Summary], cpu_share: int) -> Recommendation | None:
    best = fastest(summaries)
    if best is None:
        return None
    measured = usable(summaries)
    near = [s for s in measured if rate_of(s) >= rate_of(best) * (1 - TOLERANCE) or indistinguishable(s, best)]
    chosen = min(near, key=lambda s: s.config)
    ties = tuple(s.config for s in measured if s is not best and indistinguishable(s, best))
    reasons = []
    if chosen is not best:
        gap = 1 - rate_of(chosen) / rate_of(best)
        close = "as fast as" if gap < 0.005 else f"within {gap:.0%} of"
        reasons.append(
            f"{chosen.config.label()} is {close} the fastest ({best.config.label()}) "
            "at a lower cost in processes and memory"
        )
    if still_climbing(summaries) is not None:
        top = best.config.num_workers
        reasons.append(f"the fastest setting is the most workers tried ({top}): more may help, "
                       f"try --workers {top},{2 * top}")
    if chosen.config.num_workers > cpu_share:
        within = [s for s in measured if s.config.num_workers <= cpu_share]
        fewer = max(within, key=rate_of) if within else None
        gain = f" ({rate_of(chosen) / rate_of(fewer) - 1:+.0%} against {fewer.config.label()})" if fewer else ""
        cpu = chosen.mean("worker_cpu_percent")
        # All workers together against the CPUs they share: far below, they wait on I/O.
        io_bound = cpu is not None and cpu * chosen.config.num_workers < 50.0 * cpu_share
        why = ("the workers mostly wait (I/O), so more of them than cores pays off" if io_bound else
               "more workers than CPUs keep the CPUs busy while some of them hand batches over")
        reasons.append(f"{chosen.config.num_workers} workers on {cpu_share} CPUs{gain}: {why}")
    excluded = [s for s in summaries if s.excluded]
    for s in excluded:
        reasons.append(f"{s.config.label()} left out: {s.excluded}")
    return Recommendation(best, chosen, ties, tuple(reasons))
