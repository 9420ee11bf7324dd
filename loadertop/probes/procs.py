"""Discovery of trainers and DataLoader workers in a job's process tree, and per-process
sampling: cheap fields every tick, smaps and per-thread figures on a slower, staggered,
time-budgeted cadence.

A process is identified by (pid, start ticks) so that a reused PID is never taken for the
process that had it before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..model import ProcessSample
from . import procfs

WORKER_COMM = "pt_data_worker"
PIN_THREAD_COMM = "pt_data_pin"
# Children of a trainer that belong to multiprocessing, not to the DataLoader.
HELPER_MARKERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
)
LAUNCHER_MARKERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "stopped",
    "Z": "zombie",
    "X": "exited",
    "I": "idle",
}

Key = tuple[int, int]  # (pid, start ticks)


def key_of(st: procfs.Stat) -> Key:
    return (st.pid, st.start_ticks)


@dataclass
class Tree:
    """One walk of a job's process tree."""

    root: procfs.Stat | None
    stats: dict[int, procfs.Stat] = field(default_factory=dict)
    parent: dict[int, int] = field(default_factory=dict)
    workers: dict[int, list[int]] = field(default_factory=dict)  # owner pid -> worker pids
    trainer_threads: dict[int, list[procfs.Stat]] = field(default_factory=dict)


class Discovery:
    """Walks job trees through /proc/<pid>/task/*/children; caches command lines by key."""

    def __init__(self) -> None:
        self._cmdlines: dict[Key, list[str] | None] = {}

    def cmdline(self, st: procfs.Stat) -> list[str] | None:
        key = key_of(st)
        if key not in self._cmdlines:
            try:
                self._cmdlines[key] = procfs.cmdline(st.pid)
            except PermissionError:
                self._cmdlines[key] = None
        return self._cmdlines[key]

    def forget(self, live: set[Key]) -> None:
        for key in [k for k in self._cmdlines if k not in live]:
            del self._cmdlines[key]

    def is_helper(self, st: procfs.Stat) -> bool:
        args = " ".join(self.cmdline(st) or ())
        return any(m in args for m in HELPER_MARKERS)

    def is_launcher(self, st: procfs.Stat) -> bool:
        args = self.cmdline(st) or []
        return any(m in a for a in args[:3] for m in LAUNCHER_MARKERS)

    def is_python(self, st: procfs.Stat) -> bool:
        if st.comm.startswith("python") or st.comm == WORKER_COMM:
            return True
        args = self.cmdline(st) or []
        return bool(args) and os.path.basename(args[0]).startswith("python")

    def walk(self, root_pid: int, root_start: int, known_trainers: Iterable[int] = ()) -> Tree:
        root = procfs.read_stat(root_pid)
        if root is None or root.start_ticks != root_start:
            return Tree(root=None)
        tree = Tree(root=root)
        tree.stats[root.pid] = root
        watch_threads = set(known_trainers)
        parents = None if procfs.HAVE_CHILDREN_FILE else procfs.all_parents()
        stack = [root]
        while stack:
            node = stack.pop()
            tids = procfs.task_ids(node.pid)
            kids = (
                procfs.children(node.pid, tids)
                if parents is None
                else [p for p, pp in parents.items() if pp == node.pid]
            )
            worker_kids = []
            for pid in kids:
                st = procfs.read_stat(pid)
                if st is None:
                    continue
                tree.stats[pid] = st
                tree.parent[pid] = node.pid
                if st.comm == WORKER_COMM:
                    worker_kids.append(pid)  # a worker's own children are not workers
                else:
                    stack.append(st)
            if worker_kids:
                owner = node.pid
                # forkserver workers hang under the fork server, which hangs under the trainer
                while owner in tree.parent and self.is_helper(tree.stats[owner]):
                    owner = tree.parent[owner]
                tree.workers.setdefault(owner, []).extend(worker_kids)
                watch_threads.add(owner)
            if node.pid in watch_threads or worker_kids:
                threads = [procfs.read_stat(node.pid, t) for t in tids]
                tree.trainer_threads[node.pid] = [t for t in threads if t is not None]
        for owner in tree.workers:
            if owner not in tree.trainer_threads:
                threads = [procfs.read_stat(owner, t) for t in procfs.task_ids(owner)]
                tree.trainer_threads[owner] = [t for t in threads if t is not None]
        return tree


