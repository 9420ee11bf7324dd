"""What a window of snapshots says about one trainer, as the throughput model needs it: where
a step's time goes (data wait, split into waiting for workers and the main process's own
loading), the main process's CPU, each loader's workers, and the CPUs, memory and /dev/shm
this trainer can really get.

Pure: built from snapshots only. Every figure that could not be measured is None.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, median, stdev

from ..fields import context_switches
from ..model import WAITING_FOR_INDICES, BusyProcess, Decision, LoaderConfig, ProcessSample, Snapshot, TrainerSnapshot
from ..numbers import mean_of
from ..vocabulary import CpuLimitKind
from . import thresholds as T
from .loops import worker_flag


@dataclass(frozen=True)
class LoaderWindow:
    """One DataLoader's workers over the window."""

    dataset_class: str | None
    num_workers: int  # as configured where known, else the workers seen
    pids: tuple[int, ...]
    prefetch_factor: int
    persistent: bool | None
    iterable: bool | None
    cpu: float | None  # mean CPUs one worker uses
    runqueue: float | None  # mean seconds per second one worker's threads wait to run (throttling included)
    busy_threads: float | None  # mean threads per worker doing real work
    blocked: float  # share of samples in uninterruptible sleep (disk, network file systems)
    # Share of samples in state R (on a CPU or queued for one): workers that wait on I/O seldom are.
    running: float
    stopped: bool  # every worker stopped (SIGSTOP, a debugger) at the last tick
    uss_bytes: float | None  # mean private memory of one worker
    read_bytes_per_s: float | None  # mean of one worker
    ahead: bool  # recent stacks show the workers waiting for indices, and their CPU agrees
    thread_pools: tuple[str, ...]  # pools their libraries can run
    doing: str | None  # the frame seen most in recent stacks
    batch_bytes: int | None  # one batch's tensors, where the hook measured it
    tune: str | None = None  # its in-place tuner's state (watch(..., tune=True)), None: not tuned
    # Worker counts its tuner measured no faster than the one it kept (its reverted trials).
    tune_measured_slower: frozenset[int] = frozenset()
    # Its tuner's judged trials of a worker count, oldest first: what the model predicted
    # beside what was measured on this job.
    tune_judged: tuple[Judged, ...] = ()

    @property
    def demand(self) -> float:
        """CPUs one worker would use if nothing made it wait for a CPU."""
        return (self.cpu or 0.0) + (self.runqueue or 0.0)


@dataclass(frozen=True)
class Judged:
    """A trial of another worker count that the loader's tuner judged in place."""

    old: int  # the worker count kept then
    new: int  # the one tried
    predicted: float | None  # the model's gain for it, where the tuner had one
    measured: float  # its measured gain over the kept one (steps/s)
    kept: bool

    def as_dict(self) -> dict:
        return {"from_workers": self.old, "to_workers": self.new,
                "predicted_gain": None if self.predicted is None else round(self.predicted, 4),
                "measured_gain": round(self.measured, 4)}

    def text(self) -> str:
        said = f"tune=True measured num_workers {self.old} -> {self.new} at {self.measured:+.0%} steps/s"
        return said + (f" (the model predicted {self.predicted:+.0%})" if self.predicted is not None else "")


def judged_trials(decisions: Iterable[Decision]) -> tuple[Judged, ...]:
    """The keep and revert decisions of worker counts (a revert names the trial first)."""
    out = []
    for d in decisions:
        if d.gain is None or d.old is None or d.new is None or d.action not in ("keep", "revert"):
            continue
        old, new = (d.old, d.new) if d.action == "keep" else (d.new, d.old)
        if old.num_workers != new.num_workers:
            out.append(Judged(old.num_workers, new.num_workers, d.predicted, d.gain, d.action == "keep"))
    return tuple(out)


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this trainer's processes can get, and what limits them."""

    cpus: float  # what the model may plan with
    cpu_set: int  # CPUs in its affinity
    quota: float | None  # its cgroup's quota, in CPUs
    shared_with: int  # other DataLoader trainers whose CPUs overlap its own
    others_busy: float  # CPUs that processes other than DataLoader jobs keep busy on its CPUs
    used: float | None  # CPUs the trainer and all its workers use now
    throttled: float | None  # share of quota periods that ran out
    limit: CpuLimitKind  # what bounds `cpus`
    # The busy processes outside the job by the scheduler's group (probes/cgroup.sched_group):
    # in the trainer's own group (None: its group unread), and in each other group.
    same_group: tuple[BusyProcess, ...] | None = None
    other_groups: tuple[tuple[BusyProcess, ...], ...] = ()
    others_busy_error: float = 0.0  # the standard error of others_busy over the window's ticks


