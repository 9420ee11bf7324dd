"""Diagnosis: pure rules over recent snapshots, with hysteresis so findings do not flap.

Each rule module has `ID` and `check(Context) -> Check` for one trainer at one snapshot.
RULES lists them in the order findings are shown (most fundamental first). The Diagnoser
folds checks over history (a condition held HOLD_S raises a finding; CLEAR_S without it,
or without evidence either way, clears it), writes every finding's change from its
trainer's latest plan, and says each trainer's and job's verdict: one immutable Diagnosis a
tick (`.diagnosis`, rules/diagnosis.py), which every output shows. `diagnosed(history)` is the
same fold over a whole history.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import notices as N
from ..model import Finding, Notice, Snapshot
from . import (
    cpu_oversubscribed,
    input_bound,
    loader_stalled,
    main_process_bound,
    main_threads,
    pin_memory_off,
    rank_straggler,
    shm_pressure,
    too_many_workers,
    waits_for_rank,
    worker_died,
    worker_memory_growth,
    worker_respawn,
    worker_threads,
)
from . import thresholds as T
from .base import Check, Context, with_plan
from .diagnosis import Diagnosis, Verdicts, frozen, jobs_said
from .invariants import notice as broken
from .invariants import violations
from .plan import Plan
from .ranks import attributions

# Most fundamental first: a hang, a death, a full /dev/shm, what takes the CPUs, then what
# the loader itself costs.
RULES = {
    m.ID: m.check
    for m in (
        loader_stalled,
        worker_died,
        shm_pressure,
        waits_for_rank,
        rank_straggler,
        cpu_oversubscribed,
        worker_threads,
        main_threads,
        too_many_workers,
        input_bound,
        main_process_bound,
        worker_respawn,
        worker_memory_growth,
        pin_memory_off,
    )
}
ORDER = {rule_id: i for i, rule_id in enumerate(RULES)}
LOOKBACK_S = 600.0
# Set in the test suite (tests/conftest.py): a rule that raises fails the test that fed it,
# where in use it turns into a notice that names it.
RAISE_RULE_ERRORS = "LOADERTOP_RAISE_RULE_ERRORS"


@dataclass
class _State:
    active: bool = False
    bad_since: float | None = None  # the current run of bad checks began (None: not in one)
    gone_since: float | None = None  # the first check since the last bad one that was not bad
    finding: Finding | None = None

    def update(self, t: float, check: Check, hold_s: float, clear_s: float) -> None:
        if check.level is not None and check.level > 0:
            if self.bad_since is None:
                self.bad_since = t - check.span_s
            self.gone_since = None
            self.finding = check.finding
            if check.immediate or t - self.bad_since >= hold_s:
                self.active = True
            return
        if check.level == 0:
            self.bad_since = None  # the condition is gone: a new run must hold again
        if self.gone_since is None:
            self.gone_since = t
        # Fine, or cannot tell: either way nothing has supported the finding since gone_since.
        if t - self.gone_since >= clear_s:
            self.active = False
            self.bad_since = None


class Diagnoser:
    """Feeds snapshots one at a time; the same result as diagnose() over the same history."""

    def __init__(self, hold_s: float = T.HOLD_S, clear_s: float = T.CLEAR_S,
                 rules: Mapping[str, Callable[[Context], Check]] | None = None) -> None:
        self.hold_s = hold_s
        self.clear_s = clear_s
        self.rules = rules or RULES
        self.failed: dict[tuple[str, int], Notice] = {}  # (rule id, trainer pid) -> what it raised
        self._recent: deque[Snapshot] = deque()
        self._states: dict[tuple[str, int, float], _State] = {}
        self.plans: dict[tuple[int, float], Plan] = {}  # each trainer's latest plan
        self.verdicts = Verdicts()
        self.diagnosis = Diagnosis()  # the latest tick's judgement

    def feed(self, snap: Snapshot) -> list[Finding]:
        """One tick: its findings (its whole judgement is `.diagnosis` after it)."""
        self._recent.append(snap)
        while self._recent and self._recent[0].monotonic < snap.monotonic - LOOKBACK_S:
            self._recent.popleft()
        compared = attributions(snap, self._recent)  # once a tick, for every rank's rules and every output
        live = set()
        for trainer in snap.trainers:
            if trainer.status != "running" and not any(e.trainer_pid == trainer.pid for e in snap.events):
                continue
            ctx = Context(snap, trainer, self._recent, compared)
            for rule_id, check in self.rules.items():
                key = (rule_id, trainer.pid, trainer.started_at)
                live.add(key)
                try:
                    result = check(ctx)
                except Exception as e:  # a rule must never take the monitor down, nor go quiet
                    result = Check(None)
                    self._failed(rule_id, trainer.pid, e)
                self._states.setdefault(key, _State()).update(snap.monotonic, result, self.hold_s, self.clear_s)
            try:
                self.plans[(trainer.pid, trainer.started_at)] = ctx.plan
            except Exception as e:
                self._failed("plan", trainer.pid, e)
        # Trainers that exited keep their last findings (the report shows the last data).
        for key in [k for k in self._states if k not in live and not self._known(k, snap)]:
            del self._states[key]
        known = {(t.pid, t.started_at) for t in snap.trainers}
        self.plans = {k: v for k, v in self.plans.items() if k in known}
        self.failed = {k: v for k, v in self.failed.items() if k[1] in {pid for pid, _ in known}}
        findings, pending = self.findings(), self.pending()
        verdicts = {(t.pid, t.started_at): self.verdicts.say(snap.monotonic, t, findings, pending,
                                                             self.plans.get((t.pid, t.started_at)))
                    for t in snap.trainers}
        self.verdicts.forget(known)
        jobs = frozen(jobs_said(snap.trainers, verdicts, compared))
        judged = Diagnosis(snap.time, tuple(findings), tuple(pending), frozen(self.plans), frozen(compared),
                           frozen(verdicts), jobs, tuple(self.notices()))
        # Checked before anything shows it: a contradiction is said as a bug, never shown as an answer.
        broken_now = violations(snap, judged, self.diagnosis, self.verdicts.seen_loaders())
        if broken_now:
            if os.environ.get(RAISE_RULE_ERRORS):
                raise AssertionError("; ".join(broken_now))
            judged = replace(judged, notices=(*judged.notices, *(broken(None, what) for what in broken_now)))
        self.diagnosis = judged
        return findings

    @property
    def recent(self) -> list[Snapshot]:
        """The snapshots the rules look back over, oldest first."""
        return list(self._recent)

    def _failed(self, rule_id: str, pid: int, error: Exception) -> None:
        if os.environ.get(RAISE_RULE_ERRORS):
            raise error
        self.failed[(rule_id, pid)] = N.rule_failed(rule_id, pid, error)

    def notices(self) -> list[Notice]:
        """A notice for each rule that raised (its finding cannot be judged): a bug in loadertop,
        never read as a quiet job."""
        return list(self.failed.values())

    @staticmethod
    def _known(key: tuple[str, int, float], snap: Snapshot) -> bool:
        return any((t.pid, t.started_at) == key[1:] for t in snap.trainers)

    def findings(self) -> list[Finding]:
        return self._of(lambda state: state.active)

    def pending(self) -> list[Finding]:
        """Findings whose condition was found and not contradicted since (a tick that cannot
        tell does not end it) but has not held long enough to be raised: what a first look
        sees (the live view shows them as a provisional verdict, never as findings)."""
        return self._of(lambda state: state.bad_since is not None and not state.active)

    def _of(self, chosen: Callable[[_State], bool]) -> list[Finding]:
        out = []
        for key, state in self._states.items():
            if chosen(state) and state.finding is not None:
                plan = self.plans.get(key[1:])
                # A finding held since an earlier tick speaks with the trainer's latest plan.
                out.append(with_plan(state.finding, plan) if plan is not None else state.finding)
        # The root cause first (RULES' order), then by severity.
        return sorted(out, key=lambda f: (ORDER.get(f.id, len(ORDER)), -f.rank, f.trainer_pid or 0))

    def plan(self, pid: int, started_at: float) -> Plan | None:
        return self.plans.get((pid, started_at))


def diagnose(history: Iterable[Snapshot], **kwargs: Any) -> list[Finding]:
    return diagnose_with_plans(history, **kwargs)[0]


def diagnose_with_plans(history: Iterable[Snapshot],
                        **kwargs: Any) -> tuple[list[Finding], dict[tuple[int, float], Plan]]:
    """The findings at the end of a history, and each trainer's plan then."""
    d = diagnosed(history, **kwargs)
    return d.findings(), dict(d.plans)


def diagnosed(history: Iterable[Snapshot], **kwargs: Any) -> Diagnoser:
    """A diagnoser fed the whole history: its findings, plans and notices at the end."""
    d = Diagnoser(**kwargs)
    for snap in history:
        d.feed(snap)
    return d
