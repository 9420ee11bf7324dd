"""The judgement of one tick, made once: the findings (raised and pending), one plan per trainer,
each job's ranks compared, and each trainer's and job's verdict with the change to make. The
diagnoser (rules/__init__.py) makes one immutable Diagnosis a tick; the live view, the reports,
the exporter, the summary and `diff` show it and never judge again.

A verdict is said by rules that hold whatever the host does (`Verdicts`):
- no HEALTHY before a DataLoader was seen and a data wait measured: WATCHING (measuring);
- a first look (py-spy's short window, a finding not held yet) is provisional; once a verdict
  was confirmed it is never provisional again, and an exited trainer never is;
- a confirmed verdict that names a cause (its words without the figure: INPUT-BOUND, BUSY HOST)
  gives way to another cause only once the new one held VERDICT_HOLD_S: on a busy host the
  findings behind two causes can both hold and take turns at the top, and the answer must not
  flip with them; except for what cannot wait (a hang, a death, a full /dev/shm, the end). A
  cause found or cleared is said at once: its finding held (or cleared) over its own hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..model import Finding, Notice, TrainerSnapshot
from . import thresholds as T
from .plan import Plan
from .ranks import Attribution
from .verdict import first_answer, job_verdict, verdict

# A new verdict class replaces a confirmed one once it held this long (a finding raised on a
# busy host can come and go with the load within its own hold).
VERDICT_HOLD_S = T.HOLD_S
# Classes that replace any other at once: the job cannot wait for them to hold.
AT_ONCE = ("STALLED", "WORKER DIED", "SHM FULL", "EXITED")
MEASURING = "WATCHING"
# Verdicts that name no cause (no finding behind them): a cause replaces them, or they it, at once.
NO_CAUSE = ("HEALTHY", "WATCHING", "DATA WAIT", "EXITED")

TrainerKey = tuple[int, float]  # (pid, started_at)


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class Verdict:
    """What the header says of one trainer: its verdict, whether it is a first look, and the one
    change to make (or why there is none)."""

    text: str
    colour: str
    provisional: bool = False
    change: str = ""  # the plan's sentence, or the most fundamental finding's own change
    why_no_change: str = ""  # a warning or critical finding with nothing to change: its reason
    measuring: bool = False  # no DataLoader seen, or no data wait yet

    @property
    def kind(self) -> str:
        """The verdict's class: its words without figures ('INPUT-BOUND 62%' -> 'INPUT-BOUND')."""
        return kind_of(self.text)


def kind_of(text: str) -> str:
    return re.sub(r"\s*\d+(-\d+)?%", "", text).strip()


@dataclass(frozen=True)
class JobVerdict:
    """A job of several trainers (its ranks): its verdict, and its ranks compared."""

    job: str
    text: str
    colour: str
    ranks_seen: int
    compared: Attribution | None = None


@dataclass(frozen=True)
class Diagnosis:
    """The judgement of one tick. Immutable: outputs read it, none changes it."""

    time: float = 0.0  # the snapshot's (epoch seconds)
    findings: tuple[Finding, ...] = ()
    pending: tuple[Finding, ...] = ()
    plans: Mapping[TrainerKey, Plan] = field(default_factory=_empty)
    jobs: Mapping[str, Attribution] = field(default_factory=_empty)
    verdicts: Mapping[TrainerKey, Verdict] = field(default_factory=_empty)
    job_verdicts: Mapping[str, JobVerdict] = field(default_factory=_empty)
    notices: tuple[Notice, ...] = ()

    def verdict(self, trainer: TrainerSnapshot) -> Verdict:
        found = self.verdicts.get((trainer.pid, trainer.started_at))
        if found is not None:
            return found
        text, colour = verdict(trainer, list(self.findings))  # a trainer the diagnoser did not see
        return Verdict(text, colour)

    def plan(self, trainer: TrainerSnapshot) -> Plan | None:
        return self.plans.get((trainer.pid, trainer.started_at))

    def job(self, name: str) -> Attribution | None:
        return self.jobs.get(name)


def loader_seen(trainer: TrainerSnapshot) -> bool:
    """A DataLoader of this trainer's was seen: its workers, the hook's loaders, or py-spy's
    frames inside one (a loader without workers loads in the loop)."""
    dw = trainer.data_wait
    return bool(trainer.workers or trainer.loaders) or (
        dw is not None and (dw.source == "hook" or (dw.fraction or 0.0) > 0.0))


def why_no_change(trainer: TrainerSnapshot, findings: list[Finding]) -> str:
    """Why a trainer with a warning or critical finding has no setting to change: the most
    fundamental such finding's own words (its suggestion, up to its first ';')."""
    mine = [f for f in findings if f.trainer_pid in (None, trainer.pid) and f.severity != "info"]
    if not mine:
        return ""
    return mine[0].suggestion.split(";")[0].strip() or mine[0].title


