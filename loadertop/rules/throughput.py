"""The throughput model: steps per second of a trainer under a DataLoader setting, relative
to what it does now, from what one window measured (rules/measure.py).

Time is in units of the current step, so the measured shares are the model's terms:

- the main process needs `s0` per step of its own serial time: the step's compute plus any
  loading or receiving it does inside next(), less the time its threads waited for a CPU;
  and `m` CPU-seconds (all its threads);
- a batch costs the workers `c = n · u` CPU-seconds (n workers at u CPUs each deliver one
  batch per step), and takes one worker `b0 = n · (1 - r/k)` of wall time when it gets its
  CPUs (r: its run-queue wait, k: its busy threads), of which `io = n · (1 - (u + r)/k)` is
  neither computing nor waiting for a CPU (disk, network, sleep);
- the trainer can get `K` CPUs (affinity, quota, other jobs: measure.CpuBudget).

Three bounds then cap the steps per unit of time: n' workers deliver at most n'/b0', the
CPUs run at most K / (m + c) steps, and the main process at most 1/s0, less where its
compute shares a CPU with busy workers (_main_among_workers). Where two bounds are close,
the real rate is lower than either (workers and the loop wait for each other, and a CPU
idles in the gaps), so the rate is their soft minimum, (Σ bound^-P)^(-1/P), not the hard
one; P was fitted on bench/advice.py's real jobs (docs/BENCHMARKS.md). Where the workers
already queue for CPUs (throttled, oversubscribed) there are no gaps: the CPU bound is hard.
Worker thread pools that outnumber the CPUs waste what exceeds them (spinning): one thread
per worker keeps only the useful share of their CPU.

Pure functions; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import thresholds as T
from .measure import Measured


@dataclass(frozen=True)
class Setting:
    """What a plan may change."""

    num_workers: int
    threads_per_worker: int  # 0: as now (whatever pools the workers run)
    prefetch_factor: int
    main_threads: int = 0  # the training loop's intra-op threads; 0: as now

    def label(self) -> str:
        """'w=2 pf=2', 'w=2 pf=4 t=1', 'w=2 pf=2 main=1': how the plan's evidence names a setting."""
        text = f"w={self.num_workers} pf={self.prefetch_factor}"
        text += f" t={self.threads_per_worker}" if self.threads_per_worker else ""
        return text + (f" main={self.main_threads}" if self.main_threads else "")


@dataclass(frozen=True)
class Terms:
    """The model's terms for one trainer (units: the current step)."""

    s0: float  # the main process's serial time per step, without CPU contention
    m: float  # its CPU-seconds per step
    loading: float  # of s0, loading work the main process would hand to workers (num_workers=0)
    loading_cpu: float  # CPU-seconds of that loading
    n: int  # workers now
    cpu_per_batch: float  # CPU-seconds the workers spend on one batch (all their threads)
    io_per_batch: float  # one worker's time per batch neither computing nor waiting to run
    threads: float  # busy threads per worker
    latency: float  # one worker's uncontended time per batch, as now
    cpus: float  # K
    loader_bound: bool  # the loop waits on the workers now
    pool_efficiency: float = 1.0  # share of the workers' CPU that is useful work (pools spin when oversubscribed)
    contended: bool = False  # the workers wait for CPUs now: no idle gaps for a knee to lose
    main_threads: float = 1.0  # the main process's busy threads


