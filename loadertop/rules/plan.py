"""One plan per trainer: the root cause of its data wait, the setting to use (num_workers,
prefetch_factor, thread limits), its predicted effect on steps/s, and the limit that capped
it. Every finding that proposes a change takes it from here, so no two findings disagree.

The choice is `loadertop tune`'s, on predicted instead of measured rates: among the settings
that fit the trainer's CPUs, memory and /dev/shm, the cheapest whose predicted rate is within
TOLERANCE of the best. Pure: Measured in, Plan out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..text import count
from ..vocabulary import Cause, Change, PlanPart, SettingValue
from . import evidence as E
from . import thresholds as T
from .loops import loader_call, loader_change
from .measure import Judged, LoaderWindow, Measured
from .share import Trade, one_more_worker
from .throughput import Prediction, Setting, Terms, predict, terms

# Root causes, most fundamental first: the verdict names the first that holds.
STALLED: Cause = "stalled"  # a hang: workers stopped or idle while the loop waits
DISPATCHED: Cause = "dispatched"  # the loop waits for another rank to send its batch (Accelerate)
THREADS: Cause = "threads"  # the workers' thread pools oversubscribe the CPUs
MAIN_THREADS: Cause = "main_threads"  # the training loop's own threads take the CPUs its workers need
QUOTA: Cause = "quota"  # the trainer's CPU quota runs out
BUSY_HOST: Cause = "busy_host"  # other processes take the trainer's CPUs
TOO_MANY_WORKERS: Cause = "too_many_workers"  # its own workers ask for more CPUs than it has
LOADER_CPU: Cause = "loader_cpu"  # input-bound: the workers compute
LOADER_IO: Cause = "loader_io"  # input-bound: the workers wait on I/O
LOADER: Cause = "loader"  # input-bound: the workers do both
MAIN_LOADING: Cause = "main_loading"  # the main process loads (num_workers=0, collate, unpickling)
RECEIVING: Cause = "receiving"  # the workers are ahead; the loop waits receiving their batches
NONE: Cause = "none"
UNKNOWN: Cause = "unknown"  # no data wait measured

CAUSE_ORDER: tuple[Cause, ...] = (STALLED, DISPATCHED, THREADS, MAIN_THREADS, QUOTA, BUSY_HOST, TOO_MANY_WORKERS,
                                  LOADER_CPU, LOADER_IO, LOADER, MAIN_LOADING, RECEIVING, NONE, UNKNOWN)
INPUT_BOUND: tuple[Cause, ...] = (LOADER_CPU, LOADER_IO, LOADER)
OVERSUBSCRIBED: tuple[Cause, ...] = (THREADS, MAIN_THREADS, QUOTA, BUSY_HOST, TOO_MANY_WORKERS)

# What bounds the CPUs (measure.CpuBudget.limit), in the user's words.
CPU_LIMITS = {
    "cpus": "its {cpu_set}",
    "quota": "its {cpus:g}-CPU quota",
    "shared": "its share ({cpus:.1f}) of CPUs it shares with {shared}",
    "busy_host": "the {cpus:.1f} CPUs other processes leave it",
}


@dataclass(frozen=True)
class Candidate:
    """A setting the plan weighed: its predicted steps/s over now's, and why it is where it is
    in the ranking (the first is the plan's choice)."""

    setting: Setting
    gain: float
    why: str


@dataclass(frozen=True)
class Plan:
    cause: Cause
    loader: str | None  # the dataset class of the loader the change is for
    now: Setting
    chosen: Setting
    gain: float | None  # predicted change in steps/s (0.5: +50 %)
    wait_now: float | None
    wait_after: float | None  # predicted data wait with the chosen setting
    limit: str | None  # what capped the chosen setting: a CPU limit, main_process, shm, memory, max_workers
    thread_change: Change | None  # {"env": {...}} or {"DataLoader": {"worker_init_fn": ...}}
    shm_size: str | None = None  # a --shm-size the trainer needs: its /dev/shm is nearly full
    shm_for_more: str | None = None  # a --shm-size that would let a faster setting fit
    bigger_budget: tuple[float, float] | None = None  # (CPUs, predicted gain) if the quota/host allowed more
    evidence: dict = field(default_factory=dict, hash=False)
    iterable: bool | None = None
    cpus_text: str = ""
    loop: str | None = None  # the framework whose loop runs the loader: the change in its terms
    tuned: str | None = None  # the loader's in-place tuner's state, where it runs one
    # The worker count the model chose that the settled tuner measured no faster in place:
    # its measurement of this job wins over the model's prediction.
    tune_measured: int | None = None
    # The tuner's trial of this plan's worker change (or, where the plan changes no count, the
    # trial it kept): what it measured on this job, shown beside the model's prediction.
    measured: Judged | None = None
    # The tuner's latest trial on this job whose measured gain was far from the model's: the
    # plan's prediction of another change is said beside it, as one this job has shown off.
    missed: Judged | None = None
    # The settings the model weighed, ranked: the choice first, then the others by predicted
    # steps/s, each with why it was not chosen ("why not 8 workers?" answered from the plan).
    candidates: tuple[Candidate, ...] = ()
    # On a busy host: what one more worker takes, and from whom (rules/share.py), said as is.
    trade: str = ""
    worker_flag: str | None = None  # the command-line flag that set the worker count: the change in its words

    @property
    def changes_workers(self) -> bool:
        return (self.chosen.num_workers, self.chosen.prefetch_factor) != (self.now.num_workers,
                                                                          self.now.prefetch_factor)

    def change(self, *parts: PlanPart) -> Change | None:
        """The slice of this plan's change that a finding carries: "workers" (num_workers,
        prefetch_factor), "threads", "shm"."""
        out: Change = {}
        if "workers" in parts and self.changes_workers:
            loader: dict[str, SettingValue] = {}
            if self.chosen.num_workers != self.now.num_workers:
                loader["num_workers"] = self.chosen.num_workers
                if self.now.num_workers == 0:
                    loader["persistent_workers"] = True
            if self.chosen.prefetch_factor != self.now.prefetch_factor and self.chosen.num_workers > 0:
                loader["prefetch_factor"] = self.chosen.prefetch_factor
            out.update(loader_change(self.loop, loader))
            if self.loader:
                out["dataset"] = self.loader
        if "threads" in parts and self.thread_change:
            # The thread limit goes beside the worker settings: its env, or its DataLoader argument.
            if "env" in self.thread_change:
                out["env"] = {**out.get("env", {}), **self.thread_change["env"]}
            if "script" in self.thread_change:
                out["script"] = self.thread_change["script"]
            if "DataLoader" in self.thread_change:
                out["DataLoader"] = {**out.get("DataLoader", {}), **self.thread_change["DataLoader"]}
        if "shm" in parts and self.shm_size:
            out["docker"] = {"shm_size": self.shm_size}
        return out or None

    def effect(self) -> str:
        """'~+80% steps/s, data wait ~75% -> ~10%'; or what a cheaper setting saves."""
        if self.gain is None:
            return ""
        fewer = self.now.num_workers - self.chosen.num_workers
        if abs(self.gain) < T.MIN_GAIN and fewer > 0:
            return f"about the same steps/s with {fewer} fewer worker{'s' if fewer > 1 else ''} to feed and switch"
        text = f"~{self.gain:+.0%} steps/s"
        if self.wait_now is not None and self.wait_after is not None:
            text += f", data wait ~{self.wait_now:.0%} -> ~{self.wait_after:.0%}"
        return text

    def sentence(self, parts: tuple[str, ...] = ("workers", "threads", "shm")) -> str:
        """The change of `parts` in one line, with the plan's predicted effect and what
        capped it; the plan's other parts are named as going with it."""
        mine = self._texts(parts)
        if not mine:
            return ""
        others = [t for t in self._texts(("workers", "threads", "shm")) if t not in mine]
        text = " and ".join(mine)
        if others:
            text += f" (with {' and '.join(others)})"
        if self.gain is not None:
            text += f": {self.effect()}"
        if self.measured is not None and self.measures_this_change:
            text += f"; {self.measured.text()}"
        elif self.missed is not None and self.gain is not None:
            text += f"; the model was off on this job: {self.missed.text()}"
        cap = self.cap_text()
        return text + (f"; {cap}" if cap else "")

    def _texts(self, parts: tuple[str, ...]) -> list[str]:
        out = []
        if "workers" in parts and self.changes_workers:
            args = []
            if self.chosen.num_workers != self.now.num_workers:
                args.append(f"num_workers={self.now.num_workers} -> {self.chosen.num_workers}")
                if self.now.num_workers == 0:
                    args.append("persistent_workers=True")
            if self.chosen.prefetch_factor != self.now.prefetch_factor and self.chosen.num_workers > 0:
                args.append(f"prefetch_factor={self.now.prefetch_factor} -> {self.chosen.prefetch_factor}")
            out.append(loader_call(self.loop, args, self.loader, self.worker_flag))
        if "threads" in parts and self.thread_change:
            out.append(describe_threads(self.thread_change))
        if "shm" in parts and self.shm_size:
            out.append(f"--shm-size={self.shm_size}")
        return out

    @property
    def measures_this_change(self) -> bool:
        """The tuner's measurement is of the very worker change this plan proposes."""
        m = self.measured
        return m is not None and (m.old, m.new) == (self.now.num_workers, self.chosen.num_workers)

    def tune_text(self) -> str:
        """What the in-place tuner does with this plan's worker change: it measures it where
        the loader runs one, and would apply it without a restart where it could."""
        if self.measured is not None and self.measured.kept and not self.changes_workers:
            return f"{self.measured.text()}, and keeps it"
        if self.tune_measured is not None:
            return (f"tune=True measured num_workers={self.tune_measured} no faster in place and keeps "
                    f"num_workers={self.now.num_workers}")
        if not self.changes_workers or self.iterable or self.cause == DISPATCHED:
            return ""
        if self.tuned in ("warm-up", "measuring", "trying"):
            return "the loader's tune=True is measuring its settings"
        if self.tuned is not None:
            return ""
        callback = self.loop in ("lightning", "huggingface")
        form = "LoadertopCallback(tune=True)" if callback else "loadertop.watch(loader, tune=True)"
        return f"{form} would apply this without a restart"

    def cap_text(self) -> str:
        if self.limit in CPU_LIMITS:
            return f"capped by {self.cpus_text}"
        more = f" (--shm-size={self.shm_for_more} allows more)" if self.shm_for_more else ""
        return {
            "main_process": "more would not help: the loop itself is then the bottleneck",
            "shm": f"capped by /dev/shm: batches in flight must fit{more}",
            "memory": "capped by memory: each worker's private memory must fit",
            "max_workers": "capped at the most workers loadertop proposes at once",
        }.get(self.limit or "", "")

    def as_dict(self) -> dict:
        """The report's `plan` of a trainer."""
        return {
            "cause": self.cause,
            "loader": self.loader,
            "setting": _setting_dict(self.chosen),
            "current": {"num_workers": self.now.num_workers, "prefetch_factor": self.now.prefetch_factor},
            "change": self.change("workers", "threads", "shm"),
            "predicted_gain": None if self.gain is None else round(self.gain, 4),
            "predicted_data_wait": None if self.wait_after is None else round(self.wait_after, 4),
            "limit": self.limit,
            "with_more_cpus": None if self.bigger_budget is None else
            {"cpus": self.bigger_budget[0], "predicted_gain": round(self.bigger_budget[1], 4)},
            "evidence": self.evidence,
            # The command-line flag that set the worker count: the change is said in its words.
            "worker_flag": self.worker_flag,
            # What the loader's tuner measured of a worker change on this job, beside the model.
            "measured": None if self.measured is None else {
                **self.measured.as_dict(), "kept": self.measured.kept, "of_this_change": self.measures_this_change},
            "candidates": [{**_setting_dict(c.setting), "predicted_gain": round(c.gain, 4), "why": c.why}
                           for c in self.candidates],
            "missed": None if self.missed is None else self.missed.as_dict(),
        }


def _judged(lw: LoaderWindow | None, now: Setting, chosen: Setting) -> Judged | None:
    """The tuner's latest judged trial of the change from now to chosen; where the plan keeps
    the count, its latest kept trial that led here."""
    if lw is None or not lw.tune_judged:
        return None
    same = [j for j in lw.tune_judged if (j.old, j.new) == (now.num_workers, chosen.num_workers)]
    if same:
        return same[-1]
    if chosen.num_workers == now.num_workers:
        kept = [j for j in lw.tune_judged if j.kept and j.new == now.num_workers]
        return kept[-1] if kept else None
    return None


REFUSED = {"shm": "left out: its batches in flight would not fit /dev/shm",
           "memory": "left out: its workers' private memory would not fit"}


def _ranked(first: Candidate, current: Prediction, best: Prediction, options: list[Prediction],
            refused: dict[str, list[Prediction]]) -> tuple[Candidate, ...]:
    """The plan's choice first, then every setting it weighed, those left out too, by predicted
    steps/s: at most MAX_CANDIDATES."""
    top = max(best.relative(current), 1e-9)
    weighed = [(p, None) for p in options] + [(p, why) for why, left in refused.items() for p in left]
    out = [first]
    for p, left_out in sorted(weighed, key=lambda pw: pw[0].relative(current), reverse=True):
        if p.setting == first.setting:
            continue
        if left_out is not None:
            why = REFUSED.get(left_out, f"left out: {left_out}")
        elif p.relative(current) >= (1 - T.TOLERANCE) * top:
            why = "within 5% of the best predicted, at a higher cost (workers, threads, prefetch)"
        else:
            why = f"predicted {1 - p.relative(current) / top:.0%} below the best"
        out.append(Candidate(p.setting, p.gain_over(current), why))
    return tuple(out[: T.MAX_CANDIDATES])


def _setting_dict(s: Setting) -> dict:
    return {"num_workers": s.num_workers, "prefetch_factor": s.prefetch_factor,
            "threads_per_worker": s.threads_per_worker or None, "main_threads": s.main_threads or None}


def _missed(lw: LoaderWindow | None) -> Judged | None:
    """The latest judged trial whose steps/s came out a factor MISSED_BY or more from the model's
    prediction (issue 45: +31 % predicted, 9.2x measured)."""
    if lw is None:
        return None
    for j in reversed(lw.tune_judged):
        if j.predicted is not None:
            ratio = (1 + j.measured) / max(0.01, 1 + j.predicted)
            return j if ratio >= T.MISSED_BY or ratio <= 1 / T.MISSED_BY else None
    return None


def describe_threads(change: Change) -> str:
    env = change.get("env")
    if env:
        return " ".join(f"{k}={v}" for k, v in env.items())
    script = change.get("script")
    if script:
        return str(script)
    init = (change.get("DataLoader") or {}).get("worker_init_fn")
    return f"DataLoader(worker_init_fn={init})" if init else ""


# --- deciding --------------------------------------------------------------------------------


def _cause(m: Measured, t: Terms | None, hung: bool) -> Cause:
    lw = m.loader
    if hung or (lw is not None and lw.stopped):
        return STALLED
    dispatched = m.wait_dispatched or 0.0
    if m.wait is not None and m.wait >= T.DATA_WAIT_WARNING and dispatched >= T.DISPATCHED_SHARE * m.wait:
        return DISPATCHED  # its own loader is not what it waits on: no setting here helps
    if lw is not None and _pools_oversubscribe(m):
        return THREADS
    if t is not None and main_threads_take_cpus(m) and _fewer_main_threads_gain(m, t):
        return MAIN_THREADS
    budget = m.budget
    # Periods that ran out of quota say the quota binds, whatever else takes the CPUs.
    if budget.quota is not None and (budget.throttled or 0.0) >= T.THROTTLED_SHARE:
        return QUOTA
    if lw is not None and _starved(m):
        # Its workers queue for a CPU. Its own workers and loop take them only where they use
        # most of them: 1 worker at 27 % beside a loop at 0.5 % on 2 CPUs was told "the workers
        # and the loop keep the trainer's CPUs busy".
        own = budget.used is None or budget.used >= T.OWN_LOAD_SHARE * budget.cpus
        if budget.limit == "busy_host" or (budget.limit == "cpus" and not own):
            return BUSY_HOST
        return TOO_MANY_WORKERS if budget.limit != "quota" else QUOTA
    if t is None:
        return UNKNOWN
    if m.wait is not None and m.wait < T.DATA_WAIT_WARNING:
        return NONE
    if t.n == 0 or (m.wait_main or 0.0) > (m.wait_workers or 0.0):
        return MAIN_LOADING if t.n == 0 or not (lw and lw.ahead) else RECEIVING
    if lw is not None and lw.ahead:
        return RECEIVING
    if t.loader_bound and lw is not None:
        busy = lw.demand / max(1.0, lw.busy_threads or 1.0)
        if busy >= T.WORKER_CPU_BOUND / 100.0:
            return LOADER_CPU
        # I/O only where the workers are mostly not runnable: a worker seen in state R that gets
        # little CPU is short of CPU (its run-queue wait unread), not waiting on a disk.
        if busy < T.WORKER_IO_BOUND / 100.0 and lw.runqueue is not None and lw.running < T.IO_RUNNING_SHARE:
            return LOADER_IO
        return LOADER
    return NONE


def _pools_oversubscribe(m: Measured) -> bool:
    """The workers run thread pools and their busy threads outnumber the trainer's CPUs."""
    lw = m.loader
    if lw is None or lw.busy_threads is None or lw.busy_threads < T.WORKER_BUSY_THREADS:
        return False
    return lw.num_workers * lw.busy_threads + m.main_demand > m.budget.cpus + T.POOL_SLACK_CPUS


def main_threads_take_cpus(m: Measured) -> bool:
    """The training loop runs a pool of busy threads (torch's intra-op, OpenMP, MKL) that,
    with its workers' threads, outnumber its CPUs, and that costs the loop: it waits for data
    (its workers short of CPU) or its own threads queue for one. torch starts one intra-op
    thread per CPU; between small ops they spin, taking CPUs the workers need."""
    busy = m.main_busy_threads
    if busy < T.WORKER_BUSY_THREADS:
        return False
    lw = m.loader
    workers = lw.num_workers * max(1.0, lw.busy_threads or 1.0) if lw is not None and lw.num_workers else 0.0
    if busy + workers <= m.budget.cpus + T.POOL_SLACK_CPUS:
        return False
    waits = (m.wait or 0.0) >= T.DATA_WAIT_WARNING
    queued = m.main_runqueue / busy >= T.MAIN_QUEUED_SHARE
    return waits or queued


def _fewer_main_threads_gain(m: Measured, t: Terms) -> bool:
    """The model predicts the limit faster (a step that truly computes in parallel is not)."""
    lw = m.loader
    now = Setting(m.num_workers, 0, lw.prefetch_factor if lw else T.DEFAULT_PREFETCH)
    limited = Setting(now.num_workers, 0, now.prefetch_factor, main_threads_limit(m))
    return predict(t, limited).gain_over(predict(t, now)) >= T.MIN_GAIN


def main_threads_limit(m: Measured) -> int:
    """The loop's threads that leave its workers their CPUs: what is left of the CPUs after
    the workers' demand, at least one, fewer than it runs now."""
    lw = m.loader
    demand = lw.demand * lw.num_workers if lw is not None and lw.num_workers else 0.0
    left = int(m.budget.cpus - demand + 0.5)
    return max(1, min(left, int(m.main_busy_threads) - 1))


def _main_limit(m: Measured, n: int) -> Change:
    """Where the loop's threads are set: at launch (OMP_NUM_THREADS, MKL_NUM_THREADS: torch
    reads them at start), unless the environment already sets fewer and the script raises it
    (then torch.set_num_threads in the script)."""
    omp = m.env.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) <= n:
        return {"script": f"torch.set_num_threads({n})"}
    return {"env": {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}}


