"""The host and CPU budget: CPU count, a process's usable CPUs, load, memory, how busy each
CPU is, and every DataLoader on the machine (whose CPUs it runs on, how much it uses)."""

from __future__ import annotations

import math
import os
import pwd
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass

from ..model import BusyProcess, HostLoader, HostSnapshot
from . import procfs
from .cgroup import cpu_limit, sched_group
from .discovery import WORKER_COMM, is_fork_server, launches_ranks, runs_loadertop, runs_python


def usable_cpus(pid: int | str = 0) -> int | None:
    """Affinity of pid capped by its cgroup quota (os.cpu_count() overstates both)."""
    try:
        affinity = len(os.sched_getaffinity(int(pid)))
    except (OSError, ValueError):
        return None
    limit = cpu_limit(pid if pid else "self")
    quota = limit.cpus if limit is not None else None
    if quota is not None:
        # A fractional quota still lets that many workers run; round down, at least one.
        return max(1, min(affinity, math.floor(quota)))
    return affinity


def cpu_set(pid: int | str = 0) -> tuple[int, ...] | None:
    """The CPUs pid may run on (its affinity), sorted."""
    try:
        return tuple(sorted(os.sched_getaffinity(int(pid))))
    except (OSError, ValueError):
        return None


@dataclass
class _Owner:
    workers: int
    ticks: int  # CPU ticks of the owner and its workers so far
    started: int  # the owner's start ticks: with its pid, its identity


def _owners(known: dict[int, tuple[int, ...]] | None = None,
            every: dict[int, procfs.Stat] | None = None) -> dict[int, _Owner]:
    """Trainer pid -> its live DataLoader workers and their CPU ticks, for every loader on the
    machine (a scan by worker comm: one stat read a process).

    `known`: workers of watched trainers recognised otherwise (the hook's pids, a stack dump):
    torchdata's workers do not carry torch's name, and only a watched trainer can tell them."""
    owners: dict[int, _Owner] = {}
    python: dict[int, bool] = {}
    for name in os.listdir(procfs.PROC):
        if not name.isdigit():
            continue
        st = procfs.read_stat(int(name))
        if st is not None and every is not None:
            every[st.pid] = st  # the scan reads every process once: each one's CPU, for the busiest
        if st is None or st.comm != WORKER_COMM or st.state == "Z":
            continue
        owner = _trainer_of(st)
        if owner not in python:
            python[owner] = _is_python(owner)
        if not python[owner]:
            continue  # a comm anyone can set: a worker counts only under a Python trainer
        _count(owners, owner, st)
    for trainer, pids in (known or {}).items():
        for pid in pids:
            st = procfs.read_stat(pid)
            if st is None or st.comm == WORKER_COMM or st.state == "Z" or _trainer_of(st) != trainer:
                continue  # named ones were counted above; a gone or reused pid is not a worker
            _count(owners, trainer, st)
    return owners


def _count(owners: dict[int, _Owner], trainer: int, worker: procfs.Stat) -> None:
    if trainer not in owners:
        main = procfs.read_stat(trainer)
        owners[trainer] = _Owner(0, main.cpu_ticks if main else 0, main.start_ticks if main else 0)
    owners[trainer].workers += 1
    owners[trainer].ticks += worker.cpu_ticks


def _trainer_of(worker: procfs.Stat) -> int:
    """A worker's trainer: its parent, or the fork server's parent with the forkserver start
    method."""
    try:
        args = procfs.cmdline(worker.ppid) or []
    except PermissionError:
        args = []
    if is_fork_server(args):
        parent = procfs.read_stat(worker.ppid)
        return parent.ppid if parent else worker.ppid
    return worker.ppid


# Trainers judged by their maps, by (pid, start ticks): a trainer is read once.
_TORCH: dict[tuple[int, int], bool] = {}
_TORCH_KEPT = 4096


def _is_python(pid: int) -> bool:
    """A real DataLoader trainer: a Python interpreter (by name or command line) that has
    torch loaded, as loadertop can read in its maps. Anyone can name a process python and its
    children pt_data_worker; such fakes must not shrink other jobs' share of the CPUs, and
    another user's trainer loadertop may not read is no trainer it can weigh."""
    st = procfs.read_stat(pid)
    if st is None:
        return False
    try:
        args = [] if st.comm.startswith("python") else procfs.cmdline(pid) or []
    except PermissionError:
        return False
    if not runs_python(st, args):
        return False
    key = (pid, st.start_ticks)
    if key not in _TORCH:
        try:
            maps = procfs.read_maps(pid) or ""
        except PermissionError:
            maps = ""
        if len(_TORCH) >= _TORCH_KEPT:
            _TORCH.clear()
        _TORCH[key] = "libtorch" in maps or "/torch/_C" in maps
    return _TORCH[key]


