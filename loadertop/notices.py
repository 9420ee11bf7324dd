"""Every notice loadertop gives: a figure it could not measure or a thing it could not watch,
and why. One id per condition, as rules/thresholds.py is for findings; a report's
`notices[].id` are these (docs/PERMISSIONS.md says which permission each one needs).
Below the ids: the notices that are built in more than one place, and the board that says
each notice once."""

from __future__ import annotations

import signal as signals

from .model import Notice

# GPUs (NVML)
NO_GPU = "no_gpu"  # no NVIDIA driver: GPU figures are off, and not worth a line on screen
GPU_ERROR = "gpu_error"  # NVML failed on a call
GPU_PERMISSION = "gpu_permission"  # NVML refuses this user
GPU_DRIVER_MISMATCH = "gpu_driver_mismatch"  # the kernel module and the library disagree

# Data wait (py-spy, the hook)
DATA_WAIT_OFF = "data_wait_off"  # --no-stacks and no hook
DATA_WAIT_NO_PYSPY = "data_wait_no_pyspy"  # py-spy missing or not runnable
DATA_WAIT_PTRACE = "data_wait_ptrace"  # ptrace refused
DATA_WAIT_TIMEOUT = "data_wait_timeout"  # a py-spy window did not finish
DATA_WAIT_ERROR = "data_wait_error"  # the stack thread failed once and goes on
DATA_WAIT_UNSUPPORTED = "data_wait_unsupported"  # a Python py-spy cannot read
HOOK_INVALID = "hook_invalid"  # a hook file that is not a valid one of the trainer's

# /proc and /dev/shm
MEMORY_PERMISSION = "memory_permission"  # smaps closed to this user: no USS/PSS
ENV_PERMISSION = "env_permission"  # the environment closed to this user
SHM_PERMISSION = "shm_permission"  # the trainer's /dev/shm cannot be read
SHM_UNREADABLE = "shm_unreadable"  # nor measured at all

# The job
NO_TRAINER = "no_trainer"  # a launcher that has not started its ranks
NO_WORKERS = "no_workers"  # a trainer without DataLoader workers (yet)
NOT_PYTHON = "not_python"  # the PID given is not Python and starts none
JOB_EXITED = "job_exited"
TRAINER_EXITED = "trainer_exited"
TRAINER_CRASHED = "trainer_crashed"

# loadertop itself
RULE_FAILED = "rule_failed"  # a rule (or the plan) raised: a bug; its finding cannot be judged


class NoticeBoard:
    """The notices of one tick, each said once."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, int | None], Notice] = {}

    def add(self, notice: Notice | None) -> None:
        if notice is not None:
            self.items.setdefault((notice.id, notice.trainer_pid), notice)

    def all(self) -> list[Notice]:
        return list(self.items.values())


def rule_failed(rule_id: str, pid: int, error: Exception) -> Notice:
    return Notice(RULE_FAILED, f"rule {rule_id} failed on trainer {pid} ({type(error).__name__}: {error}); "
                  "its finding cannot be judged", "this is a bug in loadertop: please report it with a snapshot "
                  "(`loadertop snapshot PID -o report.json`)", pid)


def job_status_notice(pid: int) -> Notice:
    return Notice(JOB_EXITED, f"job {pid} has exited; showing its last data", None, pid)


def describe_exit(code: int | None) -> str:
    if code is None:
        return ""
    signal = code & 0x7F
    if signal:
        try:
            name = signals.Signals(signal).name
        except ValueError:
            name = f"signal {signal}"
        return f"killed by {name}"
    return f"exit status {code >> 8}"


def trainer_exit_notice(pid: int, code: int | None) -> Notice:
    """How the trainer ended, as far as its exit status was caught: a crash is told apart."""
    if code is None:
        return Notice(TRAINER_EXITED, f"trainer {pid} has exited; showing its last data", None, pid)
    if code == 0:
        return Notice(TRAINER_EXITED, f"trainer {pid} has exited normally; showing its last data", None, pid)
    fix = None
    if code & 0x7F == signals.SIGKILL:
        fix = "SIGKILL out of nowhere is usually the kernel's OOM killer: check `dmesg | grep -i oom`"
    elif code & 0x7F == signals.SIGBUS:
        fix = "a Bus error in a DataLoader job is usually a full /dev/shm: raise --shm-size"
    return Notice(TRAINER_CRASHED, f"trainer {pid} died ({describe_exit(code)}); showing its last data", fix, pid)