@dataclass
class _Slow:
    """The slow-cadence readings of one process."""

    memory: procfs.Memory | None = None
    sampled_at: float | None = None
    thread_ticks: dict[int, int] = field(default_factory=dict)
    thread_wait_ns: dict[int, int] = field(default_factory=dict)
    busy_threads: int | None = None
    runqueue_wait: float | None = None
    torch_segments: dict[tuple[str, int], int] | None = None
    denied: bool = False


# A thread above this share of one core over the slow window counts as busy.
BUSY_THREAD_CPU = 0.3


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
        self.denied_memory: set[int] = set()  # pids whose smaps we may not read

    def sample(self, st: procfs.Stat, now: float, worker_id: int | None = None) -> ProcessSample:
        key = key_of(st)
        status = None
        if st.state != "Z":
            try:
                status = procfs.read_status(st.pid)
            except PermissionError:
                status = None
        cpu = vol_rate = invol_rate = None
        prev = self._prev.get(key)
        if status is not None:
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                cpu = max(0.0, 100.0 * (st.cpu_ticks - prev[1]) / procfs.CLK_TCK / dt)
                vol_rate = max(0.0, (status.ctx_voluntary - prev[2]) / dt)
                invol_rate = max(0.0, (status.ctx_involuntary - prev[3]) / dt)
            self._prev[key] = (now, st.cpu_ticks, status.ctx_voluntary, status.ctx_involuntary)
        slow = self._slow.get(key)
        memory = slow.memory if slow else None
        return ProcessSample(
            pid=st.pid,
            started_at=st.started_at,
            status=STATES.get(st.state, st.state),
            cpu_percent=cpu,
            rss_bytes=st.rss_bytes if st.state != "Z" else None,
            uss_bytes=memory.uss_bytes if memory else None,
            pss_bytes=memory.pss_bytes if memory else None,
            memory_sampled_at=slow.sampled_at if slow else None,
            threads=st.num_threads if st.state != "Z" else None,
            busy_threads=slow.busy_threads if slow else None,
            runqueue_wait_s_per_s=slow.runqueue_wait if slow else None,
            ctx_switches_voluntary_per_s=vol_rate,
            ctx_switches_involuntary_per_s=invol_rate,
            worker_id=worker_id,
        )

    def refresh_slow(self, stats: list[procfs.Stat], now: float) -> None:
        """Refresh the stalest processes' smaps, maps and threads within the time budget."""
        due = []
        for st in stats:
            if st.state == "Z":
                continue
            slow = self._slow.get(key_of(st))
            last = slow.sampled_at if slow and slow.sampled_at is not None else None
            # The second reading comes soon: busy threads need two.
            wait = self.slow_interval_s if slow and slow.busy_threads is not None else 1.0
            if last is None or now - last >= wait - 1e-3:
                due.append((last if last is not None else float("-inf"), st))
        due.sort(key=lambda item: item[0])
        started = time.perf_counter()
        for _, st in due:
            self._refresh_one(st, now)
            if time.perf_counter() - started >= self.slow_budget_s:
                break

    def _refresh_one(self, st: procfs.Stat, now: float) -> None:
        key = key_of(st)
        slow = self._slow.setdefault(key, _Slow())
        prev_at = slow.sampled_at
        slow.sampled_at = now
        try:
            slow.memory = procfs.read_smaps_rollup(st.pid)
            slow.torch_segments = procfs.torch_shm_segments(st.pid)
        except PermissionError:
            slow.denied = True
            self.denied_memory.add(st.pid)
        threads = None
        try:
            threads = procfs.read_threads(st.pid)
        except PermissionError:
            pass
        if threads is None:
            return
        ticks = {t.tid: t.cpu_ticks for t in threads}
        waits = {t.tid: t.runqueue_wait_ns for t in threads if t.runqueue_wait_ns is not None}
        if prev_at is not None and now > prev_at:
            dt = now - prev_at
            busy = 0
            for tid, value in ticks.items():
                before = slow.thread_ticks.get(tid)
                if before is not None and (value - before) / procfs.CLK_TCK / dt >= BUSY_THREAD_CPU:
                    busy += 1
            slow.busy_threads = busy
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
        for table in (self._prev, self._slow):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.denied_memory &= {k[0] for k in live}
