"""Each metric described once: its key, header, unit and help text, and for a process's
figures how to read, format, size and align it. The TUI's workers table, the Markdown report's
table, the exported metrics and the help screen all read these, so a column is defined once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

STATE_LETTER = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "zombie": "Z",
                "exited": "X", "idle": "I"}


def read(p: Any, name: str) -> Any:
    """A figure of a process: a ProcessSample, or a process of the JSON report (a dict)."""
    return p.get(name) if isinstance(p, Mapping) else getattr(p, name, None)


def worker_id_text(worker_id: int | None, place: int) -> str:
    """A worker's id as every output shows it: "3", or "?2" (its place among the trainer's
    workers) until py-spy or the hook has read the id. One spelling for the TUI, the reports
    and the exporter's worker_id label, distinct per worker and stable while it lives."""
    return str(worker_id) if worker_id is not None else f"?{place}"


def worker_label(worker_id: int | None, place: int) -> str:
    """"w3", or "w?2" before the id is known."""
    return "w" + worker_id_text(worker_id, place)


def context_switches(p: Any) -> float | None:
    """Voluntary and involuntary context switches per second."""
    voluntary = read(p, "ctx_switches_voluntary_per_s")
    if voluntary is None:
        return None
    return voluntary + (read(p, "ctx_switches_involuntary_per_s") or 0.0)


def _threads(p: Any, now: float | None = None) -> str | None:
    n, busy = read(p, "threads"), read(p, "busy_threads")
    if n is None:
        return None
    return f"{n}({busy})" if busy and busy > 1 else str(n)


def _doing(p: Any, now: float | None = None) -> str:
    return read(p, "doing") or ("" if read(p, "status") == "exited" else "·")


def _age(p: Any, now: float | None = None) -> float | None:
    started = read(p, "started_at")
    return None if now is None or not isinstance(started, (int, float)) else now - started


@dataclass(frozen=True)
class Field:
    key: str  # the report key
    header: str  # the column header
    unit: str
    help: str
    # How a process's figure is read (a ProcessSample or a report's dict; `now` for ages).
    # None: the row's label (main, pin, w0…), given by the table.
    value: Callable[[Any, float | None], Any] | None = None
    format: Callable[[Any], str] = str
    width: int = 0  # characters on screen; 0: the rest of the line
    right: bool = False  # numbers align right

    def figure(self, p: Any, now: float | None = None) -> Any:
        return self.value(p, now) if self.value is not None else None

    def text(self, p: Any, now: float | None = None) -> str:
        v = self.figure(p, now)
        return "n/a" if v is None else self.format(v)


def _attr(name: str) -> Callable[[Any, float | None], Any]:
    def value(p: Any, now: float | None = None) -> Any:
        return read(p, name)

    return value


def _switches(p: Any, now: float | None = None) -> float | None:
    return context_switches(p)


def _state(p: Any, now: float | None = None) -> str:
    return STATE_LETTER.get(read(p, "status"), "?")


WORKER_FIELDS = (
    Field("worker_id", "WORKER", "", "worker_id from the DataLoader (py-spy --locals); main / pin for the trainer",
          width=6),
    Field("pid", "PID", "", "process id", _attr("pid"), width=7),
    Field("cpu_percent", "CPU%", "%", "CPU use in percent of one core (above 100: several threads)",
          _attr("cpu_percent"), "{:.1f}".format, width=6, right=True),
    Field("uss_bytes", "USS", "bytes", "memory only this process holds (smaps; read on a slower cadence)",
          _attr("uss_bytes"), lambda v: human_bytes(v), width=6, right=True),
    Field("rss_bytes", "RSS", "bytes", "resident memory, shared pages included",
          _attr("rss_bytes"), lambda v: human_bytes(v), width=6, right=True),
    Field("threads", "THR", "", "threads; busy ones in parentheses when more than one computes",
          _threads, width=6),
    Field("ctx_switches_per_s", "CSW/s", "1/s", "context switches per second (voluntary + involuntary)",
          _switches, "{:.0f}".format, width=6, right=True),
    Field("status", "STATE", "", "R running, S sleeping, D disk wait, T stopped, Z zombie",
          _state, width=5),
    Field("doing", "DOING", "", "what py-spy last saw it doing: the dataset frame, or waiting",
          _doing),
    Field("age_s", "AGE", "s", "time since the process started", _age, lambda v: human_age(v), width=6, right=True),
)
WORKER_FIELD = {f.key: f for f in WORKER_FIELDS}
# A report's process table: the same columns but the age (its times are dates).
REPORT_COLUMNS = tuple(f.key for f in WORKER_FIELDS if f.key != "age_s")


