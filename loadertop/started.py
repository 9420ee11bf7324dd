"""Processes loadertop starts itself (the demo job, `tune`'s trials) and how they end: in a
session of their own, killed with everything below them (torchrun's ranks leave the
process group with setsid, so the tree is walked too). Also how one is given a small
/dev/shm of its own, as a container's --shm-size."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from .probes.procfs import descendants


def stop_job(proc: subprocess.Popen) -> None:
    """Kill the job's process group and every process below it, and reap it."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def shm_wrapper(size: int | str) -> list[str]:
    """A command prefix that runs the rest in a mount namespace of its own with a tmpfs of
    `size` (bytes, or with a unit: "64m") on /dev/shm, as in a container (root only)."""
    script = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


def can_unshare_shm() -> bool:
    """shm_wrapper works here: root, unshare, and a mount namespace allowed."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run([*shm_wrapper("1m"), "true"], capture_output=True).returncode == 0
