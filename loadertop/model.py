"""Immutable snapshots: what one tick saw of the host, each trainer, its workers and GPUs.

Probes build these; everything downstream (rules, TUI, reports, recorder, exporter) only
reads them. A value that could not be measured is None, and a Notice says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .text import printable, printable_or_none
from .vocabulary import (
    Change,
    EventKind,
    Evidence,
    FoundBy,
    Loop,
    PlanPart,
    ProcessStatus,
    Severity,
    TrainerStatus,
    TuneAction,
    TunePhase,
    WaitSource,
)


def _clean(obj: object, *names: str) -> None:
    """Make a frozen snapshot's process-derived text fields printable (text.py), in place."""
    for name in names:
        value = getattr(obj, name)
        clean = printable_or_none(value) if isinstance(value, str) or value is None else value
        if clean is not value:
            object.__setattr__(obj, name, clean)


@dataclass(frozen=True)
class Notice:
    """Something that could not be measured, why, and how to fix it."""

    id: str
    message: str
    fix: str | None = None
    trainer_pid: int | None = None

    def __post_init__(self) -> None:
        _clean(self, "message", "fix")  # they quote file names and py-spy's own words


@dataclass(frozen=True)
class HostLoader:
    """A DataLoader owner anywhere on the machine (watched or not), from the host scan."""

    pid: int
    workers: int
    cpu_set: tuple[int, ...]  # the CPUs it may run on
    cpu_cores: float | None  # CPUs it and its workers used since the previous scan


@dataclass(frozen=True)
class BusyProcess:
    """A process outside the watched jobs that keeps the host's CPUs busy (the host scan)."""

    pid: int
    comm: str
    user: str
    cores: float  # CPUs it used since the previous scan
    group: str | None = None  # the scheduler's group it shares CPUs in (probes/cgroup.sched_group)

    def __post_init__(self) -> None:
        _clean(self, "comm")
        _clean(self, "user")
        _clean(self, "group")


@dataclass(frozen=True)
class HostSnapshot:
    hostname: str
    cpu_count: int
    usable_cpus: int | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    load_avg: tuple[float, float, float]
    cpu_percent: float | None
    # Every DataLoader worker on the machine, watched or not (a scan every few seconds).
    dataloader_workers: int | None = None
    dataloader_trainers: int | None = None
    loaders: tuple[HostLoader, ...] = ()
    # The processes outside the watched jobs that use the most CPU (busiest first), for a verdict
    # that says what takes the CPUs, and with their scheduling groups whom more workers take from.
    busiest: tuple[BusyProcess, ...] = ()

    def __post_init__(self) -> None:
        _clean(self, "hostname")


@dataclass(frozen=True)
class ProcessSample:
    """One process (a trainer's main process or a worker) at one tick."""

    pid: int
    started_at: float  # epoch seconds; with pid, the identity of the process
    status: ProcessStatus
    cpu_percent: float | None  # of one core; None on the first sight of a process
    rss_bytes: int | None
    uss_bytes: int | None  # from smaps, on a slower staggered cadence
    pss_bytes: int | None
    memory_sampled_at: float | None  # when uss/pss were read
    threads: int | None
    busy_threads: int | None  # threads doing real work over the slow window (see probes.processes)
    runqueue_wait_s_per_s: float | None  # seconds its threads sat runnable, per second
    ctx_switches_voluntary_per_s: float | None
    ctx_switches_involuntary_per_s: float | None
    worker_id: int | None = None
    doing: str | None = None  # what the stack sampler saw it doing, e.g. "D.__getitem__ (d.py:9)"
    doing_at: float | None = None  # when that stack was read (epoch seconds)
    thread_pools: tuple[str, ...] = ()  # compute pools its libraries run (OpenMP, MKL, OpenBLAS, OpenCV)
    read_bytes_per_s: float | None = None  # everything it reads (files, sockets, pipes), slow cadence
    found_by: FoundBy | None = None  # a worker: how it was recognised (probes.discovery)
    # Its main thread alone (a trainer's: the training loop's), every tick since the one before: its
    # share of a core on the CPU, and seconds per second it sat runnable without one. What is
    # left of its time it was blocked: in next(), in a collective, a device sync, a sleep.
    main_thread_cpu: float | None = None
    main_thread_runqueue_s_per_s: float | None = None

    def __post_init__(self) -> None:
        # A recording's samples come through here; live ones are built past __init__
        # (probes.processes) from py-spy frames made printable where they are read.
        _clean(self, "doing")


# What a worker's stack shows when it has finished every batch asked of it: the loader is ahead.
WAITING_FOR_INDICES = "waiting for indices"


