"""The trainer measures itself for the tuner, from the inside: no monitor, no py-spy.

Everything the plan needs is a cumulative counter in /proc or the cgroup files: the CPU and
run-queue wait of each thread of the trainer and of its workers, how busy each of its CPUs
is, how often its quota ran out. Two readings, at a stretch's start and near its end, give
the averages over the stretch exactly, so the training loop pays a few file reads now and
then (Tuner reads at most every READ_EVERY_S), never a thread of its own. The data wait and
the steps come from the hook's own timing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..probes import procfs
from ..probes.cgroup import CpuLimit, cpu_limit, memory_headroom
from ..probes.processes import busy_thread_count
from ..redact import ENV_WHITELIST
from ..rules import thresholds as T
from ..rules.measure import CpuBudget, LoaderWindow, Measured, limit_of

READ_EVERY_S = 5.0


@dataclass(frozen=True)
class Threads:
    """One process's threads: tid -> (CPU ticks, run-queue wait ns)."""

    ticks: dict[int, int]
    waits: dict[int, int]


@dataclass(frozen=True)
class Reading:
    at: float  # monotonic
    main: Threads | None
    workers: dict[int, Threads]
    cpus: dict[int, tuple[int, int]]  # CPU -> (busy, total) jiffies, the trainer's CPUs
    throttling: tuple[int, int] | None  # (periods, throttled periods) of its quota
    shm: tuple[int, int] | None  # (total, used) bytes of its /dev/shm


def _threads(pid: int) -> Threads | None:
    threads = procfs.read_threads(pid)
    if threads is None:
        return None
    return Threads({t.tid: t.cpu_ticks for t in threads},
                   {t.tid: t.runqueue_wait_ns for t in threads if t.runqueue_wait_ns is not None})


