"""Discovery of trainers and DataLoader workers in a job's process tree, and per-process
sampling: cheap fields every tick, smaps and per-thread figures on a slower, staggered,
time-budgeted cadence.

A process is identified by (pid, start ticks) so that a reused PID is never taken for the
process that had it before.
"""

from __future__ import annotations

import os
import threading
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
    others: list[int] = field(default_factory=list)  # every process of the tree that is not a worker
    pin_threads: dict[int, list[procfs.Stat]] = field(default_factory=dict)  # trainer -> pin threads
    found_by: dict[int, str] = field(default_factory=dict)  # worker pid -> FOUND_BY_*
    # Python children of a Python process that nothing names a worker yet: a dump of their
    # stack tells (torchdata's StatefulDataLoader workers keep the trainer's name).
    candidates: list[int] = field(default_factory=list)


# How a worker was recognised, as the report says it.
FOUND_BY_NAME = "name"  # its thread name, pt_data_worker (torch's own worker loop sets it)
FOUND_BY_HOOK = "hook"  # loadertop.watch() in the script published its pid
FOUND_BY_STACK = "stack"  # py-spy showed a DataLoader worker loop in it (torchdata's, say)


class Discovery:
    """Walks job trees through /proc/<pid>/task/*/children; caches command lines by key."""

    def __init__(self) -> None:
        self._cmdlines: dict[Key, list[str] | None] = {}
        self._threads: dict[Key, _Threads] = {}
        self.files = procfs.ProcFiles()  # every process's stat, open between ticks
        # Workers recognised by other means than their name, told by the sampler.
        self.stack_workers: set[Key] = set()  # a dump showed a worker loop
        self.hook_workers: dict[int, set[int]] = {}  # trainer -> worker pids its hooks published

    def cmdline(self, st: procfs.Stat) -> list[str] | None:
        key = key_of(st)
        if key not in self._cmdlines:
            try:
                self._cmdlines[key] = procfs.cmdline(st.pid)
            except PermissionError:
                self._cmdlines[key] = None
        return self._cmdlines[key]

    def forget(self, live: set[Key]) -> None:
        for table in (self._cmdlines, self._threads):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.stack_workers &= live
        self.files.sweep()

    def close(self) -> None:
        self.files.close()

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

    def walk(
        self, root_pid: int, root_start: int, known_trainers: Iterable[int] = (), now: float | None = None
    ) -> Tree:
        now = time.monotonic() if now is None else now
        root = procfs.read_stat(root_pid, files=self.files)
        if root is None or root.start_ticks != root_start:
            return Tree(root=None)
        tree = Tree(root=root, others=[root.pid])
        tree.stats[root.pid] = root
        known = set(known_trainers)
        parents = None if procfs.HAVE_CHILDREN_FILE else procfs.all_parents()
        stack = [root]
        while stack:
            node = stack.pop()
            threads = self._threads.get(key_of(node))
            if threads is None or now - threads.scanned_at >= THREAD_RESCAN_S:
                threads = self._scan_threads(node, now, parents)
            kids = (
                procfs.children(node.pid, sorted(threads.child_tids))
                if parents is None
                else [p for p, pp in parents.items() if pp == node.pid]
            )
            worker_kids = []
            # Whose workers node's children would be: forkserver workers hang under the fork
            # server, which hangs under the trainer.
            owner = node.pid
            while kids and owner in tree.parent and self.is_helper(tree.stats[owner]):
                owner = tree.parent[owner]
            for pid in kids:
                st = procfs.read_stat(pid, files=self.files)
                if st is None:
                    continue
                tree.stats[pid] = st
                tree.parent[pid] = node.pid
                how = self._worker_by(st, owner)
                if how is not None:
                    worker_kids.append(pid)  # a worker's own children are not workers
                    tree.found_by[pid] = how
                else:
                    stack.append(st)
                    tree.others.append(pid)
                    if self._may_be_worker(st, node):
                        tree.candidates.append(pid)
            if worker_kids:
                tree.workers.setdefault(owner, []).extend(worker_kids)
        for pid in known | set(tree.workers):
            st = tree.stats.get(pid)
            if st is None:
                continue
            threads = self._threads.get(key_of(st))
            # A new set of workers means a new loader iterator, and maybe a new pin thread.
            n_workers = len(tree.workers.get(pid, ()))
            if threads is None or threads.pin_tids is None or threads.workers_seen != n_workers:
                threads = self._scan_threads(st, now, parents, with_names=True)
                threads.workers_seen = n_workers
            pins = [procfs.read_stat(pid, tid, self.files) for tid in threads.pin_tids or ()]
            tree.pin_threads[pid] = [t for t in pins if t is not None and t.comm == PIN_THREAD_COMM]
        return tree

    def _worker_by(self, st: procfs.Stat, owner: int) -> str | None:
        """How st, a child of owner's (through a fork server), is known to be a DataLoader
        worker, or None."""
        if st.comm == WORKER_COMM:
            return FOUND_BY_NAME  # the cheap path, and torch's own loader's
        if key_of(st) in self.stack_workers:
            return FOUND_BY_STACK
        published = self.hook_workers.get(owner)
        if published and self.is_python(st):
            try:
                # The script publishes pids as its own pid namespace numbers them.
                if published & set(procfs.read_nspid(st.pid)):
                    return FOUND_BY_HOOK
            except PermissionError:
                pass
        return None

    def _may_be_worker(self, st: procfs.Stat, parent: procfs.Stat) -> bool:
        """A Python child of a Python process, not multiprocessing's helper nor a launcher's
        rank: a worker of a loader that does not name its workers, or something else."""
        return (st.state != "Z" and self.is_python(st) and self.is_python(parent) and not self.is_launcher(parent)
                and not self.is_helper(st))

    def _scan_threads(self, st: procfs.Stat, now: float, parents, with_names: bool = False) -> _Threads:
        """Which threads fork children (and, for a trainer, which is the pin-memory thread).

        Between scans only those threads' children files are read: a trainer may run 60+
        threads (OpenMP), and reading all of them every tick would cost more than its workers.
        """
        tids = procfs.task_ids(st.pid)
        child_tids = {st.pid}
        if parents is None:
            for tid in tids:
                if procfs.children(st.pid, [tid]):
                    child_tids.add(tid)
        pin_tids = None
        if with_names:
            pin_tids = []
            for tid in tids:
                tst = procfs.read_stat(st.pid, tid)
                if tst is not None and tst.comm == PIN_THREAD_COMM:
                    pin_tids.append(tid)
        threads = _Threads(scanned_at=now, child_tids=child_tids, pin_tids=pin_tids)
        self._threads[key_of(st)] = threads
        return threads