@dataclass(frozen=True)
class ShmSnapshot:
    path: str
    total_bytes: int | None
    used_bytes: int | None
    torch_bytes: int | None  # /dev/shm/torch_* segments the trainer and its workers map
    # The largest of those segments: at least one batch's largest tensor, so a floor on a
    # batch's bytes that holds when the queue is nearly empty (a starved loop).
    torch_largest_bytes: int | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    index: int
    uuid: str | None
    name: str | None
    utilization_percent: float | None
    memory_utilization_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    power_limit_watts: float | None
    sm_clock_mhz: int | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    process_pids: tuple[int, ...] = ()  # host pids that hold a context on this GPU



@dataclass(frozen=True)
class DataWait:
    """Where the trainer's main thread spent a window of stack samples."""

    fraction: float | None  # of wall time inside DataLoader.__next__
    worker_wait_fraction: float | None  # blocked waiting for a worker's batch
    main_process_fraction: float | None  # loading work the main process does itself
    breakdown: tuple[tuple[str, float], ...]  # (forward, 0.4), (backward, 0.3), ...
    samples: int
    window_s: float
    stalled_for_s: float  # continuously inside data wait up to the end of the window
    source: WaitSource = "py-spy"
    steps_per_s: float | None = None  # batches the loop took per second (the hook counts them)
    iterable: bool | None = None  # the loop reads an IterableDataset
    # Of the wait, waiting for another rank to send this rank's batch (Accelerate's dispatcher).
    dispatched_fraction: float | None = None
    # The framework whose loop fetches the batches, where frames or the hook show it: the
    # settings are written in its terms.
    loop: Loop | None = None
    # The hook's running totals (the loop's busiest loader's batches, every loader's seconds in
    # next()): their change from tick to tick is each tick's own steps/s and data wait.
    batches_total: int | None = None
    waited_total_s: float | None = None
    # Read from py-spy's short first look at the trainer alone: provisional until a full window.
    first_look: bool = False

    def __post_init__(self) -> None:
        _clean(self, "loop")
        if any(printable(label) != label for label, _ in self.breakdown):
            object.__setattr__(self, "breakdown", tuple((printable(k), v) for k, v in self.breakdown))


# --- the in-place tuner (loadertop/autotune): what it changes and what it decided ----------


@dataclass(frozen=True, order=True)
class Knobs:
    """What the tuner may change: the two DataLoader settings that take effect on the next
    iterator without changing the batches a map-style loader yields, and, unless the user
    opts out, the training loop's torch threads (they take effect at once) and the threads
    each worker's pools may start (set when the next iterator's workers start)."""

    num_workers: int
    prefetch_factor: int | None  # None with num_workers=0: nothing to prefetch
    main_threads: int | None = None  # torch.set_num_threads in the loop; None: not tuned
    worker_threads: int | None = None  # each worker's pools capped at this; None: as the job sets them

    def label(self, since: Knobs | None = None) -> str:
        """Every setting; with `since`, the thread settings only where they changed from it."""
        text = "num_workers=0" if self.num_workers == 0 else \
            f"num_workers={self.num_workers} prefetch_factor={self.prefetch_factor}"
        return text + self._threads(since)

    def short(self, beside: Knobs) -> str:
        """The label, without the prefetch and the threads where they are beside's."""
        if self.num_workers and self.prefetch_factor != beside.prefetch_factor:
            text = f"num_workers={self.num_workers} prefetch_factor={self.prefetch_factor}"
        else:
            text = f"num_workers={self.num_workers}"
        return text + self._threads(beside)

    def _threads(self, beside: Knobs | None) -> str:
        """The thread settings that are set (and differ from beside's, where given)."""
        text = ""
        if self.main_threads is not None and (beside is None or self.main_threads != beside.main_threads):
            text += f" main_threads={self.main_threads}"
        if self.num_workers and self.worker_threads is not None and (
                beside is None or self.worker_threads != beside.worker_threads):
            text += f" worker_threads={self.worker_threads}"
        return text

    def arrow(self, new: Knobs) -> str:
        """'num_workers 2 -> 4': what changes from self to new."""
        parts = []
        if new.num_workers != self.num_workers:
            parts.append(f"num_workers {self.num_workers} -> {new.num_workers}")
        if new.num_workers and self.num_workers and new.prefetch_factor != self.prefetch_factor:
            parts.append(f"prefetch_factor {self.prefetch_factor} -> {new.prefetch_factor}")
        if new.main_threads is not None and new.main_threads != self.main_threads:
            parts.append(f"main_threads {self.main_threads or 'as set'} -> {new.main_threads}")
        if new.num_workers and new.worker_threads != self.worker_threads:
            parts.append(f"worker_threads {self.worker_threads or 'as set'} -> {new.worker_threads or 'as set'}")
        return ", ".join(parts) or f"{new.label()} (no change)"

    def as_dict(self) -> dict:
        out: dict = {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor}
        if self.main_threads is not None:
            out["main_threads"] = self.main_threads
        if self.worker_threads is not None:
            out["worker_threads"] = self.worker_threads
        return out