def _starved(m: Measured) -> bool:
    """The workers wait for a CPU a real share of the time while the CPUs are taken: more
    workers would only wait longer."""
    lw = m.loader
    if lw is None or lw.runqueue is None:
        return False
    threads = max(1.0, lw.busy_threads or 1.0)
    return lw.runqueue / threads >= T.STARVED_RUNQUEUE_SHARE


def _env_limit(m: Measured) -> Change:
    """How to give each worker one thread: the environment where nothing set it yet and the
    main process does not compute on several threads itself; else a worker_init_fn, which
    also reaches pools that ignore OMP_NUM_THREADS (OpenCV, code that sets its own)."""
    omp = m.env.get("OMP_NUM_THREADS")
    pools = m.loader.thread_pools if m.loader else ()
    unset = omp in (None, "") or (omp.isdigit() and int(omp) > 1)
    if unset and m.main_busy_threads < T.WORKER_BUSY_THREADS:
        return {"env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    calls = ["torch.set_num_threads(1)"]
    if "OpenCV" in pools:
        calls.append("cv2.setNumThreads(0)")
    if "OpenBLAS" in pools or "MKL" in pools:
        calls.append("threadpoolctl.threadpool_limits(1)")
    body = calls[0] if len(calls) == 1 else f"({', '.join(calls)})"
    return {"DataLoader": {"worker_init_fn": f"lambda _: {body}"}}


def batch_bytes(m: Measured) -> float | None:
    lw = m.loader
    if lw is None or lw.num_workers == 0:
        return None
    if lw.batch_bytes:
        return float(lw.batch_bytes)
    held = batches_held(lw.num_workers, lw.prefetch_factor)
    if m.shm_torch:
        # The queue is full only when the loop keeps up; a starved loop holds fewer batches,
        # so the largest segment (a batch's largest tensor) is the floor.
        return max(m.shm_torch / held, float(m.shm_torch_largest or 0))
    if m.shm_peak and m.shm_total and m.shm_peak >= T.SHM_MOSTLY_IN_FLIGHT * m.shm_total:
        return m.shm_peak / held  # most of it is in flight: an upper bound
    return None


def batches_held(num_workers: int, prefetch_factor: int) -> int:
    """Batches in /dev/shm at once, at worst: each worker's prefetch_factor in flight, the one
    the loop trains on, and the next it receives while it still holds that one (`for batch in
    loader` replaces the old batch only once next() has returned the new one)."""
    return num_workers * prefetch_factor + 2


def fits(m: Measured, s: Setting, batch: float | None) -> str | None:
    """None when the setting fits the trainer's memory and /dev/shm, else which it overflows."""
    lw = m.loader
    extra = s.num_workers - (lw.num_workers if lw else 0)
    if (extra > 0 and lw is not None and lw.uss_bytes and m.memory_available is not None
            and extra * lw.uss_bytes > T.MEMORY_LIMIT * m.memory_available):
        return "memory"
    if batch and m.shm_total:
        others = _shm_others(m, batch)
        if batch * batches_held(s.num_workers, s.prefetch_factor) > T.SHM_LIMIT * m.shm_total - others:
            return "shm"
    return None


def _shm_others(m: Measured, batch: float) -> float:
    """Bytes of /dev/shm that are not the loader's batches: what is used beyond the batches
    the setting now holds. Not used minus the mapped segments: a batch on its way through the
    queue is an fd in a socket, in /dev/shm but mapped by no process."""
    lw = m.loader
    if m.shm_used is None or lw is None:
        return max(0.0, (m.shm_peak or 0) - (m.shm_torch or 0))
    return max(0.0, m.shm_used - batch * batches_held(lw.num_workers, lw.prefetch_factor))


def _shm_wanted(m: Measured, t: Terms, now: Setting, cause: str, chosen: Prediction, current: Prediction,
                batch: float | None, refused: bool) -> str | None:
    """A --shm-size for a /dev/shm that is nearly full now, or that refused a faster setting:
    room for the fastest setting's batches in flight, and at least twice the peak seen."""
    pressure = bool(m.shm_total and m.shm_peak and m.shm_peak >= T.SHM_WARNING * m.shm_total)
    if not pressure and not (refused and batch):
        return None
    need = 2.0 * (m.shm_peak or 0)
    if batch:
        wanted = max((predict(t, s) for s in _candidates(m, t, now, cause)), key=lambda p: p.relative(current))
        faster = wanted.relative(current) > chosen.relative(current) * (1 + T.MIN_GAIN)
        if not pressure and not faster:
            return None
        settings = [wanted.setting] if faster else [chosen.setting, now]
        target = max(settings, key=lambda s: s.num_workers * s.prefetch_factor)
        others = _shm_others(m, batch)
        need = max(need, (batch * batches_held(target.num_workers, target.prefetch_factor) + others) / T.SHM_LIMIT)
    return size_flag(need)


def size_flag(nbytes: float) -> str:
    """A Docker --shm-size value at least nbytes: whole GiB, or a multiple of 64 MiB."""
    gib = 2**30
    if nbytes >= gib:
        return f"{math.ceil(nbytes / gib)}g"
    return f"{max(64, 64 * math.ceil(nbytes / 2**20 / 64))}m"


def most_workers(m: Measured, now: Setting, cause: str) -> int:
    """The most workers a plan may propose: as many as the CPUs run, and past the cores for
    loaders that wait on I/O (IO_WORKERS_PER_CPU each); never more than now for workers
    starved of CPU or throttled. /dev/shm and memory are `fits`'s."""
    if cause in OVERSUBSCRIBED or _starved(m):
        return now.num_workers
    return workers_the_cpus_run(m, now)


def workers_the_cpus_run(m: Measured, now: Setting) -> int:
    """As many workers as the CPUs run, and past the cores for loaders that wait on I/O."""
    return max(now.num_workers, min(T.MAX_WORKERS, math.ceil(T.IO_WORKERS_PER_CPU * max(1.0, m.budget.cpus))))


def workers_queue_for_their_own_cpus(m: Measured, cause: str) -> bool:
    """The workers queue for the CPUs, and what takes them is the job's own workers: no quota,
    no other process, no thread pool (the cause names those)."""
    return cause == TOO_MANY_WORKERS or (cause not in OVERSUBSCRIBED and _starved(m))


def _candidates(m: Measured, t: Terms, now: Setting, cause: str) -> list[Setting]:
    threads = [0]
    if cause == THREADS:
        threads = [1]
    mains = [0, main_threads_limit(m)] if cause == MAIN_THREADS else [0]
    # Bounded whatever the job claims (a hook can say 4,096 workers and a prefetch of 65,536):
    # counts up to MAX_WORKERS and the one now, a few shallower prefetch depths.
    top = min(most_workers(m, now, cause), T.MAX_WORKERS)
    workers = sorted({*range(0 if now.num_workers == 0 else 1, top + 1), now.num_workers})
    prefetch = sorted({now.prefetch_factor, *(p for p in T.PREFETCH_CANDIDATES if p < now.prefetch_factor)})
    return [Setting(n, k, p if n else now.prefetch_factor, main) for n in workers for k in threads for p in prefetch
            for main in mains]


def make_plan(m: Measured, hung: bool = False) -> Plan:
    lw = m.loader
    now = Setting(m.num_workers, 0, lw.prefetch_factor if lw else T.DEFAULT_PREFETCH)
    t = terms(m)
    cause = _cause(m, t, hung)
    budget = m.budget
    cpus_text = CPU_LIMITS.get(budget.limit, "its CPUs").format(
        cpus=round(budget.cpus, 1), cpu_set=count(budget.cpu_set, "CPU"),
        shared=count(budget.shared_with, "other DataLoader job"))
    evidence: E.Plan = {"cause": cause, "cpus": round(budget.cpus, 2), "cpu_limit": budget.limit,
                "cpu_set": budget.cpu_set, "cpu_quota": budget.quota,
                "other_processes_cpus": round(budget.others_busy, 2),
                "trainer_cpus_used": None if budget.used is None else round(budget.used, 2),
                "throttled_fraction": budget.throttled}
    thread_change = _env_limit(m) if cause == THREADS else None
    base: dict[str, Any] = dict(cause=cause, loader=lw.dataset_class if lw else None, now=now, wait_now=m.wait,
                thread_change=thread_change, evidence=evidence, iterable=m.iterable, cpus_text=cpus_text,
                loop=m.loop, tuned=lw.tune if lw else None, worker_flag=m.worker_flag)
    if cause in (STALLED, DISPATCHED, UNKNOWN) or t is None:
        pressure = bool(m.shm_total and m.shm_peak and m.shm_peak >= T.SHM_WARNING * m.shm_total)
        return Plan(chosen=_without_data_wait(m, now, cause), gain=None, wait_after=None, limit=None,
                    shm_size=size_flag(2.0 * (m.shm_peak or 0)) if pressure else None,
                    **{**base, "thread_change": thread_change if t is None and cause != STALLED else None})
    batch = batch_bytes(m)
    current = predict(t, now)
    options: list[Prediction] = []
    refused: dict[str, list[Prediction]] = {}
    for s in _candidates(m, t, now, cause):
        why = fits(m, s, batch)
        if why is None:
            options.append(predict(t, s))
        else:
            refused.setdefault(why, []).append(predict(t, s))

    def cost(p: Prediction) -> tuple:
        # Fewer workers, then fewer threads, then prefetch as it is (a change for nothing
        # is a cost), then a shallower one.
        s = p.setting
        return (s.num_workers, s.threads_per_worker or 99, s.main_threads != now.main_threads,
                s.prefetch_factor != now.prefetch_factor, s.prefetch_factor)

    best = max(options or [current], key=lambda p: p.relative(current))
    good = [p for p in options or [current] if p.relative(current) >= (1 - T.TOLERANCE) * best.relative(current)]
    chosen = min(good, key=cost)
    now_fits = fits(m, now, batch) is None
    if chosen.setting != now and chosen.gain_over(current) < T.MIN_GAIN:
        # Not worth a restart for speed; cheaper only for a cost reason, and at no real loss.
        # A quota or its own workers keep the CPUs queued: fewer workers that still fill them
        # cost nothing and switch less. Not on a busy host: there the share would shrink.
        # The cheapest setting at no real loss, not merely the cheapest in the tolerance band
        # (1 worker at -5 % must not hide 2 at no loss).
        reason = cause in (THREADS, TOO_MANY_WORKERS, QUOTA) or not now_fits
        free = [p for p in good if cost(p) < cost(current) and p.gain_over(current) >= -T.MAX_LOSS]
        if reason and free:
            chosen = min(free, key=cost)
        elif now_fits:
            chosen = current
    tune_measured = None
    if (lw is not None and lw.tune == "settled" and chosen.setting.num_workers != now.num_workers
            and chosen.setting.num_workers in lw.tune_measured_slower):
        # The settled tuner tried that count on this job and measured it no faster.
        tune_measured, chosen = chosen.setting.num_workers, current
    base["tune_measured"] = tune_measured
    base["measured"] = _judged(lw, now, chosen.setting)
    base["missed"] = _missed(lw)
    if cause == THREADS and chosen.setting.threads_per_worker != 1:
        chosen = predict(t, Setting(chosen.setting.num_workers, 1, chosen.setting.prefetch_factor))
    if chosen.setting.main_threads:
        thread_change = base["thread_change"] = _main_limit(m, chosen.setting.main_threads)
    # What the model read and what it predicts for each setting it weighed: the figures
    # behind the change, for anyone who wants to check it against a measurement.
    evidence["model"] = _model_evidence(t, current, options)
    limit = _limit(m, t, chosen, current, refused, budget.limit)
    shm_size = _shm_wanted(m, t, now, cause, chosen, current, batch, bool(refused.get("shm")))
    pressure = bool(m.shm_total and m.shm_peak and m.shm_peak >= T.SHM_WARNING * m.shm_total)
    bigger = None
    if budget.limit in ("quota", "busy_host") and cause in (QUOTA, BUSY_HOST, *INPUT_BOUND):
        # Never more CPUs than it may run on (its affinity): a busy 2-CPU host frees 2 at most.
        more = round(min(max(budget.cpus * 2, budget.cpus + 1), float(budget.cpu_set or budget.cpus + 1)), 1)
        more_gain = predict(t, chosen.setting, cpus=more).gain_over(current) if more > budget.cpus + 0.05 else 0.0
        if more_gain >= T.MIN_GAIN:
            bigger = (more, round(more_gain, 2))
    gain: float | None = chosen.gain_over(current)
    if gain is not None and m.wait is not None and not thread_change and not chosen.setting.threads_per_worker:
        # A loader change removes at most the wait: 1/(1-w) - 1 (a rank at 11 % read "+85 %").
        # Only a thread limit (a named cause) speeds the step itself.
        most = m.wait / (1.0 - m.wait) if m.wait < 1.0 else math.inf
        if gain > most:
            gain, evidence["gain_capped_by_data_wait"] = most, True
    wait_after = max(0.0, 1.0 - (1.0 - (m.wait or 0.0)) * (1.0 + gain)) if m.wait is not None and gain is not None \
        else m.wait
    if chosen.setting == now and not thread_change:
        gain = None if cause in INPUT_BOUND or cause == MAIN_LOADING else 0.0
        wait_after = m.wait
    setting, trade = chosen.setting, ""
    if cause == BUSY_HOST and m.wait is not None:
        # Other processes hold the CPUs: a worker more takes a larger share only from those of the
        # job's own scheduling group (its session, its cgroup). Said as the trade it is.
        share = one_more_worker(m)
        one_more = Setting(now.num_workers + 1, 0, now.prefetch_factor)
        if share is not None:
            trade = share.text(_names(m, share))
            if (share.gain >= T.MIN_GAIN and m.wait >= T.DATA_WAIT_WARNING and now.num_workers > 0
                    and fits(m, one_more, batch) is None):
                setting, limit = one_more, None  # not capped by the CPUs others leave: it takes from them
                gain = min(share.gain, m.wait / (1.0 - m.wait))
                wait_after = max(0.0, 1.0 - (1.0 - m.wait) * (1.0 + gain))
                evidence["one_more_worker_cpus"] = round(share.gain, 3)
    if setting == now:
        why = (f"as it is: tune=True measured num_workers={tune_measured} no faster" if tune_measured is not None
               else "as it is: no other setting is predicted enough faster")
    elif setting != chosen.setting:
        why = "the choice: one worker more, its CPU taken from the job's own processes"
    else:
        why = "the choice: the cheapest within 5% of the best predicted"
    base["candidates"] = _ranked(Candidate(setting, gain or 0.0, why), current, best, options, refused)
    return Plan(chosen=setting, gain=gain, wait_after=wait_after, limit=limit,
                shm_size=shm_size if pressure else None, shm_for_more=shm_size, bigger_budget=bigger, trade=trade,
                **base)


def _names(m: Measured, share: Trade) -> str:
    """' (python 4242 0.9 CPU, ...)': the processes of the job's own group it would take from."""
    mine = (m.budget.same_group or ())[:3]
    if not mine or share.same_group <= 0:
        return ""
    return " (" + ", ".join(f"{p.comm} {p.pid} {p.cores:.1f} CPU" for p in mine) + ")"


def _model_evidence(t: Terms, current: Prediction, options: list[Prediction]) -> dict:
    terms = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(t).items()}
    ordered = sorted(options, key=lambda p: p.setting.num_workers)
    if len(ordered) > T.MAX_EVIDENCE_SETTINGS:  # the best ones, in worker order
        kept = sorted(ordered, key=lambda p: p.relative(current), reverse=True)[: T.MAX_EVIDENCE_SETTINGS]
        ordered = sorted(kept, key=lambda p: p.setting.num_workers)
    predicted = {p.setting.label(): round(p.relative(current), 3) for p in ordered}
    return {"terms": terms, "bound_now": current.bound, "relative_steps_per_s": predicted}


