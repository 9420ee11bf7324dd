"""What every rule shares: the view of one trainer over recent history (with what the window
measures and the trainer's one plan), and the Check a rule returns for one snapshot. Rules
are pure: Context only reads snapshots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from ..model import DataWait, Finding, Snapshot, TrainerSnapshot
from ..numbers import mean_of
from ..vocabulary import Change, PlanPart, Severity
from . import thresholds as T
from .measure import Measured, hang_signature, measure
from .plan import Plan, make_plan
from .ranks import Attribution, attributions

WARNING, CRITICAL = 1, 2
SEVERITY: dict[int, Severity] = {0: "info", WARNING: "warning", CRITICAL: "critical"}


@dataclass(frozen=True)
class Check:
    """A rule's verdict on one snapshot: level None (cannot tell), 0 (fine), 1, 2."""

    level: int | None
    finding: Finding | None = None
    span_s: float = 0.0  # how far back this evidence already reaches (a py-spy window)
    immediate: bool = False  # an event (a death): raise at once, no hold


UNKNOWN = Check(None)
FINE = Check(0)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


@dataclass
class Context:
    """One trainer at one snapshot, with the recent snapshots before it, and its snapshot's
    jobs of many ranks compared (once a tick, by the diagnoser; worked out here when not given)."""

    snap: Snapshot
    trainer: TrainerSnapshot
    recent: Sequence[Snapshot]  # oldest first, ending with snap
    compared: Mapping[str, Attribution] | None = None

    @cached_property
    def jobs(self) -> Mapping[str, Attribution]:
        return self.compared if self.compared is not None else attributions(self.snap, self.recent)

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
        cutoff = self.snap.monotonic - self.window_s
        return mean_of(
            g.utilization_percent
            for s in self.recent
            if s.monotonic >= cutoff
            for g in s.gpus
            if g.index in self.trainer.gpus
        )

    @cached_property
    def window_s(self) -> float:
        """The window rates are averaged over: the data wait's own (a py-spy window, the
        hook's rolling one), within WINDOW_MIN_S..WINDOW_MAX_S, so that CPU figures and data
        wait describe the same seconds and one tick cannot decide."""
        dw = self.data_wait()
        span = dw.window_s if dw is not None else T.WINDOW_MIN_S
        return max(T.WINDOW_MIN_S, min(T.WINDOW_MAX_S, span))

    @cached_property
    def window(self) -> list[TrainerSnapshot]:
        return self.history(self.window_s)

    @cached_property
    def measured(self) -> Measured:
        others: dict[int, list[TrainerSnapshot]] = {}
        cutoff = self.snap.monotonic - self.window_s
        for s in self.recent:
            if s.monotonic < cutoff:
                continue
            for t in s.trainers:
                if t.pid != self.trainer.pid and t.status == "running":
                    others.setdefault(t.pid, []).append(t)
        running = {t.pid for t in self.snap.trainers if t.status == "running"}
        others = {pid: h for pid, h in others.items() if pid in running}
        return measure(self.snap, self.trainer, self.window, others, self.gpu_utilization())

    @cached_property
    def hang(self) -> str | None:
        """How the workers look while the loop has waited without a break (see
        measure.hang_signature), once that lasted long enough to call it a hang."""
        dw = self.data_wait()
        if dw is None or dw.stalled_for_s < T.HANG_STOPPED_MIN_S:
            return None
        stall = self.timed_history(dw.stalled_for_s)
        if not stall:
            return None
        signature = hang_signature(self.trainer, [t for _, t in stall], stall[0][0])
        # Stopped workers deliver nothing, however short the wait seen: the first look names it.
        if signature == "stopped" or (signature == "idle" and dw.stalled_for_s >= T.HANG_MIN_S):
            return signature
        if signature == "one frame" and dw.stalled_for_s >= T.STALL_S:
            return signature
        return None

    @cached_property
    def plan(self) -> Plan:
        return make_plan(self.measured, hung=self.hang is not None)

    @property
    def num_workers(self) -> int:
        """The configured num_workers of the loader the loop waits on, else the workers seen."""
        return self.measured.num_workers

    @property
    def persistent_workers(self) -> bool | None:
        values = {loader.persistent_workers for loader in self.trainer.loaders}
        return values.pop() if len(values) == 1 else None

    @property
    def usable_cpus(self) -> int:
        return self.trainer.usable_cpus or self.snap.host.usable_cpus or self.snap.host.cpu_count

    def data_wait(self) -> DataWait | None:
        dw = self.trainer.data_wait
        return dw if dw is not None and dw.fraction is not None else None

    def found(self, rule_id: str, level: int, title: str, evidence: Mapping[str, object], note: str = "",
              parts: tuple[PlanPart, ...] = (), change: Change | None = None, span_s: float = 0.0,
              immediate: bool = False) -> Check:
        """A finding of this trainer at `level`. `parts` name the slices of the plan it
        proposes (its change and the sentence that says it come from the plan, so findings
        never disagree); `change` is a fixed one for settings the plan does not size
        (persistent_workers, pin_memory); `note` is the rule's own advice."""
        f = Finding(
            id=rule_id,
            severity=SEVERITY[level],
            trainer_pid=self.trainer.pid,
            title=title,
            evidence={k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items()},
            suggestion=note,
            change=change,
            parts=parts,
            note=note,
        )
        planned = parts or rule_id in LOADER_FINDINGS
        return Check(level, with_plan(f, self.plan) if planned else f, span_s=span_s, immediate=immediate)


# Findings about how fast the loader delivers: where the tuner measured a count, they say so.
LOADER_FINDINGS = frozenset({"input_bound", "too_many_workers", "main_process_bound"})


def with_plan(f: Finding, plan: Plan) -> Finding:
    """The finding with its change and suggestion taken from `plan` (the trainer's latest). A
    finding about the loader that proposes nothing says what the settled tuner measured."""
    if not f.parts:
        tuned = plan.tune_measured is not None or (plan.measured is not None and plan.measured.kept)
        measured = plan.tune_text() if tuned and f.id in LOADER_FINDINGS else ""
        return replace(f, suggestion=f"{f.suggestion}; {measured}") if measured and measured not in f.suggestion \
            else f
    change = plan.change(*f.parts)
    sentence = plan.sentence(f.parts)
    tune = plan.tune_text() if "workers" in f.parts else ""
    suggestion = "; ".join(s for s in (sentence, f.note, tune) if s)
    return replace(f, change=change, suggestion=suggestion)


def enough_evidence(dw: DataWait) -> bool:
    """A hook's figure is exact; a sampled one needs enough py-spy samples."""
    return dw.source == "hook" or dw.samples >= T.MIN_STACK_SAMPLES


def wait_above(dw: DataWait, value: float, threshold: float) -> bool:
    """value (a share of dw's window) is above threshold: exactly for a hook's figure,
    beyond sampling error for py-spy's."""
    return value >= threshold if dw.source == "hook" else surely_above(value, dw.samples, threshold)


def surely_above(fraction: float, samples: int, threshold: float) -> bool:
    """The sampled fraction exceeds the threshold by more than its sampling error
    (CONFIDENCE_Z standard errors of a binomial share): 8% of 70 samples is not evidence of 5%."""
    error = (max(fraction * (1 - fraction), 0.01 * 0.99) / max(1, samples)) ** 0.5
    return fraction - error * T.CONFIDENCE_Z >= threshold