def _shm(path: str) -> tuple[int, int] | None:
    """(total, used) bytes of a tmpfs."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize


class Self:
    """What stays the same between readings: who we are, our CPUs and their limits."""

    def __init__(self, shm_path: str = "/dev/shm") -> None:
        self.pid = os.getpid()
        self.cpu_set = tuple(sorted(os.sched_getaffinity(0)))
        self.limit: CpuLimit | None = cpu_limit("self")
        self.shm_path = shm_path
        self.local_world_size = _int_env("LOCAL_WORLD_SIZE") or 1
        # The rank the others wait for (autotune/rank_roles.py, ranks_board.py): it may take what they leave free,
        # as they do not explore meanwhile.
        self.straggler = False

    def read(self, worker_pids: list[int]) -> Reading:
        per_cpu = procfs.read_per_cpu_times()
        workers = {}
        for pid in worker_pids:
            t = _threads(pid)
            if t is not None:
                workers[pid] = t
        return Reading(at=time.monotonic(), main=_threads(self.pid), workers=workers,
                       cpus={c: per_cpu[c] for c in self.cpu_set if c in per_cpu},
                       throttling=self.limit.throttling() if self.limit else None, shm=_shm(self.shm_path))

    def budget(self, first: Reading, last: Reading, used: float | None) -> CpuBudget:
        """The CPUs this trainer can plan with: its affinity, capped by its quota, less what
        other processes keep busy on them; ranks of one job that share the node's CPUs (not
        pinned apart) split them."""
        size = len(self.cpu_set) or 1
        busy = _busy_cpus(first, last)
        others = max(0.0, busy - (used or 0.0)) if busy is not None else 0.0
        quota = self.limit.cpus if self.limit else None
        room = size - others
        available = min(quota, room) if quota is not None else room
        # Ranks of one job share the node's CPUs unless a launcher pinned each to its own set:
        # each tunes within its share (what the other ranks use is already out of `room`).
        ranks = self.local_world_size
        shared = ranks > 1 and size * ranks > (os.cpu_count() or size)
        cap = min(quota, size) if quota is not None else size
        cpus = min(available, cap / ranks) if shared and not self.straggler else available
        throttled = None
        if first.throttling and last.throttling and last.throttling[0] > first.throttling[0]:
            throttled = (last.throttling[1] - first.throttling[1]) / (last.throttling[0] - first.throttling[0])
        limit = limit_of(shared and cpus < available - 1e-6, others, size, quota)
        return CpuBudget(cpus=max(T.MIN_PLANNED_CPUS, cpus), cpu_set=size, quota=quota,
                         shared_with=ranks - 1 if limit == "shared" else 0, others_busy=others, used=used,
                         throttled=throttled, limit=limit)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _busy_cpus(first: Reading, last: Reading) -> float | None:
    busy = total = 0
    for cpu, (b1, t1) in last.cpus.items():
        if cpu in first.cpus:
            b0, t0 = first.cpus[cpu]
            busy += b1 - b0
            total += t1 - t0
    if total <= 0:
        return None
    return len(last.cpus) * busy / total


@dataclass(frozen=True)
class Usage:
    """One process over the interval between two readings."""

    cpu: float  # CPUs used
    runqueue: float  # seconds per second its threads waited for a CPU
    busy_threads: int


def _usage(a: Threads | None, b: Threads | None, dt: float) -> Usage | None:
    if a is None or b is None or dt <= 0:
        return None
    shares = {tid: (ticks - a.ticks[tid]) / procfs.CLK_TCK / dt for tid, ticks in b.ticks.items() if tid in a.ticks}
    if not shares:
        return None
    waited = sum(w - a.waits[tid] for tid, w in b.waits.items() if tid in a.waits)
    return Usage(cpu=max(0.0, sum(shares.values())), runqueue=max(0.0, waited / 1e9 / dt),
                 busy_threads=busy_thread_count(shares))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measured(me: Self, first: Reading, last: Reading, *, wait: float, num_workers: int, prefetch_factor: int | None,
             config: dict) -> Measured:
    """The plan's view of this trainer over a stretch: its own timing and the two readings."""
    dt = last.at - first.at
    main = _usage(first.main, last.main, dt)
    usages = [u for pid in last.workers if (u := _usage(first.workers.get(pid), last.workers[pid], dt)) is not None]
    available = _memory_available()
    used = None
    if main is not None:
        used = main.cpu + sum(u.cpu for u in usages)
    loader = None
    if num_workers > 0:
        busy_threads = _mean([float(u.busy_threads) for u in usages])
        cpu, runqueue = _mean([u.cpu for u in usages]), _mean([u.runqueue for u in usages])
        # The share of time a worker's threads were runnable: on a CPU, or queued for one.
        running = min(1.0, ((cpu or 0.0) + (runqueue or 0.0)) / max(1.0, busy_threads or 1.0))
        loader = LoaderWindow(
            dataset_class=config.get("dataset_class"), num_workers=num_workers, pids=tuple(sorted(last.workers)),
            prefetch_factor=prefetch_factor or T.DEFAULT_PREFETCH, persistent=config.get("persistent_workers"),
            iterable=config.get("iterable"), cpu=cpu, runqueue=runqueue, busy_threads=busy_threads, blocked=0.0,
            running=running, stopped=False,
            uss_bytes=_worker_memory(list(last.workers), num_workers, available), read_bytes_per_s=None,
            ahead=False, thread_pools=(), doing=None, batch_bytes=config.get("batch_bytes"))
    shm = last.shm
    peaks = [r.shm[1] for r in (first, last) if r.shm is not None]
    return Measured(
        wait=wait, wait_workers=wait if num_workers else 0.0, wait_main=0.0 if num_workers else wait,
        wait_dispatched=None, wait_source="hook", samples=0, window_s=dt, stalled_s=0.0, steps_per_s=None,
        iterable=config.get("iterable"), loop=config.get("loop"),
        main_cpu=main.cpu if main else None, main_runqueue=main.runqueue if main else 0.0,
        main_busy_threads=float(main.busy_threads) if main and main.busy_threads else 1.0,
        loader=loader, other_loaders=(), budget=me.budget(first, last, used),
        memory_available=available, shm_total=shm[0] if shm else None,
        shm_peak=max(peaks) if peaks else None, shm_torch=None, gpu_utilization=None,
        env={k: v for k, v in os.environ.items() if k in ENV_WHITELIST})


def _memory_available() -> int | None:
    """Bytes more workers may use: the host's available memory, or its cgroup's headroom."""
    memory = [v for v in (procfs.read_meminfo().get("MemAvailable"), memory_headroom("self")) if v is not None]
    return min(memory) if memory else None


def _worker_memory(pids: list[int], num_workers: int, available: int | None) -> float | None:
    """One worker's private memory, as the plan's memory limit needs it. Its resident size
    (cheap) bounds it from above; smaps (milliseconds a worker of a large trainer) is read
    only where that bound would cap the workers the plan may add."""
    rss = _mean([float(st.rss_bytes) for pid in pids if (st := procfs.read_stat(pid)) is not None])
    if rss is None or available is None:
        return rss
    room = T.MEMORY_LIMIT * available
    if (T.MAX_WORKERS - num_workers) * rss <= room:
        return rss
    values = []
    for pid in pids:
        try:
            memory = procfs.read_smaps_rollup(pid)
        except PermissionError:
            memory = None
        if memory is not None:
            values.append(float(memory.uss_bytes))
    return _mean(values) or rss