def terms(m: Measured) -> Terms | None:
    """The model's terms, or None when the window cannot support a prediction."""
    if m.wait is None:
        return None
    wait_main = m.wait_main or 0.0
    wait_workers = m.wait_workers or 0.0
    serial = max(T.MIN_SERIAL_SHARE, 1.0 - wait_workers)
    threads = max(1.0, m.main_busy_threads)
    contention = min(T.MAX_CONTENTION_SHARE * serial, m.main_runqueue / threads)
    s0 = max(T.MIN_SERIAL_SHARE, serial - contention)
    main_cpu = m.main_cpu if m.main_cpu is not None else 1.0
    lw = m.loader
    if lw is None or lw.num_workers == 0:
        # The main process loads: attribute its CPU to loading first (the compute part of a
        # GPU job barely uses the CPU), so that workers are not assumed to need less.
        loading = wait_main
        loading_cpu = min(loading, main_cpu)
        return Terms(s0=s0, m=main_cpu, loading=loading, loading_cpu=loading_cpu, n=0, cpu_per_batch=loading_cpu,
                     io_per_batch=max(0.0, loading - loading_cpu), threads=1.0, latency=max(loading, 1e-3),
                     cpus=m.budget.cpus, loader_bound=loading >= T.DATA_WAIT_WARNING)
    n = lw.num_workers
    u = lw.cpu if lw.cpu is not None else 1.0
    r = lw.runqueue or 0.0
    k = max(1.0, lw.busy_threads or 1.0)
    loader_bound = wait_workers >= T.DATA_WAIT_WARNING and not lw.ahead
    running = min(1.0, u / k)
    waiting = min(T.MAX_RUNQUEUE_SHARE, r / k)
    if loader_bound:
        latency = n * max(T.MIN_SERIAL_SHARE, 1.0 - waiting)
        io = n * max(0.0, 1.0 - running - waiting)
    else:
        # The workers keep up: each batch costs them only their busy time.
        latency = n * max(T.MIN_SERIAL_SHARE, running)
        io = 0.0
    # Busy threads beyond the CPUs do no useful work: OpenMP-style pools spin while they wait
    # for each other, and preempt the thread the others wait for. One thread per worker keeps
    # only the useful share: (CPUs / busy threads)^POOL_WASTE_EXPONENT of their CPU.
    efficiency = 1.0
    if k > 1.0:
        efficiency = min(1.0, m.budget.cpus / (n * k + m.main_demand)) ** T.POOL_WASTE_EXPONENT
    return Terms(s0=s0, m=main_cpu, loading=0.0, loading_cpu=0.0, n=n, cpu_per_batch=n * u, io_per_batch=io,
                 threads=k, latency=latency, cpus=m.budget.cpus, loader_bound=loader_bound,
                 pool_efficiency=efficiency, contended=waiting >= T.STARVED_RUNQUEUE_SHARE,
                 main_threads=threads)


def softmin(*bounds: float) -> float:
    return sum(b ** -T.SOFTMIN_P for b in bounds) ** (-1.0 / T.SOFTMIN_P)


@dataclass(frozen=True)
class Prediction:
    setting: Setting
    rate: float  # steps per unit of time (the current step's), of the model
    bound: str  # what caps it: workers | cpus | main_process
    ceiling: float  # the hard limits, main process and CPUs, in the same units

    def relative(self, now: Prediction) -> float:
        """Steps/s against now's. The soft minimum rates both settings alike (a knee now is
        a knee in the model too), but never past a hard limit: now's rate is 1 by
        definition, so a loop that does not wait now cannot gain from its loader."""
        # Measured shares are noisy: where they put now past a hard limit, that limit is
        # read as no tighter than now.
        return min(self.rate / now.rate, self.ceiling * max(1.0, 1.0 / now.ceiling))

    def gain_over(self, now: Prediction) -> float:
        return self.relative(now) - 1.0