def row(label: str, p: Any, now: float | None = None, keys: tuple[str, ...] | None = None) -> list[str]:
    """One process's cells, in WORKER_FIELDS' order (or `keys`'), the first being its label."""
    fields = WORKER_FIELDS if keys is None else [WORKER_FIELD[k] for k in keys]
    return [label if f.value is None else f.text(p, now) for f in fields]


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


def human_percent(x: float | None) -> str:
    """A share (0-1) as a whole percentage."""
    return "n/a" if x is None else f"{x:.0%}"


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

# A trainer is known by its node, its job (named the same on every node of it: the ranks of
# one job join across nodes) and its rank; its pid is no label, where a restarted rank would
# start new series, but the value of loadertop_trainer_info's. `train_job`, not `job`:
# Prometheus gives every scraped series its own `job` (the scrape job's name) and renames one
# that comes with it to `exported_job`.
HOST_LABELS = ["node"]
# namespace and pod: a rank in a Kubernetes pod (empty elsewhere, and Prometheus keeps no
# empty label: outside Kubernetes the series are as before).
TRAINER_LABELS = ["node", "train_job", "rank", "local_rank", "world_size", "namespace", "pod"]
# worker_id, not the pid: a pid label would make a new series each time a worker is
# re-created (every epoch without persistent_workers). The pid is in loadertop_process_info.
PROCESS_LABELS = [*TRAINER_LABELS, "worker_id", "role"]
LOADER_LABELS = [*TRAINER_LABELS, "loader"]  # a tuned loader, by its watched name (else its dataset class)
FINDING_LABELS = [*TRAINER_LABELS, "id", "severity"]


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    scope: Literal["host", "trainer", "process", "loader", "rank"]
    value: Callable[[Any], Any]  # of the HostSnapshot / TrainerSnapshot / ProcessSample / TuneState

    @property
    def labels(self) -> list[str]:
        return {"host": HOST_LABELS, "trainer": TRAINER_LABELS, "process": PROCESS_LABELS,
                "loader": LOADER_LABELS, "rank": TRAINER_LABELS}[self.scope]


@dataclass(frozen=True)
class Series:
    """A metric the exporter builds itself (a state, a count of decisions, its own health)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


def _help(key: str) -> str:
    return next(f.help for f in (*WORKER_FIELDS, *TRAINER_FIELDS) if f.key == key)


def _process_metric(name: str, key: str) -> Metric:
    """A process's figure as the workers table shows it, exported under `name`."""
    field = WORKER_FIELD[key]
    return Metric(name, field.help, "process", field.figure)


