"""Processes loadertop starts itself (the demo job, `tune`'s trials) and how they end: in a
session of their own, killed with everything below them (torchrun's ranks leave the
process group with setsid, so the tree is walked too)."""

from __future__ import annotations

import os
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
