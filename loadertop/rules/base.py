"""What every rule shares: the view of one trainer over recent history, and the Check a rule
returns for one snapshot. Rules are pure: Context only reads snapshots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import fmean, median

from ..model import WAITING_FOR_INDICES, Finding, Snapshot, TrainerSnapshot
from . import thresholds as T

WARNING, CRITICAL = 1, 2
SEVERITY = {0: "info", WARNING: "warning", CRITICAL: "critical"}


@dataclass(frozen=True)
class Check:
    """A rule's verdict on one snapshot: level None (cannot tell), 0 (fine), 1, 2."""

    level: int | None
    finding: Finding | None = None
    span_s: float = 0.0  # how far back this evidence already reaches (a py-spy window)
    immediate: bool = False  # an event (a death): raise at once, no hold


UNKNOWN = Check(None)
FINE = Check(0)


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


@dataclass
class Context:
    """One trainer at one snapshot, with the recent snapshots before it."""

    snap: Snapshot
    trainer: TrainerSnapshot
    recent: Sequence[Snapshot]  # oldest first, ending with snap

    def timed_history(self, seconds: float) -> list[tuple[float, TrainerSnapshot]]:
        """(epoch time, this trainer) over the last `seconds`, oldest first."""
        cutoff = self.snap.monotonic - seconds
        key = (self.trainer.pid, self.trainer.started_at)
        out = []
        for s in self.recent:
            if s.monotonic < cutoff:
                continue
            for t in s.trainers:
                if (t.pid, t.started_at) == key:
                    out.append((s.time, t))
        return out

    def history(self, seconds: float) -> list[TrainerSnapshot]:
        return [t for _, t in self.timed_history(seconds)]

    def events(self, kind: str) -> list:
        """This trainer's events of one kind in the recent snapshots."""
        pid = self.trainer.pid
        return [e for s in self.recent for e in s.events if e.trainer_pid == pid and e.kind == kind]

    def gpu_utilization(self) -> float | None:
        """Mean utilization of the trainer's GPUs over the window, None without a GPU."""
        if not self.trainer.gpus:
            return None
        cutoff = self.snap.monotonic - 10.0
        return _mean(
            g.utilization_percent
            for s in self.recent
            if s.monotonic >= cutoff
            for g in s.gpus
            if g.index in self.trainer.gpus
        )

    @cached_property
    def window(self) -> list[TrainerSnapshot]:
        """The last 10 s: rates are averaged over it so one tick cannot decide."""
        return self.history(10.0)

    @cached_property
    def worker_cpu(self) -> float | None:
        """Mean CPU % of one worker over the window."""
        return _mean(w.cpu_percent for t in self.window for w in t.workers)

    @cached_property
    def busy_cpus(self) -> float | None:
        """CPUs the trainer (main process and workers) keeps busy, over the window."""
        per_tick = []
        for t in self.window:
            values = [p.cpu_percent for p in (t.main, *t.workers)]
            if all(v is not None for v in values):
                per_tick.append(sum(values) / 100.0)
        return fmean(per_tick) if per_tick else None

    @cached_property
    def loader_ahead(self) -> bool:
        """Every worker is often seen waiting for indices (LOADER_AHEAD_SHARE of its dumps):
        the batches asked of it are done, so the loop's data wait is receiving them, not
        loading them. A starved worker always has prefetch_factor batches queued and never
        waits for indices; batches come in order, so one busy straggler already makes the
        loop wait (hence: every worker)."""
        seen: dict[int, list[bool]] = {}
        for t in self.window:
            for w in t.workers:
                if w.doing:
                    seen.setdefault(w.pid, []).append(w.doing == WAITING_FOR_INDICES)
        return bool(seen) and all(sum(v) >= T.LOADER_AHEAD_SHARE * len(v) for v in seen.values())

    @property
    def num_workers(self) -> int:
        """The configured num_workers where py-spy read it, else the workers seen."""
        configured = [loader.num_workers for loader in self.trainer.loaders if loader.num_workers is not None]
        return max(configured) if configured else len(self.trainer.workers)

    @property
    def persistent_workers(self) -> bool | None:
        values = {loader.persistent_workers for loader in self.trainer.loaders}
        return values.pop() if len(values) == 1 else None

    @cached_property
    def trainers_sharing(self) -> int:
        """Trainers that share this machine's CPUs: the ones watched, or more if the host
        scan saw other loaders."""
        watched = sum(1 for t in self.snap.trainers if t.status == "running")
        others = self.snap.host.dataloader_trainers or 0
        return max(1, watched, others)

    @property
    def usable_cpus(self) -> int:
        return self.trainer.usable_cpus or self.snap.host.usable_cpus or self.snap.host.cpu_count

    @cached_property
    def cpu_share(self) -> int:
        """This trainer's fair share of usable CPUs when several trainers share them."""
        return max(1, self.usable_cpus // self.trainers_sharing)

    @cached_property
    def main_cpus(self) -> float:
        """CPUs the trainer's main process needs once the loop stops waiting for data: what it
        uses now over the share of time it does not wait, capped at one CPU or at what it
        uses now where that is more (it may use CPU while it waits: unpickling, the pin-memory
        thread); one CPU where unknown, as Lightning's `usable CPUs - 1` workers assumes."""
        # The median: the ticks of its start-up (imports, building the loader) are no guide.
        samples = [t.main.cpu_percent for t in self.window if t.main.cpu_percent is not None]
        dw = self.data_wait()
        if not samples or dw is None:
            return 1.0
        used = median(samples) / 100.0
        return min(max(1.0, used), used / max(0.05, 1.0 - dw.fraction))

    @cached_property
    def worker_cpus(self) -> int:
        """CPU-bound workers this trainer's share of CPUs can run beside its main process."""
        return max(1, workers_for(self.cpu_share - self.main_cpus))

    @cached_property
    def idle_cpus(self) -> float | None:
        """Usable CPUs the host leaves idle (host CPU % over the window)."""
        cutoff = self.snap.monotonic - 10.0
        host = _mean(s.host.cpu_percent for s in self.recent if s.monotonic >= cutoff)
        if host is None:
            return None
        return max(0.0, self.snap.host.cpu_count * (1 - host / 100.0)) * self.usable_cpus / max(
            1, self.snap.host.cpu_count
        )

    def data_wait(self):
        dw = self.trainer.data_wait
        return dw if dw is not None and dw.fraction is not None else None


def finding(
    rule_id: str,
    level: int,
    ctx: Context | None,
    title: str,
    evidence: dict,
    suggestion: str,
    change: dict | None = None,
) -> Finding:
    return Finding(
        id=rule_id,
        severity=SEVERITY[level],
        trainer_pid=ctx.trainer.pid if ctx else None,
        title=title,
        evidence={k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items()},
        suggestion=suggestion,
        change=change,
    )


def enough_evidence(dw) -> bool:
    """A hook's figure is exact; a sampled one needs enough py-spy samples."""
    return dw.source == "hook" or dw.samples >= T.MIN_STACK_SAMPLES


def wait_above(dw, value: float, threshold: float) -> bool:
    """value (a share of dw's window) is above threshold: exactly for a hook's figure,
    beyond sampling error for py-spy's."""
    return value >= threshold if dw.source == "hook" else surely_above(value, dw.samples, threshold)


def surely_above(fraction: float, samples: int, threshold: float) -> bool:
    """The sampled fraction exceeds the threshold by more than its sampling error
    (CONFIDENCE_Z standard errors of a binomial share): 8% of 70 samples is not evidence of 5%."""
    error = (max(fraction * (1 - fraction), 0.01 * 0.99) / max(1, samples)) ** 0.5
    return fraction - error * T.CONFIDENCE_Z >= threshold


def workers_for(cpus: float) -> int:
    """CPU-bound workers that `cpus` CPUs can run, counting one that would get at least
    WORKER_MIN_CPU of a CPU."""
    return math.floor(cpus + 1 - T.WORKER_MIN_CPU)


def predicted_wait(wait: float, workers: int, new_workers: int) -> float:
    """Data wait after changing the worker count, if the loader's throughput scales with
    workers and the step's compute stays the same.

    With step time S, compute C = S(1 - wait) and a loader that delivers a batch every S
    (it is the bottleneck), n' workers deliver one every S·n/n': the new wait share is
    max(0, n/n' - (1 - wait)) / max(1 - wait, n/n').
    """
    if workers <= 0 or new_workers <= 0:
        return wait
    batch_time = workers / new_workers
    compute = 1.0 - wait
    return max(0.0, batch_time - compute) / max(compute, batch_time)
