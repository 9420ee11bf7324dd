"""The training processes on this machine: owners of DataLoader workers, and processes
holding a GPU context. For `loadertop` with no PID."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

from .probes import procfs
from .redact import redact_cmdline


@dataclass(frozen=True)
class Candidate:
    pid: int
    workers: int
    on_gpu: bool
    user: str
    command: str


def _user(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        return pwd.getpwuid(uid).pw_name
    except (OSError, KeyError):
        return "?"


def find_trainers(gpu_pids: Iterable[int] = ()) -> list[Candidate]:
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
    gpu = set(gpu_pids)
    out = []
    for pid in sorted(set(counts) | gpu):
        try:
            args = procfs.cmdline(pid)
        except PermissionError:
            args = None
        if args is None and procfs.read_stat(pid) is None:
            continue
        out.append(Candidate(pid, counts.get(pid, 0), pid in gpu, _user(pid),
                             " ".join(redact_cmdline(args or ["?"]))))
    return out