def the_change(trainer: TrainerSnapshot, findings: list[Finding], plan: Plan | None) -> str:
    """The one change to make for this trainer, with its predicted effect: the plan's, which
    every finding's change is a slice of; else the most fundamental finding's own (a setting
    the plan does not size, pin_memory). Empty when no finding asks for a change."""
    mine = [f for f in findings if f.trainer_pid in (None, trainer.pid) and f.change]
    if not mine:
        return ""
    if plan is not None and plan.change("workers", "threads", "shm"):
        return plan.sentence()
    return mine[0].suggestion


@dataclass
class _Shown:
    """What was said of one trainer so far."""

    seen_loader: bool = False
    confirmed: Verdict | None = None  # the last confirmed verdict said
    rival: str | None = None  # a class that differs from it...
    rival_since: float = 0.0  # ...since this tick (monotonic)


class Verdicts:
    """Each trainer's verdict, tick by tick, by the rules in the module's docstring. The
    diagnoser holds one; a fresh one over the same history says the same."""

    def __init__(self, hold_s: float = VERDICT_HOLD_S) -> None:
        self.hold_s = hold_s
        self.shown: dict[TrainerKey, _Shown] = {}

    def say(self, now: float, trainer: TrainerSnapshot, findings: list[Finding], pending: list[Finding],
            plan: Plan | None) -> Verdict:
        shown = self.shown.setdefault((trainer.pid, trainer.started_at), _Shown())
        shown.seen_loader = shown.seen_loader or loader_seen(trainer)
        mine = [f for f in findings if f.trainer_pid in (None, trainer.pid)]
        raised = bool(mine)
        if trainer.status == "exited":
            return Verdict("EXITED", "magenta")
        if not shown.seen_loader and not raised:
            return Verdict(MEASURING, "cyan", measuring=True)
        if shown.confirmed is None:
            text, colour, provisional = first_answer(trainer, findings, pending)
            if provisional:
                asked = findings + [f for f in pending if f not in findings]  # the change it would ask
                return self._with_change(Verdict(text, colour, provisional=True), trainer, asked, plan)
        else:
            text, colour = verdict(trainer, findings)
        now_said = self._with_change(Verdict(text, colour, measuring=text == MEASURING), trainer, findings, plan)
        if now_said.measuring:
            return now_said
        return self._held(shown, now, now_said)

    def _held(self, shown: _Shown, now: float, said: Verdict) -> Verdict:
        """said, or the confirmed verdict before it while said's class has not held yet."""
        before = shown.confirmed
        if (before is None or said.kind == before.kind or said.kind in AT_ONCE
                or said.kind.startswith(NO_CAUSE) or before.kind.startswith(NO_CAUSE)):
            shown.confirmed, shown.rival = said, None
            return said
        if shown.rival != said.kind:
            shown.rival, shown.rival_since = said.kind, now
        if now - shown.rival_since >= self.hold_s:
            shown.confirmed, shown.rival = said, None
            return said
        return before

    @staticmethod
    def _with_change(v: Verdict, trainer: TrainerSnapshot, findings: list[Finding], plan: Plan | None) -> Verdict:
        change = the_change(trainer, findings, plan)
        why = "" if change else why_no_change(trainer, findings)
        return Verdict(v.text, v.colour, v.provisional, change, why, v.measuring)

    def forget(self, keep: set[TrainerKey]) -> None:
        self.shown = {k: v for k, v in self.shown.items() if k in keep}

    def seen_loaders(self) -> set[TrainerKey]:
        """The trainers whose DataLoader was seen so far (the invariants check HEALTHY by it)."""
        return {k for k, s in self.shown.items() if s.seen_loader}


def jobs_said(trainers: tuple[TrainerSnapshot, ...], verdicts: Mapping[TrainerKey, Verdict],
              compared: Mapping[str, Attribution]) -> dict[str, JobVerdict]:
    """Each job of several trainers: its verdict from its ranks' (rules/verdict.py)."""
    groups: dict[str, list[TrainerSnapshot]] = {}
    for t in trainers:
        groups.setdefault(t.job, []).append(t)
    out = {}
    for name, members in groups.items():
        if len(members) < 2:
            continue
        ranks = [(t.rank, verdicts[(t.pid, t.started_at)].text, verdicts[(t.pid, t.started_at)].colour)
                 for t in members if (t.pid, t.started_at) in verdicts]
        text, colour = job_verdict(compared.get(name), ranks)
        out[name] = JobVerdict(name, text, colour, len(members), compared.get(name))
    return out


def frozen(d: dict) -> Mapping:
    return MappingProxyType(dict(d))
