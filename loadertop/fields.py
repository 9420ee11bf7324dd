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


# --- Prometheus metrics: one description each, read by loadertop.export -----------------

HOST_LABELS = ["hostname"]
TRAINER_LABELS = ["hostname", "trainer_pid", "rank"]
# worker_id, not the pid: a pid label would make a new series each time a worker is
# re-created (every epoch without persistent_workers). The pid is in loadertop_process_info.
PROCESS_LABELS = [*TRAINER_LABELS, "worker_id", "role"]


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    scope: str  # host | trainer | process
    value: object  # function of the HostSnapshot / TrainerSnapshot / ProcessSample

    @property
    def labels(self) -> list[str]:
        return {"host": HOST_LABELS, "trainer": TRAINER_LABELS, "process": PROCESS_LABELS,
                "finding": ["hostname", "trainer_pid", "id", "severity"]}[self.scope]


def _help(key: str) -> str:
    return next(f.help for f in (*WORKER_FIELDS, *TRAINER_FIELDS) if f.key == key)


def _shm(attr):
    return lambda t: getattr(t.shm, attr) if t.shm is not None else None


def _csw(p):
    if p.ctx_switches_voluntary_per_s is None:
        return None
    return p.ctx_switches_voluntary_per_s + (p.ctx_switches_involuntary_per_s or 0.0)


EXPORTED = (
    Metric("loadertop_data_wait_ratio", _help("data_wait_fraction") + " (0-1, py-spy)", "trainer",
           lambda t: t.data_wait.fraction if t.data_wait else None),
    Metric("loadertop_workers", "DataLoader worker processes of the trainer", "trainer", lambda t: len(t.workers)),
    Metric("loadertop_worker_respawns_total", "workers started again after others exited (epoch churn)",
           "trainer", lambda t: t.worker_respawns),
    Metric("loadertop_shm_used_bytes", _help("shm_used_bytes"), "trainer", _shm("used_bytes")),
    Metric("loadertop_shm_total_bytes", "size of the trainer's own /dev/shm", "trainer", _shm("total_bytes")),
    Metric("loadertop_trainer_up", "1 while the trainer runs, 0 once it exited", "trainer",
           lambda t: 1.0 if t.status == "running" else 0.0),
    Metric("loadertop_cpu_percent", _help("cpu_percent"), "process", lambda p: p.cpu_percent),
    Metric("loadertop_uss_bytes", _help("uss_bytes"), "process", lambda p: p.uss_bytes),
    Metric("loadertop_rss_bytes", _help("rss_bytes"), "process", lambda p: p.rss_bytes),
    Metric("loadertop_pss_bytes", "proportional set size: shared pages divided among sharers", "process",
           lambda p: p.pss_bytes),
    Metric("loadertop_threads", "threads of the process", "process", lambda p: p.threads),
    Metric("loadertop_context_switches_per_second", _help("ctx_switches_per_s"), "process", _csw),
    Metric("loadertop_host_cpu_percent", _help("host_cpu_percent"), "host", lambda h: h.cpu_percent),
    Metric("loadertop_host_dataloader_workers", "DataLoader workers of every trainer on the host", "host",
           lambda h: h.dataloader_workers),
)
FINDING_METRIC = Metric("loadertop_finding", "1 for each active finding, by id and severity", "finding", None)
PROCESS_INFO = ("loadertop_process_info", "1 for each watched process: its pid, by worker_id and role")
LAST_SAMPLE = ("loadertop_last_sample_timestamp_seconds",
               "when the exporter last sampled (epoch seconds): older than a few intervals means sampling stopped")
SAMPLE_ERRORS = ("loadertop_sample_errors_total", "ticks that failed (the exporter keeps sampling)")