THREAD_RESCAN_S = 5.0


@dataclass
class _Threads:
    scanned_at: float
    child_tids: set[int]  # threads seen forking children; always the main thread
    pin_tids: list[int] | None  # None: not looked for (not a trainer)
    workers_seen: int = -1


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
        self._credit = 0.0
        self.denied_memory: set[int] = set()  # pids whose smaps we may not read
        # Per pid, its Python threads besides the main one (from py-spy dumps): a worker's
        # queue feeder and resource sharer get busy handing batches over, but share the GIL
        # and are no thread pool, so they are not counted as busy threads.
        self.python_helpers: dict[int, frozenset[int]] = {}
        self.files = procfs.ProcFiles()  # every process's status, open between ticks

    def sample(self, st: procfs.Stat, now: float, worker_id: int | None = None,
               found_by: str | None = None) -> ProcessSample:
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
        return _frozen_sample({
            "pid": st.pid,
            "started_at": st.started_at,
            "status": STATES.get(st.state, st.state),
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
        })

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
            if now - slow.sampled_at >= self.slow_interval_s - 1e-3:
                due.append((slow.sampled_at, st, False))
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
            previous = (slow.sampled_at, slow.read_chars)
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
            if None not in (previous[0], previous[1], slow.read_chars) and now > previous[0]:
                slow.read_bytes_per_s = max(0.0, (slow.read_chars - previous[1]) / (now - previous[0]))
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
            # Busy: a real share of a core, and comparable to the busiest thread. On a
            # crowded machine a pool's threads each get little CPU, but they all get it.
            floor = max(BUSY_THREAD_MIN_CPU, BUSY_THREAD_OF_BUSIEST * max(shares.values(), default=0.0))
            slow.busy_threads = sum(1 for tid, share in shares.items() if share >= floor and tid not in helpers)
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
        pids = {k[0] for k in live}
        self.python_helpers = {pid: tids for pid, tids in self.python_helpers.items() if pid in pids}
        self.files.sweep()

    def close(self) -> None:
        self.files.close()


