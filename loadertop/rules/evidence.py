"""The evidence each finding carries: the figures behind it, by name, as the report's
`findings[].evidence` holds them (docs/RULES.md says what each rule measures). One TypedDict
per finding, so that a rule that misspells or drops a figure fails the type check."""

from __future__ import annotations

from typing import Any, TypedDict

from ..vocabulary import Cause, CpuLimitKind


class _Common(TypedDict):
    num_workers: int | None
    predicted_gain: float | None  # the plan's predicted change in steps/s (0.5: +50 %)


class CpuOversubscribed(_Common):
    cause: Cause
    runqueue_wait_s_per_s: float | None
    cpus: float
    cpu_set: int
    cpu_quota: float | None
    throttled_fraction: float | None
    other_processes_cpus: float
    trainer_cpus_used: float | None
    load_avg_1m: float
    with_more_cpus: dict[str, float] | None  # {cpus, predicted_gain}: what the note states
    busiest_processes: list[dict[str, object]]  # outside the jobs: pid, name, user, cpus


class InputBound(_Common, total=False):
    cause: Cause
    data_wait_fraction: float | None
    worker_wait_fraction: float
    samples: int
    loader: str | None
    worker_cpu_percent: float | None
    worker_runqueue_wait_s_per_s: float | None
    worker_busy_threads: float | None
    worker_read_bytes_per_s: float | None
    worker_disk_sleep_fraction: float | None
    main_process_cpu_percent: float | None
    cpus: float
    gpu_utilization_percent: float  # only where the trainer holds a GPU


class Dispatched(TypedDict):
    """input_bound on a rank that waits for rank 0 to send its batch (Accelerate)."""

    cause: Cause
    data_wait_fraction: float | None
    dispatched_fraction: float | None
    samples: int | None
    rank: int | None


class MainProcessBound(_Common):
    main_process_fraction: float
    data_wait_fraction: float | None
    samples: int
    cpus: float
    workers_waiting_for_indices: bool


class ShmPressure(_Common):
    shm_total_bytes: int | None
    shm_peak_used_bytes: int
    shm_used_fraction: float
    torch_shm_bytes: int | None
    path: str


class TooManyWorkers(_Common):
    workers_on_host: int | None
    trainers_sharing_cpus: int
    cpus: float
    cpu_set: int
    host_cpu_percent: float | None


class WorkerThreads(TypedDict):
    busy_threads_per_worker: float
    threads_per_worker: float
    workers: int
    busy_threads_total: int
    cpus: float
    thread_pools: list[str]
    OMP_NUM_THREADS: str | None
    main_process_busy_threads: float | None


class WorkerRespawn(TypedDict):
    respawns: int
    window_s: float
    generations: float
    num_workers: int
    restart_gap_s: float | None


class LoaderStalled(TypedDict):
    stalled_for_s: float
    workers: dict[int, str]  # worker pid -> what it is doing
    how: str
    max_worker_cpu_percent: float | None


class WorkerDied(TypedDict):
    worker_pid: int
    exit_code: int | None
    signal: str | None
    when: float
    deaths: int


class WorkerMemoryGrowth(TypedDict):
    uss_growth_bytes_per_min_per_worker: float
    fit_r2: float
    workers: int
    rss_growth_bytes_per_min: float
    window_s: float
    hours_to_oom: float | None
    mem_available_bytes: int | None


class PinMemoryOff(TypedDict):
    gpus: list[int]
    pin_memory_thread: bool
    num_workers: int


class Plan(TypedDict, total=False):
    """The plan's own evidence (the report's `trainers[].plan.evidence`)."""

    cause: Cause
    cpus: float
    cpu_limit: CpuLimitKind
    cpu_set: int
    cpu_quota: float | None
    other_processes_cpus: float
    trainer_cpus_used: float | None
    throttled_fraction: float | None
    model: dict[str, Any]  # the model's terms and each setting's predicted steps/s
    gain_capped_by_data_wait: bool  # the model predicted more than removing the wait can give
    one_more_worker_cpus: float  # on a busy host: the job's CPUs with one more worker, relative, less 1


class _Ranks(TypedDict):
    rank: int
    ranks_seen: int
    world_size: int | None
    straggler_rank: int
    straggler_pid: int | None
    straggler_node: str
    cause: str  # "input": its loader is behind; "step": its own step is longer
    method: str | None  # how the sync was measured: "frames" (py-spy) or "blocked" (/proc)
    data_wait_fraction: float | None
    straggler_data_wait_fraction: float | None


class WaitsForRank(_Ranks):
    wait_for_ranks_fraction: float | None  # this rank's wait for the others, share of its loop


class RankStraggler(_Ranks):
    others_wait_fraction: float | None  # the median wait of the ranks that wait for it
    waiting_ranks: list[int]


class MainThreads(_Common):
    main_busy_threads: float
    main_cpu_percent: float | None
    main_runqueue_wait_s_per_s: float
    main_cpu_s_per_step: float | None  # with the hook's steps per second
    proposed_main_threads: int
    cpus: float
    data_wait_fraction: float | None