@dataclass(frozen=True)
class Measured:
    wait: float | None  # data wait, share of the loop's wall time
    wait_workers: float | None  # of it, blocked until a worker's batch arrives
    wait_main: float | None  # of it, loading or receiving work the main process does itself
    wait_dispatched: float | None  # of it, waiting for another rank to send its batch (Accelerate)
    wait_source: str | None  # py-spy | hook
    samples: int
    window_s: float
    stalled_s: float  # continuously inside next() up to now
    steps_per_s: float | None  # where the hook counts batches
    iterable: bool | None
    loop: str | None  # the framework whose loop runs the loader (DataWait.loop)
    main_cpu: float | None  # CPUs the main process uses (median over the window)
    main_runqueue: float  # seconds per second its threads wait to run
    main_busy_threads: float  # its threads doing real work
    loader: LoaderWindow | None  # the loader the loop waits on (the busiest)
    other_loaders: tuple[LoaderWindow, ...]
    budget: CpuBudget
    memory_available: int | None  # bytes more workers may use: the host's, or its cgroup's headroom
    shm_total: int | None
    shm_peak: int | None
    shm_torch: int | None  # bytes of torch's shared tensors mapped, the window's median
    gpu_utilization: float | None
    env: dict[str, str]
    shm_torch_largest: int | None = None  # the largest torch segment seen: a floor on a batch
    shm_used: int | None = None  # the window's median of /dev/shm used
    worker_flag: str | None = None  # the command-line flag that set the worker count (rules/loops.py)

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers if self.loader else 0

    @property
    def main_demand(self) -> float:
        """CPUs the main process would use if nothing made it wait: a GPU job's main thread
        that mostly waits on CUDA counts as the little CPU it uses, not as a whole thread."""
        if self.main_cpu is None:
            return self.main_busy_threads
        return self.main_cpu + self.main_runqueue


# --- loaders --------------------------------------------------------------------------------


def loader_groups(trainer: TrainerSnapshot) -> list[tuple[LoaderConfig | None, tuple[ProcessSample, ...]]]:
    """The trainer's workers grouped by loader: by what py-spy or the hook said of each, then
    the rest by when they started (a loader starts all its workers at once)."""
    live = {w.pid: w for w in trainer.workers}
    groups: list[tuple[LoaderConfig | None, list[ProcessSample]]] = []
    placed: set[int] = set()
    for config in trainer.loaders:
        members = [live[p] for p in config.worker_pids if p in live and p not in placed]
        if members:
            groups.append((config, members))
            placed.update(w.pid for w in members)
    for w in sorted((w for w in trainer.workers if w.pid not in placed), key=lambda w: w.started_at):
        home = next((g for g in groups if any(abs(m.started_at - w.started_at) <= T.LOADER_START_SPREAD_S
                                                 for m in g[1])), None)
        if home is None:
            groups.append((None, [w]))
        else:
            home[1].append(w)
    return [(config, tuple(members)) for config, members in groups]


def queued_s_per_s(p: ProcessSample) -> float | None:
    """Seconds per second a process's threads sit runnable without a CPU, fresh every tick: its
    main thread's own queueing (read each tick) for each of its busy threads. The slow cadence
    reads every thread, but in the live view a minute apart, so a host that got busy after that
    reading went unseen: beside a CPU hog a snapshot (threads read every 3 s) said BUSY HOST and
    the live view of the same job INPUT-BOUND. The slow reading stands in before a tick's."""
    if p.main_thread_runqueue_s_per_s is None:
        return p.runqueue_wait_s_per_s
    return p.main_thread_runqueue_s_per_s * max(1, p.busy_threads or 1)