class ExitWatch:
    """Catches the exit status of dying workers between ticks.

    A killed worker is a zombie for only ~0.2 s before torch reaps it, and then the whole
    family is gone: a 1 s tick would rarely see how it died. The watch holds a pidfd per
    watched process (Linux 5.3+): it becomes readable the moment the process exits, and the
    thread then reads the zombie's exit status from /proc, at no cost while nothing dies.
    Where pidfds are unavailable it polls the processes' stat every 40 ms instead.
    """

    def __init__(self, min_interval_s: float = 0.04, per_process_s: float = 0.002) -> None:
        self.min_interval_s = min_interval_s
        self.per_process_s = per_process_s
        self._keys: frozenset[Key] = frozenset()
        self._codes: dict[Key, int | None] = {}
        self._fds: dict[Key, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._pidfds = hasattr(os, "pidfd_open") and self._pidfd_works()
        self._thread = threading.Thread(target=self._run, name="loadertop-exits", daemon=True)
        self._thread.start()

    @staticmethod
    def _pidfd_works() -> bool:
        try:
            os.close(os.pidfd_open(os.getpid()))
            return True
        except OSError:
            return False

    def watch(self, keys: Iterable[Key]) -> None:
        keys = frozenset(keys)
        with self._lock:
            # Keep the codes of processes watched until now: the next tick asks for them.
            old = self._keys
            self._codes = {k: v for k, v in self._codes.items() if k in keys or k in old}
            changed = keys != self._keys
            self._keys = keys
        if changed and self._pidfds:
            # Open the new pidfds here, before the tick returns: a worker killed right after
            # its first sight is then still caught (the thread only waits on them).
            for key in keys:
                if key not in self._fds:
                    self._open(key)
            os.write(self._wake_w, b"x")  # let the thread pick up the new set

    def _open(self, key: Key) -> None:
        try:
            fd = os.pidfd_open(key[0])
        except OSError:
            return  # already gone
        st = procfs.read_stat(key[0])
        if st is None or st.start_ticks != key[1]:
            os.close(fd)  # the pid was reused: not our process
            return
        with self._lock:
            self._fds[key] = fd

    def exit_code(self, key: Key) -> int | None:
        with self._lock:
            return self._codes.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _drop(self, selector, registered: set[Key], key: Key) -> None:
        if key in registered:
            selector.unregister(self._fds[key])
            registered.discard(key)
        with self._lock:
            fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def _see(self, key: Key) -> None:
        st = procfs.read_stat(key[0])
        if st is not None and st.start_ticks == key[1] and st.state == "Z":
            with self._lock:
                self._codes[key] = st.exit_code

    def _run(self) -> None:
        if self._pidfds:
            self._run_pidfds()
            return
        while not self._stop.is_set():
            with self._lock:
                keys = self._keys
            for key in keys:
                self._see(key)
            self._stop.wait(max(self.min_interval_s, self.per_process_s * len(keys)))

    def _run_pidfds(self) -> None:
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        registered: set[Key] = set()
        while not self._stop.is_set():
            with self._lock:
                keys, fds = self._keys, dict(self._fds)
            for key in [k for k in fds if k not in keys]:
                self._drop(selector, registered, key)
            for key, fd in fds.items():
                if key in keys and key not in registered:
                    selector.register(fd, selectors.EVENT_READ, key)
                    registered.add(key)
            for event, _ in selector.select(timeout=1.0):
                if event.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                self._see(event.data)
                self._drop(selector, registered, event.data)
        selector.close()