def dataloader_owners() -> dict[int, int]:
    """Trainer pid -> live DataLoader workers, for every loader on the machine."""
    return {pid: o.workers for pid, o in _owners().items()}


def scan_dataloaders() -> tuple[int, int]:
    """(workers, trainers) of every DataLoader on the machine."""
    owners = _owners()
    return sum(o.workers for o in owners.values()), len(owners)


def own_cpu_ticks(jobs: frozenset[int] = frozenset()) -> int:
    """CPU ticks of this process and everything it started (py-spy), live or reaped, but for
    the jobs it watches (`loadertop demo` starts its job): a sum that only grows, so its rate
    is what watching costs the machine."""
    total = 0
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        times = procfs.read_cpu_ticks_with_children(pid)
        if times is not None:
            total += times
        stack.extend(p for p in procfs.children(pid) if p not in jobs)
    return total


class _PerCpu:
    """How busy each CPU was over the last few seconds, from /proc/stat's cpuN lines, and how
    much of that was loadertop itself (it is not a load the job will have to share with).

    Read every PERIOD_S, not every tick: a 256-CPU host has 256 lines to split, and the
    rules average over longer windows anyway."""

    PERIOD_S = 5.0
    # The first period is short: until this reading the host's load is unknown, and a first
    # verdict read without it (others 0.0 CPUs) said INPUT-BOUND of a job beside a CPU hog, held
    # it, and differed from every snapshot's BUSY HOST.
    FIRST_PERIOD_S = 1.0

    def __init__(self) -> None:
        self._prev: dict[int, tuple[int, int]] | None = None
        self._own: tuple[float, int] | None = None
        self._at = float("-inf")
        self.busy: dict[int, float] = {}  # cpu -> busy share over the last period
        self.own_cpus: float | None = None  # CPUs loadertop and its py-spy used over it

    def refresh(self, now: float, jobs: frozenset[int] = frozenset()) -> None:
        if now - self._at < (self.PERIOD_S if self.busy else self.FIRST_PERIOD_S):
            return
        times = procfs.read_per_cpu_times()
        if not times:
            return
        own = own_cpu_ticks(jobs)
        if self._prev is not None:
            busy = {}
            for cpu, (b, t) in times.items():
                prev = self._prev.get(cpu)
                if prev is not None and t > prev[1]:
                    busy[cpu] = min(1.0, max(0.0, (b - prev[0]) / (t - prev[1])))
            self.busy = busy
        if self._own is not None and now > self._own[0]:
            self.own_cpus = max(0.0, (own - self._own[1]) / procfs.CLK_TCK / (now - self._own[0]))
        self._prev = times
        self._own = (now, own)
        self._at = now

    def busy_cpus(self, cpus: Collection[int]) -> float | None:
        """Busy CPUs (a sum of shares) among `cpus`, not counting loadertop's own share of
        them (spread evenly over the machine), None before two readings."""
        if not self.busy:
            return None
        busy = sum(self.busy.get(c, 0.0) for c in cpus)
        own = (self.own_cpus or 0.0) * len(cpus) / max(1, len(self.busy))
        return max(0.0, busy - own)