def _shm(attr):
    return lambda t: getattr(t.shm, attr) if t.shm is not None else None


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
    _process_metric("loadertop_cpu_percent", "cpu_percent"),
    _process_metric("loadertop_uss_bytes", "uss_bytes"),
    _process_metric("loadertop_rss_bytes", "rss_bytes"),
    Metric("loadertop_pss_bytes", "proportional set size: shared pages divided among sharers", "process",
           lambda p: p.pss_bytes),
    Metric("loadertop_threads", "threads of the process", "process", lambda p: p.threads),
    _process_metric("loadertop_context_switches_per_second", "ctx_switches_per_s"),
    # A rank's figures over its data wait's window (rules/ranks.py): what the ranks of a job are
    # compared by, on one node and across nodes (`loadertop fleet`).
    Metric("loadertop_sync_frames_ratio", "share of the training loop in backward() and device syncs, from py-spy "
           "(gradient sync and compute alike: compare across the ranks of a job)", "rank", lambda r: r.sync_frames),
    Metric("loadertop_sync_blocked_ratio", "share of the training loop blocked outside next(), neither on a CPU nor "
           "queued for one (/proc; compare across the ranks of a job)", "rank", lambda r: r.sync_blocked),
    Metric("loadertop_sync_frames_stderr_ratio", "standard error of loadertop_sync_frames_ratio (py-spy's "
           "sampling error): a gap between two ranks within twice it is noise", "rank", lambda r: r.frames_error),
    Metric("loadertop_sync_blocked_stderr_ratio", "standard error of loadertop_sync_blocked_ratio (its spread "
           "from tick to tick): a gap between two ranks within twice it is noise", "rank", lambda r: r.blocked_error),
    Metric("loadertop_wait_for_ranks_ratio", "share of the training loop this rank waits for the other ranks of "
           "its job seen on this node (its sync above the lowest rank's)", "rank", lambda r: r.wait_for_ranks),
    Metric("loadertop_steps_per_second", "batches the training loop takes per second (the hook)", "trainer",
           lambda t: t.data_wait.steps_per_s if t.data_wait else None),
    Metric("loadertop_host_cpu_percent", _help("host_cpu_percent"), "host", lambda h: h.cpu_percent),
    Metric("loadertop_host_dataloader_workers", "DataLoader workers of every trainer on the host", "host",
           lambda h: h.dataloader_workers),
)
# A tuned loader's in-place tuner (watch(loader, tune=True)), labelled by the loader's dataset class.
TUNE_EXPORTED = (
    Metric("loadertop_tune_num_workers", "num_workers the in-place tuner runs the loader on now (a trial while "
           "trying)", "loader", lambda tune: tune.setting.num_workers if tune.setting else None),
    Metric("loadertop_tune_prefetch_factor", "prefetch_factor the in-place tuner runs the loader on now", "loader",
           lambda tune: tune.setting.prefetch_factor if tune.setting else None),
    Metric("loadertop_tune_steps_per_second", "steps per second the in-place tuner measured over its latest "
           "stretch", "loader", lambda tune: tune.steps_per_s),
    Metric("loadertop_tune_cost_seconds", "time the in-place tuner took inside the training loop so far", "loader",
           lambda tune: tune.cost_s),
)
TUNE_STATE = Series("loadertop_tune_state", "1 for the in-place tuner's state: warm-up, measuring, trying, "
                    "settled or off", (*LOADER_LABELS, "state"))
TUNE_DECISIONS = Series("loadertop_tune_decisions", "decisions the in-place tuner made, by action (try, keep, "
                        "revert, settle, off)", (*LOADER_LABELS, "action"))
FINDING_METRIC = Series("loadertop_finding", "1 for each active finding, by id and severity",
                        tuple(FINDING_LABELS))
VERDICT_METRIC = Series("loadertop_verdict", "1 for the verdict the node judged for each trainer (the live view's "
                        "header): its words, and 1 in provisional for a first look", (*TRAINER_LABELS, "verdict",
                                                                                     "provisional"))
STRAGGLER_METRIC = Series("loadertop_straggler", "1 for the rank its job waits for, as the node judged the ranks it "
                          "sees, by cause (input or step)", (*TRAINER_LABELS, "cause"))
TRAINER_INFO = Series("loadertop_trainer_info", "1 for each trainer: its pid and its job's local pid",
                      (*TRAINER_LABELS, "pid", "job_pid"))
PROCESS_INFO = Series("loadertop_process_info", "1 for each watched process: its pid, by worker_id and role",
                      (*PROCESS_LABELS, "pid"))
LAST_SAMPLE = Series("loadertop_last_sample_timestamp_seconds",
                     "when the exporter last sampled (epoch seconds): older than a few intervals means sampling "
                     "stopped")
SAMPLE_ERRORS = Series("loadertop_sample_errors_total", "ticks that failed (the exporter keeps sampling)")


def metrics_table() -> str:
    """The exporter's metrics as the Markdown table of docs/PROMETHEUS.md (a test checks that
    the document holds exactly this)."""
    rows = ["| metric | labels | meaning |", "|---|---|---|"]
    described: list[tuple[str, list[str] | tuple[str, ...], str]] = [
        *((m.name, m.labels, m.help) for m in (*EXPORTED, *TUNE_EXPORTED)),
        *((s.name, s.labels, s.help) for s in (FINDING_METRIC, VERDICT_METRIC, STRAGGLER_METRIC, TUNE_STATE,
                                               TUNE_DECISIONS, TRAINER_INFO, PROCESS_INFO, LAST_SAMPLE, SAMPLE_ERRORS)),
    ]
    for name, labels, help_text in described:
        shown = ", ".join(f"`{label}`" for label in labels) or "none"
        rows.append(f"| `{name}` | {shown} | {help_text.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
