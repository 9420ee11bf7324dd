"""Per-process sampling: cheap fields every tick, smaps and per-thread figures on a slower,
staggered, time-budgeted cadence."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..model import ProcessSample
from ..vocabulary import ProcessStatus
from . import procfs
from .discovery import Key, key_of

STATES: dict[str, ProcessStatus] = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "stopped",
    "Z": "zombie",
    "X": "exited",
    "I": "idle",
    # Letters no user process shows on kernels since 3.x, by their nearest meaning.
    "P": "idle",  # parked (kernel threads)
    "W": "running",  # waking
    "K": "sleeping",  # wakekill
}

@dataclass
class _Slow:
    """The slow-cadence readings of one process."""

    memory: procfs.Memory | None = None
    sampled_at: float | None = None  # when smaps (USS/PSS) and maps were read
    threads_at: float | None = None  # when the threads were read (None: never readable)
    thread_ticks: dict[int, int] = field(default_factory=dict)
    thread_wait_ns: dict[int, int] = field(default_factory=dict)
    busy_threads: int | None = None
    runqueue_wait: float | None = None
    torch_segments: dict[tuple[str, int], int] | None = None
    thread_pools: tuple[str, ...] = ()
    read_chars: int | None = None  # rchar at sampled_at
    read_bytes_per_s: float | None = None
    denied: bool = False


# Extra slow-cadence credit per tick, in budgets, while some process has never been read.
FIRST_READ_BOOST = 3.0
# A thread counts as busy above this share of one core and of its process's busiest thread.
BUSY_THREAD_MIN_CPU = 0.05
BUSY_THREAD_OF_BUSIEST = 0.25


def busy_thread_count(shares: dict[int, float], helpers: frozenset[int] = frozenset()) -> int:
    """Threads doing real work, from each thread's share of a core: a real share, and
    comparable to the busiest thread (on a crowded machine a pool's threads each get little
    CPU, but they all get it). `helpers`: Python threads that are no pool (queue feeders)."""
    floor = max(BUSY_THREAD_MIN_CPU, BUSY_THREAD_OF_BUSIEST * max(shares.values(), default=0.0))
    return sum(1 for tid, share in shares.items() if share >= floor and tid not in helpers)


def _frozen_sample(values: dict) -> ProcessSample:
    """A ProcessSample built without the frozen dataclass's __init__, which sets each field
    through object.__setattr__: 4 µs of the ~50 a process costs per tick. The object is the
    same frozen dataclass (equal, hashable, immutable) as one built by ProcessSample(...)."""
    sample = object.__new__(ProcessSample)
    sample.__dict__.update(values)
    return sample


class ProcessSampler:
    """Turns stats of a process into a ProcessSample with rates since its last sight.

    `cpu_percent` and context switches need the previous reading of the same process,
    kept by (pid, start ticks); smaps (USS/PSS, ~2.4 ms per GiB resident), the process's
    maps and its per-thread figures are refreshed on a slower cadence, oldest first, within
    a time budget per tick so that many large workers never make one tick expensive.
    """

    def __init__(self, slow_interval_s: float = 5.0, slow_budget_s: float = 0.005) -> None:
        self.slow_interval_s = slow_interval_s
        self.slow_budget_s = slow_budget_s
        self._prev: dict[Key, tuple[float, int, int, int]] = {}
        self._slow: dict[Key, _Slow] = {}
        self._main_prev: dict[Key, tuple[float, int, int]] = {}  # (when, on-CPU ns, queued ns)
        self._credit = 0.0
        self.denied_memory: set[int] = set()  # pids whose smaps we may not read
        # Per pid, its Python threads besides the main one (from py-spy dumps): a worker's
        # queue feeder and resource sharer get busy handing batches over, but share the GIL
        # and are no thread pool, so they are not counted as busy threads.
        self.python_helpers: dict[int, frozenset[int]] = {}
        self.files = procfs.ProcFiles()  # every process's status, open between ticks

    def sample(self, st: procfs.Stat, now: float, worker_id: int | None = None,
               found_by: str | None = None, main_thread: bool = False) -> ProcessSample:
        """`main_thread`: read the main thread's CPU and queueing every tick (a trainer's: the
        ranks of a job are compared by them over a window, with their tick-to-tick spread)."""
        key = key_of(st)
        ctx = None
        if st.state != "Z":
            try:
                ctx = procfs.read_ctx_switches(st.pid, self.files)
            except PermissionError:
                ctx = None
        cpu = vol_rate = invol_rate = None
        if ctx is not None:
            prev = self._prev.get(key)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                cpu = max(0.0, 100.0 * (st.cpu_ticks - prev[1]) / procfs.CLK_TCK / dt)
                vol_rate = max(0.0, (ctx[0] - prev[2]) / dt)
                invol_rate = max(0.0, (ctx[1] - prev[3]) / dt)
            self._prev[key] = (now, st.cpu_ticks, ctx[0], ctx[1])
        slow = self._slow.get(key)
        memory = slow.memory if slow else None
        alive = st.state != "Z"
        main_cpu = main_queued = None
        if main_thread and alive:
            main_cpu, main_queued = self._main_thread(key, st.pid, now)
        return _frozen_sample({
            "pid": st.pid,
            "started_at": st.started_at,
            "status": STATES.get(st.state, "sleeping"),
            "cpu_percent": cpu,
            "rss_bytes": st.rss_bytes if alive else None,
            "uss_bytes": memory.uss_bytes if memory else None,
            "pss_bytes": memory.pss_bytes if memory else None,
            "memory_sampled_at": slow.sampled_at if slow else None,
            "threads": st.num_threads if alive else None,
            "busy_threads": slow.busy_threads if slow else None,
            "runqueue_wait_s_per_s": slow.runqueue_wait if slow else None,
            "ctx_switches_voluntary_per_s": vol_rate,
            "ctx_switches_involuntary_per_s": invol_rate,
            "worker_id": worker_id,
            "doing": None,
            "doing_at": None,
            "thread_pools": slow.thread_pools if slow else (),
            "read_bytes_per_s": slow.read_bytes_per_s if slow else None,
            "found_by": found_by,
            "main_thread_cpu": main_cpu,
            "main_thread_runqueue_s_per_s": main_queued,
        })

    def _main_thread(self, key: Key, pid: int, now: float) -> tuple[float | None, float | None]:
        """The main thread's share of a CPU and its queueing (s/s) since the last tick."""
        times = procfs.read_main_thread_times(pid, self.files)
        prev = self._main_prev.get(key)
        if times is None:
            self._main_prev.pop(key, None)
            return None, None
        self._main_prev[key] = (now, *times)
        if prev is None or now <= prev[0]:
            return None, None
        dt = now - prev[0]
        return (min(1.0, max(0.0, (times[0] - prev[1]) / 1e9 / dt)),
                max(0.0, (times[1] - prev[2]) / 1e9 / dt))

    def refresh_slow(self, stats: list[procfs.Stat], now: float, complete: bool = False) -> None:
        """Refresh the stalest processes' smaps, maps and threads within the time budget
        (and, a second after a process's first reading, its threads alone, for busy threads).

        The budget is a credit: each tick adds slow_budget_s and each read spends what it
        cost, so one large process that alone takes longer than the budget is still read,
        and the average slow cost per tick stays at the budget however many workers run.
        `complete` (for a report's last tick) also reads every process never read yet.
        Call begin_tick() once per tick first.
        """
        if complete:
            for st in stats:
                if st.state != "Z" and key_of(st) not in self._slow:
                    self._refresh_one(st, now)
        due = []  # (last read, stat, threads only)
        boost = False
        for st in stats:
            if st.state == "Z":
                continue
            slow = self._slow.get(key_of(st))
            if slow is None:  # never read: first in line
                due.append((float("-inf"), st, False))
                # One that has lived a while (just attached, a new loader; not a worker churned
                # every epoch) earns a larger credit until each has USS/PSS once, so a view of
                # 100+ workers fills in minutes, not many more.
                boost = boost or now - st.started_at >= self.slow_interval_s
                continue
            if slow.busy_threads is None and slow.threads_at is not None:
                # Busy threads need a second reading of the threads, a second after the first:
                # the threads alone (a fraction of a millisecond), not smaps and maps again,
                # on the same boosted credit as the first reading.
                if now - slow.threads_at >= 1.0 - 1e-3:
                    due.append((float("-inf"), st, True))
                boost = boost or now - st.started_at >= self.slow_interval_s
                continue
            if slow.sampled_at is None or now - slow.sampled_at >= self.slow_interval_s - 1e-3:
                due.append((slow.sampled_at or float("-inf"), st, False))
        if boost:
            self._credit = min(self._credit + FIRST_READ_BOOST * self.slow_budget_s, 8 * self.slow_budget_s)
        if self._credit <= 0:
            return
        due.sort(key=lambda item: item[0])
        for _, st, threads_only in due:
            started = time.perf_counter()
            self._refresh_one(st, now, threads_only)
            self._credit -= time.perf_counter() - started
            if self._credit <= 0:
                break

    def begin_tick(self) -> None:
        self._credit = min(self._credit + self.slow_budget_s, 4 * self.slow_budget_s)

    def _refresh_one(self, st: procfs.Stat, now: float, threads_only: bool = False) -> None:
        key = key_of(st)
        slow = self._slow.setdefault(key, _Slow())
        if not threads_only:
            before_at, before_chars = slow.sampled_at, slow.read_chars
            slow.sampled_at = now
            try:
                slow.memory = procfs.read_smaps_rollup(st.pid)
                maps = procfs.read_maps(st.pid)
                slow.torch_segments = procfs.torch_shm_segments(st.pid, maps)
                slow.thread_pools = procfs.thread_pools(maps) if maps else ()
                slow.read_chars = procfs.read_io_chars(st.pid)
            except PermissionError:
                slow.denied = True
                self.denied_memory.add(st.pid)
            chars = slow.read_chars
            if before_at is not None and before_chars is not None and chars is not None and now > before_at:
                slow.read_bytes_per_s = max(0.0, (chars - before_chars) / (now - before_at))
        threads = None
        try:
            threads = procfs.read_threads(st.pid)
        except PermissionError:
            pass
        if threads is None:
            return
        prev_at, slow.threads_at = slow.threads_at, now
        ticks = {t.tid: t.cpu_ticks for t in threads}
        waits = {t.tid: t.runqueue_wait_ns for t in threads if t.runqueue_wait_ns is not None}
        if prev_at is not None and now > prev_at:
            dt = now - prev_at
            helpers = self.python_helpers.get(st.pid, frozenset())
            shares = {
                tid: (value - slow.thread_ticks[tid]) / procfs.CLK_TCK / dt
                for tid, value in ticks.items()
                if tid in slow.thread_ticks
            }
            slow.busy_threads = busy_thread_count(shares, helpers)
            waited = sum(w - slow.thread_wait_ns[t] for t, w in waits.items() if t in slow.thread_wait_ns)
            slow.runqueue_wait = max(0.0, waited / 1e9 / dt)
        slow.thread_ticks = ticks
        slow.thread_wait_ns = waits

    def torch_segments(self, keys: Iterable[Key]) -> dict[tuple[str, int], int] | None:
        """The union of the torch_* segments mapped by these processes, None if none read."""
        out: dict[tuple[str, int], int] = {}
        seen = False
        for key in keys:
            slow = self._slow.get(key)
            if slow and slow.torch_segments is not None:
                seen = True
                out.update(slow.torch_segments)
        return out if seen else None

    def forget(self, live: set[Key]) -> None:
        """Drop the state of processes no longer seen, so memory stays flat under churn."""
        for table in (self._prev, self._slow, self._main_prev):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.denied_memory &= {k[0] for k in live}
        pids = {k[0] for k in live}
        self.python_helpers = {pid: tids for pid, tids in self.python_helpers.items() if pid in pids}
        self.files.sweep()

    def close(self) -> None:
        self.files.close()