def _loader_window(config: LoaderConfig | None, members: tuple[ProcessSample, ...],
                   window: Sequence[TrainerSnapshot], now: float) -> LoaderWindow:
    pids = {w.pid for w in members}
    samples = [w for t in window for w in t.workers if w.pid in pids]
    cpu = mean_of(w.cpu_percent / 100.0 if w.cpu_percent is not None else None for w in samples)
    runqueue = mean_of(queued_s_per_s(w) for w in samples)
    busy = mean_of(w.busy_threads for w in samples)
    blocked = sum(1 for w in samples if w.status == "disk-sleep") / max(1, len(samples))
    running = sum(1 for w in samples if w.status == "running") / max(1, len(samples))
    # Stacks read recently, one reading per dump (a dump stays on the samples until the next).
    readings: dict[int, dict[float, str]] = {}
    for w in samples:
        if w.doing and w.doing_at is not None and w.doing_at >= now - T.STACK_MAX_AGE_S:
            readings.setdefault(w.pid, {})[w.doing_at] = w.doing
    waiting = {pid: sum(d == WAITING_FOR_INDICES for d in r.values()) / len(r) for pid, r in readings.items()}
    demand = (cpu or 0.0) + (runqueue or 0.0)
    # Ahead: every worker often seen waiting for indices (a worker that is behind never is,
    # and batches come in order, so one straggler makes the loop wait), and the CPU agrees
    # (a worker that computes most of the time is not waiting for work).
    ahead = (len(readings) == len(pids) and all(s >= T.LOADER_AHEAD_SHARE for s in waiting.values())
             and demand / max(1.0, busy or 1.0) < T.WORKER_CPU_BOUND / 100.0)
    frames = Counter(d for r in readings.values() for d in r.values() if d != WAITING_FOR_INDICES)
    pools = sorted({p for w in members for p in w.thread_pools})
    claimed = config.num_workers if config is not None and config.num_workers else 0
    configured = claimed if claimed <= max(T.MAX_WORKERS, len(members)) else len(members)
    claimed_prefetch = config.prefetch_factor if config and config.prefetch_factor else T.DEFAULT_PREFETCH
    return LoaderWindow(
        dataset_class=config.dataset_class if config else None,
        num_workers=max(configured, len(members)),
        pids=tuple(sorted(pids)),
        prefetch_factor=min(claimed_prefetch, T.MAX_PREFETCH),
        persistent=config.persistent_workers if config else None,
        iterable=config.iterable if config else None,
        cpu=cpu,
        runqueue=runqueue,
        busy_threads=busy,
        blocked=blocked,
        running=running,
        stopped=all(w.status == "stopped" for w in members),
        uss_bytes=mean_of(w.uss_bytes for w in members),
        read_bytes_per_s=mean_of(w.read_bytes_per_s for w in samples),
        ahead=ahead,
        thread_pools=tuple(pools),
        doing=frames.most_common(1)[0][0] if frames else None,
        batch_bytes=config.batch_bytes if config else None,
        tune=config.tune.state if config and config.tune else None,
        tune_measured_slower=frozenset(d.old.num_workers for d in (config.tune.decisions if config and config.tune
                                                                    else ()) if d.action == "revert" and d.old),
        tune_judged=judged_trials(config.tune.decisions) if config and config.tune else (),
    )


# --- CPUs -----------------------------------------------------------------------------------


