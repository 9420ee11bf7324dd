"""Diagnosis: pure rules over recent snapshots, with hysteresis so findings do not flap.

Each rule module has `check(Context) -> Check` for one trainer at one snapshot. The
Diagnoser folds checks over history (hold a condition HOLD_S to raise, CLEAR_S to clear);
`diagnose(history)` is the same fold over a whole history, for reports.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..model import Finding, Snapshot
from . import (
    cpu_oversubscribed,
    input_bound,
    loader_stalled,
    main_process_bound,
    pin_memory_off,
    shm_pressure,
    too_many_workers,
    worker_died,
    worker_memory_growth,
    worker_respawn,
    worker_threads,
)
from . import thresholds as T
from .base import Check, Context

RULES = {
    "loader_stalled": loader_stalled.check,
    "worker_died": worker_died.check,
    "input_bound": input_bound.check,
    "main_process_bound": main_process_bound.check,
    "shm_pressure": shm_pressure.check,
    "worker_threads": worker_threads.check,
    "cpu_oversubscribed": cpu_oversubscribed.check,
    "too_many_workers": too_many_workers.check,
    "worker_respawn": worker_respawn.check,
    "worker_memory_growth": worker_memory_growth.check,
    "pin_memory_off": pin_memory_off.check,
}
LOOKBACK_S = 600.0


@dataclass
class _State:
    active: bool = False
    bad_since: float | None = None
    good_since: float | None = None
    finding: Finding | None = None

    def update(self, t: float, check: Check, hold_s: float, clear_s: float) -> None:
        if check.level is None:
            return  # cannot tell: neither raises nor clears
        if check.level > 0:
            self.good_since = None
            if self.bad_since is None:
                self.bad_since = t - check.span_s
            self.finding = check.finding
            if check.immediate or t - self.bad_since >= hold_s:
                self.active = True
        else:
            self.bad_since = None
            if self.good_since is None:
                self.good_since = t
            if self.active and t - self.good_since >= clear_s:
                self.active = False


class Diagnoser:
    """Feeds snapshots one at a time; the same result as diagnose() over the same history."""

    def __init__(self, hold_s: float = T.HOLD_S, clear_s: float = T.CLEAR_S, rules=None) -> None:
        self.hold_s = hold_s
        self.clear_s = clear_s
        self.rules = rules or RULES
        self._recent: deque[Snapshot] = deque()
        self._states: dict[tuple[str, int, float], _State] = {}

    def feed(self, snap: Snapshot) -> list[Finding]:
        self._recent.append(snap)
        while self._recent and self._recent[0].monotonic < snap.monotonic - LOOKBACK_S:
            self._recent.popleft()
        live = set()
        for trainer in snap.trainers:
            if trainer.status != "running" and not any(e.trainer_pid == trainer.pid for e in snap.events):
                continue
            ctx = Context(snap, trainer, self._recent)
            for rule_id, check in self.rules.items():
                key = (rule_id, trainer.pid, trainer.started_at)
                live.add(key)
                try:
                    result = check(ctx)
                except (ArithmeticError, ValueError, TypeError, KeyError):
                    result = Check(None)  # a rule must never take the monitor down
                self._states.setdefault(key, _State()).update(
                    snap.monotonic, result, self.hold_s, self.clear_s
                )
        # Trainers that exited keep their last findings (the report shows the last data).
        for key in [k for k in self._states if k not in live and not self._known(k, snap)]:
            del self._states[key]
        return self.findings()

    @staticmethod
    def _known(key, snap: Snapshot) -> bool:
        return any((t.pid, t.started_at) == key[1:] for t in snap.trainers)

    def findings(self) -> list[Finding]:
        out = [s.finding for s in self._states.values() if s.active and s.finding is not None]
        return sorted(out, key=lambda f: (-f.rank, list(RULES).index(f.id), f.trainer_pid or 0))


def diagnose(history: Iterable[Snapshot], **kwargs) -> list[Finding]:
    d = Diagnoser(**kwargs)
    out: list[Finding] = []
    for snap in history:
        out = d.feed(snap)
    return out
