"""Who came and went: a trainer's workers from one tick to the next (started, exited, started
again after others exited) and the end of a trainer. Pure bookkeeping that turns what one
tick saw into events; the exit codes come from the caller (probes.exits)."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

from .model import Event, ProcessSample
from .notices import describe_exit
from .probes.discovery import Key

ExitCode = Callable[[Key], "int | None"]


@dataclass
class WorkerRoster:
    """One trainer's workers across ticks."""

    workers: dict[Key, ProcessSample] = field(default_factory=dict)
    zombie_codes: dict[Key, int | None] = field(default_factory=dict)  # seen dead, not yet reaped
    any_exited: bool = False
    respawns: int = 0  # workers started after others exited: an epoch's new set, or churn

    def update(self, now: float, trainer_pid: int, live: dict[Key, ProcessSample], zombies: dict[Key, int | None],
               exit_code: ExitCode, alive: Container[int]) -> list[Event]:
        """This tick's live workers (in start order) and the zombies seen; `alive`: pids that
        still exist, to forget the exit codes of reaped zombies."""
        for key, code in zombies.items():
            self.zombie_codes.setdefault(key, code)
        events = []
        # Exits first: a worker that starts on the tick its predecessors are seen gone (an
        # epoch's new set, when epochs are shorter than the interval) is a respawn too.
        for key in self.workers:
            if key not in live:
                self.any_exited = True
                code = self.zombie_codes.get(key)
                if code is None:
                    code = exit_code(key)
                events.append(Event(now, "worker_exited", trainer_pid, key[0], describe_exit(code), code))
        for key in live:
            if key not in self.workers:
                if self.any_exited:
                    self.respawns += 1
                events.append(Event(now, "worker_started", trainer_pid, key[0]))
        self.zombie_codes = {k: v for k, v in self.zombie_codes.items() if k[0] in alive}
        self.workers = live
        return events

    def end(self, now: float, trainer_pid: int, exit_code: ExitCode) -> list[Event]:
        """The trainer exited: its workers went with it, unless they died first."""
        events = []
        for key in self.workers:
            code = exit_code(key)
            events.append(Event(now, "worker_exited", trainer_pid, key[0],
                                describe_exit(code) if code else "with its trainer", code))
        return events