@dataclass(frozen=True)
class Decision:
    """One step of the tuner: what it tried, kept, went back from, or settled on."""

    action: TuneAction
    old: Knobs | None
    new: Knobs | None
    gain: float | None = None  # measured steps/s of new against old (keep, revert)
    noise: float | None = None
    reason: str = ""
    epoch: int = 0  # the loader's epoch when decided (1 = the first)
    batch: int = 0  # batches the loop had taken
    at: float = 0.0  # epoch seconds
    # What the model predicted for the trial (try, and the keep or revert that judged it): the
    # measured gain beside it is how far the model was off for this job.
    predicted: float | None = None

    def __post_init__(self) -> None:
        if self.noise is not None and not math.isfinite(self.noise):
            object.__setattr__(self, "noise", None)  # too few chunks to tell: no figure
        if self.predicted is not None and not math.isfinite(self.predicted):
            object.__setattr__(self, "predicted", None)

    def text(self) -> str:
        """'epoch 3: num_workers 2 -> 4, measured +38 % steps/s (noise ±6 %), kept'."""
        head = f"epoch {self.epoch}: " if self.epoch else ""
        measured = ""
        if self.gain is not None:
            said = [f"noise ±{self.noise:.0%}"] if self.noise is not None else []
            if self.predicted is not None:
                said.append(f"the model predicted {self.predicted:+.0%}")
            measured = f", measured {self.gain:+.0%} steps/s" + (f" ({'; '.join(said)})" if said else "")
        if self.action == "try" and self.old and self.new:
            return f"{head}{self.old.arrow(self.new)}: trying ({self.reason})" if self.reason else \
                f"{head}{self.old.arrow(self.new)}: trying"
        if self.action == "keep" and self.old and self.new:
            return f"{head}{self.old.arrow(self.new)}{measured}, kept"
        if self.action == "revert" and self.old and self.new:
            return f"{head}{self.old.arrow(self.new)}{measured}, reverted" + (f": {self.reason}" if self.reason else "")
        if self.action == "settle" and self.new:
            return f"{head}settled on {self.new.label()}" + (f": {self.reason}" if self.reason else "")
        return f"{head}tuning off" + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict:
        return {"action": self.action, "epoch": self.epoch, "batch": self.batch, "at": self.at,
                "from": self.old.as_dict() if self.old else None, "to": self.new.as_dict() if self.new else None,
                "measured_gain": None if self.gain is None else round(self.gain, 4),
                "noise": None if self.noise is None else round(self.noise, 4),
                "predicted_gain": None if self.predicted is None else round(self.predicted, 4),
                "reason": self.reason, "text": self.text()}


@dataclass(frozen=True)
class TuneState:
    """A loader's in-place tuner (`watch(loader, tune=True)`), as its hook published it."""

    state: TunePhase
    setting: Knobs | None  # what the loader runs on now (a trial while trying)
    started_with: Knobs | None
    epoch: int
    steps_per_s: float | None  # the latest stretch's measured rate
    cost_s: float | None  # time the tuner took in the training loop so far
    reason: str  # why it is off
    decisions: tuple[Decision, ...]  # oldest first

    def __post_init__(self) -> None:
        _clean(self, "reason")
        if any(printable(d.reason) != d.reason for d in self.decisions):
            object.__setattr__(self, "decisions", tuple(replace(d, reason=printable(d.reason))
                                                        for d in self.decisions))

    @property
    def summary(self) -> str:
        """'tune: trying num_workers 4 -> 2 (epoch 5)', 'tune: settled on num_workers=2 ...'."""
        last = self.decisions[-1] if self.decisions else None
        if self.state == "off":
            return f"tune: off ({self.reason})" if self.reason else "tune: off"
        if self.state == "trying" and last is not None and last.action == "try" and last.old and last.new:
            return f"tune: trying {last.old.arrow(last.new)} (epoch {self.epoch})"
        if self.state == "settled" and self.setting is not None:
            kept = [d for d in self.decisions if d.action == "keep"]
            since = ""
            if kept and self.started_with is not None and self.started_with != self.setting:
                since = f" (from {self.started_with.short(self.setting)})"
            return f"tune: settled on {self.setting.label(since=self.started_with)}{since}"
        if self.state == "warm-up":
            return "tune: warming up"
        return f"tune: measuring {self.setting.label()}" if self.setting else "tune: measuring"