def cpu_budget(snap: Snapshot, trainer: TrainerSnapshot, window: Sequence[TrainerSnapshot],
               others_window: dict[int, list[TrainerSnapshot]]) -> CpuBudget:
    """The CPUs this trainer can get: its affinity, capped by its quota, less what processes
    other than DataLoader jobs keep busy on those CPUs, split with the DataLoader trainers
    whose CPUs overlap its own (per CPU, so ranks pinned to disjoint sets share nothing), but
    with their unused share free to take."""
    cpu_set = trainer.cpu_set
    size = len(cpu_set) or trainer.usable_cpus or snap.host.usable_cpus or snap.host.cpu_count
    quota = trainer.cpu_quota
    # Each tick where every process's CPU was read: the tick, and what the trainer used in it.
    read = [(t, sum((p.cpu_percent or 0.0) for p in (t.main, *t.workers)) / 100.0) for t in window
            if all(p.cpu_percent is not None for p in (t.main, *t.workers))]
    used = fmean(u for _, u in read) if read else None
    # Other DataLoader trainers on these CPUs: the ones watched, and the host scan's others.
    others: dict[int, tuple[tuple[int, ...], float | None]] = {}
    for pid, history in others_window.items():
        t = history[-1]
        ticks = [sum((p.cpu_percent or 0.0) for p in (h.main, *h.workers)) / 100.0 for h in history]
        others[pid] = (t.cpu_set, fmean(ticks) if ticks else None)
    for h in snap.host.loaders:
        if h.pid != trainer.pid and h.pid not in others:
            others[h.pid] = (h.cpu_set, h.cpu_cores)
    overlapping = {pid: v for pid, v in others.items() if not cpu_set or not v[0] or set(v[0]) & set(cpu_set)}
    # Their use on our CPUs (a trainer's use spread evenly over its own CPUs).
    others_use = sum((use or 0.0) * _shared_part(cpu_set, their_set) for their_set, use in overlapping.values())
    busy = mean_of(t.cpus_busy for t in window)
    others_busy = max(0.0, busy - (used or 0.0) - others_use) if busy is not None else 0.0
    # Tick by tick, what others kept busy: a load that comes and goes (a compile, another
    # snapshot, a test's last job going down) spreads it, and one window of it is not a busy host.
    others_ticks = [t.cpus_busy - u - others_use for t, u in read if t.cpus_busy is not None]
    error = stdev(others_ticks) / math.sqrt(len(others_ticks)) if len(others_ticks) >= 3 else 0.0
    throttled = mean_of(t.throttled_fraction for t in window)
    room = size - others_busy
    available = min(quota, room) if quota is not None else room
    # A fair share of what is left: each CPU split between the trainers that may run on it.
    if cpu_set:
        counts = Counter(c for their_set, _ in overlapping.values() for c in (their_set or cpu_set) if c in cpu_set)
        fair_cpus = sum(1.0 / (1 + counts.get(c, 0)) for c in cpu_set)
    else:
        fair_cpus = size / (1 + len(overlapping))
    fair = available * fair_cpus / size
    cpus = max(fair, available - others_use) if overlapping else available
    cpus = max(T.MIN_PLANNED_CPUS, min(available, cpus))
    limit = limit_of(bool(overlapping) and cpus < available - 1e-6, others_busy, size, quota, error)
    same, other = _groups(snap, trainer)
    return CpuBudget(cpus=cpus, cpu_set=size, quota=quota, shared_with=len(overlapping),
                     others_busy=others_busy, used=used, throttled=throttled, limit=limit,
                     same_group=same, other_groups=other, others_busy_error=error)


def _groups(snap: Snapshot,
            trainer: TrainerSnapshot) -> tuple[tuple[BusyProcess, ...] | None, tuple[tuple[BusyProcess, ...], ...]]:
    """The busy processes in the trainer's scheduling group, and those of each other group."""
    if trainer.sched_group is None:
        return None, ()
    by_group: dict[str | None, list[BusyProcess]] = {}
    for p in snap.host.busiest:
        by_group.setdefault(p.group, []).append(p)
    same = tuple(by_group.pop(trainer.sched_group, []))
    return same, tuple(tuple(c) for c in by_group.values())


def limit_of(shared: bool, others_busy: float, size: int, quota: float | None, error: float = 0.0) -> CpuLimitKind:
    """What bounds a trainer's CPUs: sharing them with other DataLoader trainers, other
    processes keeping them busy (past the noise of their tick-to-tick load, `error`: its
    standard error), its quota, or simply how many it may run on."""
    room = size - others_busy
    if shared:
        return "shared"
    if others_busy - T.NOISE_Z * error >= T.BUSY_HOST_SHARE * size and room < (quota if quota is not None else size):
        return "busy_host"
    if quota is not None and quota < size - 1e-6 and quota <= room:
        return "quota"
    return "cpus"


def _shared_part(ours: Sequence[int], theirs: Sequence[int]) -> float:
    """Share of a trainer's CPU use that falls on our CPUs (spread evenly over its own)."""
    if not ours or not theirs:
        return 1.0
    return len(set(ours) & set(theirs)) / len(theirs)


# --- the whole window -----------------------------------------------------------------------


