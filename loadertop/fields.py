"""Each metric described once: its key, the column header, unit and help text. The workers
table, the help screen and the report's documentation read these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    key: str  # the report key
    header: str  # the column header in the TUI
    unit: str
    help: str


WORKER_FIELDS = (
    Field("worker_id", "WORKER", "", "worker_id from the DataLoader (py-spy --locals); main / pin for the trainer"),
    Field("pid", "PID", "", "process id"),
    Field("cpu_percent", "CPU%", "%", "CPU use in percent of one core (above 100: several threads)"),
    Field("uss_bytes", "USS", "bytes", "memory only this process holds (smaps; read on a slower cadence)"),
    Field("rss_bytes", "RSS", "bytes", "resident memory, shared pages included"),
    Field("threads", "THR", "", "threads; busy ones in parentheses when more than one computes"),
    Field("ctx_switches_per_s", "CSW/s", "1/s", "context switches per second (voluntary + involuntary)"),
    Field("status", "STATE", "", "R running, S sleeping, D disk wait, T stopped, Z zombie"),
    Field("doing", "DOING", "", "what py-spy last saw it doing: the dataset frame, or waiting"),
    Field("age_s", "AGE", "s", "time since the process started"),
)

TRAINER_FIELDS = (
    Field("data_wait_fraction", "data wait", "", "share of the training loop spent waiting in next(loader)"),
    Field("gpu_utilization_percent", "GPU", "%", "NVML utilization: share of time any kernel ran"),
    Field("shm_used_bytes", "shm", "bytes", "use of the trainer's own /dev/shm"),
    Field("host_cpu_percent", "host CPU", "%", "CPU use of the whole host"),
)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit in ("B", "K") or abs(n) >= 100 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