def predict(t: Terms, s: Setting, cpus: float | None = None) -> Prediction:
    """The model's rate for a setting (`cpus`: with another CPU budget, e.g. a larger quota)."""
    k_cpus = t.cpus if cpus is None else cpus
    if s.num_workers == 0:
        if t.n == 0:
            main, cpu = 1.0 / t.s0, k_cpus / max(1e-3, t.m)
            return Prediction(s, softmin(main, cpu), "main_process", min(main, cpu))
        # Back to loading in the main process: its serial time grows by a batch's loading.
        serial = t.s0 + t.latency / max(1, t.n)
        return Prediction(s, 1.0 / serial, "main_process", 1.0 / serial)
    if t.n == 0:
        # Workers take the loading over; the main process keeps its compute and receives.
        serial = max(T.MIN_SERIAL_SHARE, t.s0 - t.loading + T.RECEIVE_SHARE * t.loading)
        main_cpu = max(0.0, t.m - t.loading_cpu)
        latency = t.latency * (1.0 + T.SEND_SHARE)
        cpu_per_batch = t.cpu_per_batch * (1.0 + T.SEND_SHARE)
    else:
        serial = t.s0
        main_cpu = t.m
        latency = t.latency
        cpu_per_batch = t.cpu_per_batch
    main_threads = t.main_threads
    if s.main_threads and s.main_threads < t.main_threads:
        # The loop's pool limited: what its busy threads burn beyond the CPUs the workers leave
        # is spinning and preempting (as for the workers' pools); the useful rest runs on fewer
        # threads, so its busiest thread's share of the step grows (a truly parallel step slows).
        crowd = t.main_threads + cpu_per_batch * (1.0 if t.n else 0.0)
        useful = t.m * min(1.0, k_cpus / max(1e-3, crowd)) ** T.POOL_WASTE_EXPONENT
        main_cpu = max(useful, t.m * s.main_threads / t.main_threads)
        busiest_now = t.m / max(1.0, t.main_threads)
        serial = max(T.MIN_SERIAL_SHARE, serial - busiest_now + main_cpu / s.main_threads)
        main_threads = float(s.main_threads)
        if s.threads_per_worker == 1 and t.threads > 1.0:
            # One thread: only the pool's useful work remains, run serially; the waiting
            # stays the same.
            cpu_per_batch = t.cpu_per_batch * t.pool_efficiency
            latency = cpu_per_batch + t.io_per_batch
    workers = s.num_workers / max(1e-3, latency)
    cpu = k_cpus / max(1e-3, main_cpu + cpu_per_batch)

    main = min(1.0 / serial, _main_among_workers(t, s, serial, main_cpu, cpu_per_batch, workers, k_cpus,
                                                 main_threads))
    # Where threads already queue for the CPUs, the CPUs are never idle: their bound is a hard
    # one, and fewer workers that still fill them lose nothing.
    rate = min(softmin(workers, main), cpu) if t.contended else softmin(workers, cpu, main)
    bounds = {"workers": workers, "cpus": cpu, "main_process": main}
    return Prediction(s, rate, min(bounds, key=lambda k: bounds[k]), min(cpu, main))


def _main_among_workers(t: Terms, s: Setting, serial: float, main_cpu: float, cpu_per_batch: float,
                        workers: float, cpus: float, main_threads: float) -> float:
    """The main process's rate when its workers' threads and its own outnumber the CPUs.

    The scheduler then gives each of its busy threads a fair share `sigma` of a CPU, so its
    compute stretches while the workers run. A step that computes on several threads (an
    intra-op pool: a convolution, a matmul) needs all of them at once, since each waits for
    the others at the op's end: it counts as that many threads against the CPUs, and a
    single worker's burst already takes one of them away. The workers, faster meanwhile, fill their prefetch
    queue and stop until it drains; the main process then runs alone. The rate is the mix of
    the two phases that keeps the queue level: between the shared and the lone rate, never
    past the CPUs (this is why a CPU-heavy loop gains less from more workers than its CPU
    share alone suggests)."""
    # Busy worker threads beyond the CPUs do not shrink its share further: the scheduler
    # favours the thread that wakes, and the loop wakes for every batch.
    runnable = min(cpus, s.num_workers * max(1.0, t.threads if s.threads_per_worker != 1 else 1.0),
                   cpu_per_batch * workers)
    sigma = min(1.0, cpus / (max(1.0, main_threads) + runnable))
    compute = main_cpu / max(1.0, main_threads)  # its busiest thread's CPU per step
    if sigma >= 1.0 or compute <= 0.0:
        return float("inf")
    idle = max(0.0, serial - compute)  # serial time off the CPU (a GPU step, I/O)
    alone = 1.0 / (idle + compute)
    shared = 1.0 / (idle + compute / sigma)
    filling = min(workers, max(0.0, cpus - main_cpu * shared) / max(1e-3, cpu_per_batch))
    if filling <= shared:
        return shared  # the workers cannot get ahead even then
    phase = alone / (filling - shared + alone)  # share of the time all of them run
    return phase * shared + (1.0 - phase) * alone