def measure(snap: Snapshot, trainer: TrainerSnapshot, window: Sequence[TrainerSnapshot],
            others_window: dict[int, list[TrainerSnapshot]], gpu_utilization: float | None) -> Measured:
    dw = trainer.data_wait if trainer.data_wait is not None and trainer.data_wait.fraction is not None else None
    loaders = [_loader_window(c, m, window, snap.time) for c, m in loader_groups(trainer)]
    # The loop waits on the busiest loader; the others (a validation loader between its
    # epochs) sit idle meanwhile.
    loaders.sort(key=lambda lw: (not lw.ahead, lw.demand * lw.num_workers, lw.num_workers), reverse=True)
    active = loaders[0] if loaders else None
    wait = dw.fraction if dw else None
    wait_main = dw.main_process_fraction if dw else None
    wait_workers = dw.worker_wait_fraction if dw else None
    if dw is not None and wait_main is None:  # the hook: no split, but num_workers tells
        wait_main, wait_workers = (wait, 0.0) if active is None else (0.0, wait)
    main_cpu = [t.main.cpu_percent / 100.0 for t in window if t.main.cpu_percent is not None]
    memory = [v for v in (snap.host.mem_available_bytes, trainer.memory_headroom_bytes) if v is not None]
    shm = trainer.shm
    peaks = [t.shm.used_bytes for t in window if t.shm and t.shm.used_bytes is not None]
    torch_seen = [(t.shm, t.shm.torch_bytes) for t in window if t.shm and t.shm.torch_bytes is not None]
    torch_bytes = [n for _, n in torch_seen]
    largest = [s.torch_largest_bytes for s, _ in torch_seen if s.torch_largest_bytes]
    return Measured(
        wait=wait,
        wait_workers=wait_workers,
        wait_main=wait_main,
        wait_dispatched=dw.dispatched_fraction if dw else None,
        wait_source=dw.source if dw else None,
        samples=dw.samples if dw else 0,
        window_s=dw.window_s if dw else 0.0,
        stalled_s=dw.stalled_for_s if dw else 0.0,
        steps_per_s=dw.steps_per_s if dw else None,
        iterable=(dw.iterable if dw else None) or (active.iterable if active else None),
        loop=dw.loop if dw else None,
        main_cpu=median(main_cpu) if main_cpu else None,
        main_runqueue=mean_of(queued_s_per_s(t.main) for t in window) or 0.0,
        main_busy_threads=trainer.main.busy_threads or 1.0,
        loader=active,
        other_loaders=tuple(loaders[1:]),
        budget=cpu_budget(snap, trainer, window, others_window),
        memory_available=min(memory) if memory else None,
        shm_total=shm.total_bytes if shm else None,
        shm_peak=max(peaks) if peaks else None,
        # The median: a peak catches a batch on its way in while the last is still held.
        shm_torch=int(median(torch_bytes)) if torch_bytes else None,
        gpu_utilization=gpu_utilization,
        env=trainer.env_dict,
        shm_torch_largest=max(largest) if largest else None,
        shm_used=int(median(peaks)) if peaks else None,
        worker_flag=worker_flag(trainer.cmdline, active.num_workers if active else 0),
    )


def hang_signature(trainer: TrainerSnapshot, stall: Sequence[TrainerSnapshot], since: float) -> str | None:
    """How the workers look over a stall of the loop (the snapshots since `since`, epoch):
    "stopped" (SIGSTOP, a debugger), "idle" (no CPU, nothing wakes them: blocked,
    deadlocked), "one frame" (every stack of every worker read during the stall on the same
    line), or None (they work)."""
    workers = trainer.workers
    if not workers:
        return None
    if all(w.status == "stopped" for w in workers):
        return "stopped"
    pids = {w.pid for w in workers}
    samples = [w for t in stall for w in t.workers if w.pid in pids]
    cpus = [w.cpu_percent for w in samples if w.cpu_percent is not None]
    switches = [r for r in map(context_switches, samples) if r is not None]
    if cpus and max(cpus) < T.IDLE_WORKER_CPU and (not switches or max(switches) < T.IDLE_WORKER_SWITCHES):
        return "idle"
    frames: dict[int, dict[float, str]] = {}
    for w in samples:
        if w.doing and w.doing_at is not None and w.doing_at >= since:
            frames.setdefault(w.pid, {})[w.doing_at] = w.doing
    # A CPU-bound worker's hot loop is one line too: only several dumps, all on it, while the
    # loop never left next(), make it a hang rather than a slow item.
    if len(frames) == len(pids) and all(len(f) >= T.HANG_SAME_FRAME_DUMPS and len(set(f.values())) == 1
                                        and WAITING_FOR_INDICES not in f.values() for f in frames.values()):
        return "one frame"
    return None
