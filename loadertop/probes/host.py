"""The host and CPU budget: CPU count, a process's usable CPUs, load, memory."""

from __future__ import annotations

import math
import os
import socket
import time

from ..model import HostSnapshot
from . import procfs

CGROUP_ROOT = "/sys/fs/cgroup"


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return None


def _cgroup_paths(pid: int | str) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu-controller path) of pid's cgroup, relative to the hierarchy."""
    text = None
    try:
        with open(f"{procfs.PROC}/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None, None
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _walk_up(root: str, rel: str):
    rel = rel.strip("/")
    while True:
        yield os.path.join(root, rel) if rel else root
        if not rel:
            return
        rel = os.path.dirname(rel)


def cgroup_cpu_quota(pid: int | str) -> float | None:
    """The tightest CPU quota (in CPUs) on pid's cgroup or its ancestors, or None."""
    v2, v1 = _cgroup_paths(pid)
    limits: list[float] = []
    if v2 is not None:
        for base in (CGROUP_ROOT, os.path.join(CGROUP_ROOT, "unified")):
            for d in _walk_up(base, v2):
                line = _read_first_line(os.path.join(d, "cpu.max"))
                if line:
                    quota, _, period = line.partition(" ")
                    if quota != "max" and period:
                        limits.append(int(quota) / int(period))
    if v1 is not None:
        for d in _walk_up(os.path.join(CGROUP_ROOT, "cpu"), v1):
            quota = _read_first_line(os.path.join(d, "cpu.cfs_quota_us"))
            period = _read_first_line(os.path.join(d, "cpu.cfs_period_us"))
            if quota and period and int(quota) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def usable_cpus(pid: int | str = 0) -> int | None:
    """Affinity of pid capped by its cgroup quota (os.cpu_count() overstates both)."""
    try:
        affinity = len(os.sched_getaffinity(int(pid)))
    except (OSError, ValueError):
        return None
    quota = cgroup_cpu_quota(pid if pid else "self")
    if quota is not None:
        # A fractional quota still lets that many workers run; round down, at least one.
        return max(1, min(affinity, math.floor(quota)))
    return affinity


def dataloader_owners() -> dict[int, int]:
    """Trainer pid -> live DataLoader workers, for every loader on the machine (a scan by
    worker comm, ~2 ms for 300 processes). A worker's trainer is its parent, or the fork
    server's parent with the forkserver start method."""
    counts: dict[int, int] = {}
    for name in os.listdir(procfs.PROC):
        if not name.isdigit():
            continue
        st = procfs.read_stat(int(name))
        if st is None or st.comm != "pt_data_worker" or st.state == "Z":
            continue
        owner = st.ppid
        try:
            args = procfs.cmdline(owner) or []
        except PermissionError:
            args = []
        if any("multiprocessing.forkserver" in a for a in args):
            parent = procfs.read_stat(owner)
            owner = parent.ppid if parent else owner
        counts[owner] = counts.get(owner, 0) + 1
    return counts


def scan_dataloaders() -> tuple[int, int]:
    """(workers, trainers) of every DataLoader on the machine."""
    owners = dataloader_owners()
    return sum(owners.values()), len(owners)


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
        self._scan: tuple[int, int] | None = None
        self._scanned_at = float("-inf")

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
        if now - self._scanned_at >= self.SCAN_INTERVAL_S:
            try:
                self._scan = scan_dataloaders()
            except OSError:
                self._scan = None
            self._scanned_at = now
        return HostSnapshot(
            hostname=self._hostname,
            cpu_count=self._cpu_count,
            usable_cpus=self._usable,
            mem_total_bytes=mem.get("MemTotal"),
            mem_available_bytes=mem.get("MemAvailable"),
            load_avg=self._load,
            cpu_percent=cpu,
            dataloader_workers=self._scan[0] if self._scan else None,
            dataloader_trainers=self._scan[1] if self._scan else None,
        )