class HostProbe:
    """Host-wide figures; host CPU % needs the previous reading, so this keeps it."""

    SCAN_INTERVAL_S = 10.0

    def __init__(self) -> None:
        self._hostname = socket.gethostname()
        self._cpu_count = os.cpu_count() or 1
        self._usable = usable_cpus(0)
        self.files = procfs.ProcFiles()  # the same three files every tick: kept open
        self._prev_cpu = procfs.read_cpu_times(self.files)
        self._load = procfs.read_loadavg(self.files) or (0.0, 0.0, 0.0)
        self._loaders: tuple[HostLoader, ...] | None = None
        self._owner_ticks: dict[tuple[int, int], tuple[float, int]] = {}
        self._scanned_at = float("-inf")
        self._ticks: dict[tuple[int, int], tuple[float, int]] = {}  # every process's CPU at the last scan
        self._busiest: tuple[BusyProcess, ...] = ()
        self.per_cpu = _PerCpu()
        self.jobs: frozenset[int] = frozenset()  # watched jobs: not our own load, even as our children
        # Watched trainers' workers recognised by the hook or a stack dump (no torch name).
        self.known_workers: dict[int, tuple[int, ...]] = {}

    @property
    def hostname(self) -> str:
        return self._hostname

    def sample(self) -> HostSnapshot:
        mem = procfs.read_meminfo(self.files)
        times = procfs.read_cpu_times(self.files)
        cpu = None
        if times is not None and self._prev_cpu is not None and times[1] > self._prev_cpu[1]:
            cpu = 100.0 * (times[0] - self._prev_cpu[0]) / (times[1] - self._prev_cpu[1])
        if times is not None:  # a failed read keeps the last good one to compare with
            self._prev_cpu = times
        self._load = procfs.read_loadavg(self.files) or self._load
        now = time.monotonic()
        self.per_cpu.refresh(now, self.jobs)
        if now - self._scanned_at >= self.SCAN_INTERVAL_S:
            try:
                self._loaders = self._scan(now)
            except OSError:
                self._loaders = None
            self._scanned_at = now
        loaders = self._loaders
        return HostSnapshot(
            hostname=self._hostname,
            cpu_count=self._cpu_count,
            usable_cpus=self._usable,
            mem_total_bytes=mem.get("MemTotal"),
            mem_available_bytes=mem.get("MemAvailable"),
            load_avg=self._load,
            cpu_percent=cpu,
            dataloader_workers=sum(h.workers for h in loaders) if loaders is not None else None,
            dataloader_trainers=len(loaders) if loaders is not None else None,
            loaders=loaders or (),
            busiest=self._busiest,
        )

    def _scan(self, now: float) -> tuple[HostLoader, ...]:
        """Every DataLoader on the machine, with the CPUs it may use and uses (its CPU over
        the time since the previous scan)."""
        out = []
        seen: dict[tuple[int, int], tuple[float, int]] = {}
        every: dict[int, procfs.Stat] = {}
        owners = _owners(self.known_workers, every)
        self._busiest = self._busiest_of(every, owners, now)
        for pid, owner in sorted(owners.items()):
            key = (pid, owner.started)
            prev = self._owner_ticks.get(key)
            cores = None
            if prev is not None and now > prev[0]:
                cores = max(0.0, (owner.ticks - prev[1]) / procfs.CLK_TCK / (now - prev[0]))
            seen[key] = (now, owner.ticks)
            out.append(HostLoader(pid, owner.workers, cpu_set(pid) or (), cores))
        self._owner_ticks = seen
        return tuple(out)


    def _busiest_of(self, every: dict[int, procfs.Stat], owners: dict[int, _Owner],
                    now: float) -> tuple[BusyProcess, ...]:
        """The processes that used the most CPU since the previous scan, outside the jobs:
        not a DataLoader trainer or worker, not loadertop and what it started (py-spy), the
        busiest BUSY_KEPT of them, each with the scheduler's group it is in (two small reads
        a process, once a scan)."""
        ours = {os.getpid(), *procfs.descendants(os.getpid())}
        ticks = {(st.pid, st.start_ticks): (now, st.cpu_ticks) for st in every.values()}
        used = []
        for (pid, start), (_, total) in ticks.items():
            prev = self._ticks.get((pid, start))
            st = every[pid]
            if prev is None or now <= prev[0] or pid in owners or st.comm == WORKER_COMM or pid in ours \
                    or st.ppid in owners or pid in self.jobs:
                continue
            cores = (total - prev[1]) / procfs.CLK_TCK / (now - prev[0])
            if cores >= BUSY_PROCESS_CORES:
                used.append((cores, st))
        self._ticks = ticks
        used.sort(key=lambda c: -c[0])
        return tuple(BusyProcess(st.pid, st.comm, _user(st.pid), round(cores, 2), sched_group(st.pid))
                     for cores, st in used[:BUSY_KEPT])


# A process counts among the busiest from this share of a CPU; the verdict names this many.
BUSY_PROCESS_CORES = 0.1
BUSY_KEPT = 32  # the busy processes a snapshot keeps (the verdict names the first few)
_users: dict[int, str] = {}


def _user(pid: int) -> str:
    try:
        uid = os.stat(f"{procfs.PROC}/{pid}").st_uid
    except OSError:
        return "?"
    if uid not in _users:
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = str(uid)
    return _users[uid]


def job_roots(gpu_pids: frozenset[int] = frozenset()) -> set[int]:
    """Every training job on this host, by the pid loadertop watches it under: each process
    that owns DataLoader workers (or holds a GPU), or the launcher above it (torchrun's agent:
    its ranks are one job). Any other parent (a shell, srun, a notebook, a sweep script) is
    not part of the job."""
    roots = set()
    for pid in set(dataloader_owners()) | set(gpu_pids):
        try:
            if runs_loadertop(procfs.cmdline(pid) or []):
                continue  # another loadertop (an exporter, a monitor) is no training job
        except PermissionError:
            pass
        root = pid
        for _ in range(64):
            st = procfs.read_stat(root)
            if st is None or st.ppid <= 1:
                break
            parent = procfs.read_stat(st.ppid)
            if parent is None or not _launcher(parent):
                break
            root = parent.pid
        roots.add(root)
    return roots


def _launcher(st: procfs.Stat) -> bool:
    if st.comm == "pt_elastic":
        return True
    try:
        args = procfs.cmdline(st.pid) or []
    except PermissionError:
        return False
    return launches_ranks(st, args)