@dataclass(frozen=True)
class LoaderConfig:
    """One DataLoader: its workers' `_worker_loop` arguments (py-spy --locals) or what the
    hook publishes."""

    dataset_class: str | None
    num_workers: int | None
    persistent_workers: bool | None
    worker_pids: tuple[int, ...]
    prefetch_factor: int | None = None
    batch_size: int | None = None
    batch_bytes: int | None = None  # one batch's tensors (the hook measures the first)
    iterable: bool | None = None
    source: WaitSource = "py-spy"
    tune: TuneState | None = None  # the loader's in-place tuner, where the hook runs one
    name: str | None = None  # the name it is watched under (the hook's), where it has one

    def __post_init__(self) -> None:
        _clean(self, "dataset_class")
        _clean(self, "name")

    @property
    def label(self) -> str:
        """What tells this loader apart from the trainer's others: its watched name, else its
        dataset's class (two loaders of one class have two names)."""
        return self.name or self.dataset_class or ""


@dataclass(frozen=True)
class TrainerSnapshot:
    pid: int
    started_at: float
    job_pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    cmdline: tuple[str, ...]  # secrets redacted
    env: tuple[tuple[str, str], ...]  # whitelisted thread/device variables only
    status: TrainerStatus
    usable_cpus: int | None
    main: ProcessSample
    pin_memory_thread: bool | None  # None: the trainer's threads could not be listed
    pin_memory_cpu_percent: float | None
    workers: tuple[ProcessSample, ...]
    worker_respawns: int
    shm: ShmSnapshot | None
    data_wait: DataWait | None = None
    loaders: tuple[LoaderConfig, ...] = ()
    gpus: tuple[int, ...] = ()  # indexes into Snapshot.gpus
    cpu_set: tuple[int, ...] = ()  # the CPUs it may run on (affinity)
    cpu_quota: float | None = None  # its cgroup's CPU quota, in CPUs
    sched_group: str | None = None  # the scheduler's group: its cpu cgroup, else its autogroup (session)
    cpus_busy: float | None = None  # how many of its CPUs were busy (anyone's work), over seconds
    throttled_fraction: float | None = None  # share of quota periods that ran out of quota
    memory_headroom_bytes: int | None = None  # what its memory cgroup still allows, None: no limit
    # The job it is a rank of, named the same on every node (probes/launch.py); None in
    # recordings made before jobs had names.
    job_id: str | None = None
    namespace: str | None = None  # its Kubernetes pod's namespace and name, where it runs in one
    pod: str | None = None
    owner_uid: int | None = None  # the user it runs as (whose environment named its job)

    def __post_init__(self) -> None:
        # The command line and environment are the process's own words (an argv can hold an
        # escape sequence): printable before anything shows them.
        cmdline = tuple(printable(a) for a in self.cmdline)
        if cmdline != self.cmdline:
            object.__setattr__(self, "cmdline", cmdline)
        env = tuple((printable(k), printable(v)) for k, v in self.env)
        if env != self.env:
            object.__setattr__(self, "env", env)
        _clean(self, "job_id")
        _clean(self, "namespace")
        _clean(self, "pod")

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def job(self) -> str:
        """The job this trainer is a rank of: its name across nodes, else its local job pid."""
        return self.job_id or f"pid:{self.job_pid}"


@dataclass(frozen=True)
class Event:
    """A change between two ticks: a worker started or exited, a trainer appeared or exited."""

    time: float
    kind: EventKind
    trainer_pid: int
    pid: int
    detail: str = ""
    exit_code: int | None = None  # as the kernel reported it while the process was a zombie

    def __post_init__(self) -> None:
        _clean(self, "detail")


@dataclass(frozen=True)
class Snapshot:
    time: float  # epoch seconds
    monotonic: float
    interval_s: float
    host: HostSnapshot
    trainers: tuple[TrainerSnapshot, ...]
    gpus: tuple[GpuSnapshot, ...] = ()
    events: tuple[Event, ...] = ()
    notices: tuple[Notice, ...] = ()
    jobs: tuple[int, ...] = field(default=())  # the PIDs the user named


@dataclass(frozen=True)
class Finding:
    """A diagnosis: what is wrong, the numbers that show it, and exactly what to change.

    `evidence` and `change` are plain dicts for the report; treat them as read-only."""

    id: str
    severity: Severity
    trainer_pid: int | None
    title: str
    evidence: Evidence = field(hash=False)
    suggestion: str = ""
    change: Change | None = field(default=None, hash=False)  # {"DataLoader": {"num_workers": 4}}
    # Which slices of the trainer's plan it proposes, and the rule's own advice: the
    # diagnoser writes change and suggestion from the trainer's latest plan with them.
    parts: tuple[PlanPart, ...] = field(default=(), compare=False)
    note: str = field(default="", compare=False)

    @property
    def rank(self) -> int:
        return {"critical": 2, "warning": 1}.get(self.severity, 0)
