"""What a process's cgroups allow it: its CPU quota (and how often the quota throttles it)
and its memory limit. cgroup v2 (`cpu.max`, `memory.max`) and v1 (the `cpu` and `memory`
controllers) alike; the tightest limit on the process's group or any ancestor wins.

Readers return None when there is no limit or nothing can be read: callers decide.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from . import procfs

ROOT = "/sys/fs/cgroup"
UNLIMITED = 2**60  # v1 writes "no limit" as a page-rounded 2**63


def _first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return None


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def paths(pid: int | str) -> dict[str, str]:
    """Controller -> pid's group, relative to that hierarchy ("" for the v2 unified one)."""
    out: dict[str, str] = {}
    for line in _lines(f"{procfs.PROC}/{pid}/cgroup"):
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        for controller in parts[1].split(","):
            if controller:
                out[controller] = parts[2]
    return out


def _walk_up(root: str, rel: str) -> Iterator[str]:
    """The group's folder, then each ancestor's, up to the hierarchy's root."""
    rel = rel.strip("/")
    while True:
        yield os.path.join(root, rel) if rel else root
        if not rel:
            return
        rel = os.path.dirname(rel)


def _v2_roots() -> tuple[str, ...]:
    return (ROOT, os.path.join(ROOT, "unified"))


@dataclass(frozen=True)
class CpuLimit:
    cpus: float  # the quota, in CPUs
    group: str  # the folder that sets it: its cpu.stat counts the throttling

    def throttling(self) -> tuple[int, int] | None:
        """(periods, throttled periods) so far: rates between two reads say how often the
        quota runs out before its period ends."""
        stats = {}
        for line in _lines(os.path.join(self.group, "cpu.stat")):
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                stats[key] = int(value)
        if "nr_periods" not in stats or "nr_throttled" not in stats:
            return None
        return stats["nr_periods"], stats["nr_throttled"]


def cpu_limit(pid: int | str) -> CpuLimit | None:
    """The tightest CPU quota on pid's group or its ancestors."""
    groups = paths(pid)
    found: list[CpuLimit] = []
    if "" in groups:
        for base in _v2_roots():
            for folder in _walk_up(base, groups[""]):
                line = _first_line(os.path.join(folder, "cpu.max"))
                if line:
                    quota, _, period = line.partition(" ")
                    if quota != "max" and period:
                        try:
                            found.append(CpuLimit(int(quota) / int(period), folder))
                        except (ValueError, ZeroDivisionError):
                            continue
    if "cpu" in groups:
        for folder in _walk_up(os.path.join(ROOT, "cpu"), groups["cpu"]):
            quota_us = _first_line(os.path.join(folder, "cpu.cfs_quota_us"))
            period_us = _first_line(os.path.join(folder, "cpu.cfs_period_us"))
            try:
                if quota_us and period_us and int(quota_us) > 0:
                    found.append(CpuLimit(int(quota_us) / int(period_us), folder))
            except (ValueError, ZeroDivisionError):
                continue
    return min(found, key=lambda limit: limit.cpus) if found else None


def memory_headroom(pid: int | str) -> int | None:
    """Bytes pid's memory cgroups still allow (limit - usage, the tightest over ancestors),
    None without a limit."""
    groups = paths(pid)
    room: list[int] = []

    def add(limit_file: str, usage_file: str, folder: str) -> None:
        limit = _first_line(os.path.join(folder, limit_file))
        usage = _first_line(os.path.join(folder, usage_file))
        if limit and usage and limit.isdigit() and usage.isdigit() and int(limit) < UNLIMITED:
            room.append(max(0, int(limit) - int(usage)))

    if "" in groups:
        for base in _v2_roots():
            for folder in _walk_up(base, groups[""]):
                add("memory.max", "memory.current", folder)
    if "memory" in groups:
        for folder in _walk_up(os.path.join(ROOT, "memory"), groups["memory"]):
            add("memory.limit_in_bytes", "memory.usage_in_bytes", folder)
    return min(room) if room else None


def sched_group(pid: int | str) -> str | None:
    """The group the kernel's fair scheduler shares a contended CPU by, before it shares among
    threads: the process's `cpu` cgroup; in the root group, its autogroup (one per session,
    where `kernel.sched_autogroup_enabled=1`). A second worker takes a larger share only from
    processes of the same group. None where neither can be read."""
    found = paths(pid)
    group = found.get("cpu", found.get(""))
    if group is not None and group.strip("/"):
        return f"cgroup:{group}"
    line = _first_line(f"{procfs.PROC}/{pid}/autogroup")  # "/autogroup-45 nice 0"
    if line:
        return line.split()[0].lstrip("/")
    return "cgroup:/" if group is not None else None