def _without_data_wait(m: Measured, now: Setting, cause: str) -> Setting:
    """With no data wait to predict from, only a cost rule: workers that oversubscribe their
    CPUs shrink to what the CPUs run beside the main process (Lightning's `CPUs - 1` rule,
    counting what the main process really uses)."""
    if cause not in (THREADS, TOO_MANY_WORKERS) or now.num_workers == 0:
        return now
    fit = max(1, round(m.budget.cpus - (m.main_cpu if m.main_cpu is not None else 1.0)))
    return Setting(min(now.num_workers, fit), 1 if cause == THREADS else 0, now.prefetch_factor)


def _limit(m: Measured, t: Terms, chosen: Prediction, current: Prediction, refused: dict[str, list[Prediction]],
           cpu_limit: str) -> str | None:
    """What stopped the plan from going further: /dev/shm or memory if they refused a setting
    predicted to be faster, else the bound the chosen setting runs into."""
    for why in ("shm", "memory"):
        if any(p.relative(current) > chosen.relative(current) * (1 + T.MIN_GAIN) for p in refused.get(why, ())):
            return why
    if chosen.bound == "cpus":
        return cpu_limit
    if chosen.bound == "main_process":
        return "main_process"
    top = min(T.MAX_WORKERS, math.ceil(T.IO_WORKERS_PER_CPU * max(1.0, m.budget.cpus)))
    if chosen.setting.num_workers >= top:
        return "max_workers"
    return None
