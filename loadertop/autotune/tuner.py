"""`watch(loader, tune=True)`: the loop that measures a setting and keeps it or goes back.

The hook already times every `next()`. The tuner adds, per watched loader:

- warm-up: nothing is measured or changed in the first WARMUP_BATCHES batches;
- stretches: the batches after it, at one setting, timed (steps per second and its noise)
  and measured from /proc (measure.py) at most every READ_EVERY_S;
- at the next epoch boundary once a stretch is long enough (or mid-epoch, for a
  StatefulDataLoader that can carry its place over), the Explorer (policy.py) judges the
  setting just measured and names the next one, from the plan (rules/plan.py) and the
  plausible neighbours; the change is applied to the loader for its next iterator
  (loader.py).

Every decision goes to the hook file (the monitor shows it) and to the `loadertop.tune`
logger. Any error inside the tuner turns it off with one warning; the loader then keeps the
last setting it measured good, and the loop goes on. Nothing here runs until tune=True.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import replace

from ..model import Decision, Knobs
from ..probes import procfs
from ..probes.discovery import WORKER_COMM
from ..rules import thresholds as T
from ..rules.thresholds import RANK_GAP
from ..vocabulary import TunePhase
from ..wrapped import innermost
from . import loader as L
from . import readings as M
from .coordination import Alone, Coordination, Ranks, coordinate
from .policy import MIN_MEASURED_GAIN, Explorer, Stretch, chunk_rates, compare
from .propose import propose
from .rank_roles import RankRole
from .ranks_board import board_for

log = logging.getLogger("loadertop.tune")

WARMUP_BATCHES = 20  # the first epoch's first batches: caches, workers, allocators warm up
MIN_STRETCH_BATCHES = 30
MIN_STRETCH_S = 2.0
MID_EPOCH_STRETCH_S = 5.0  # a StatefulDataLoader's stretch, changed mid-epoch
# A stretch goes on (over epochs if they are short) until its reading is clear: a trial's gain
# or loss out of the noise, the kept setting's rate within this relative standard error; or
# until it is long enough (below).
KEPT_RELATIVE_ERROR = 0.02
MAX_KEPT_S = 10.0  # the kept setting's reading: long enough to judge trials against, not longer
MAX_STRETCH_S = 30.0
CHECK_EVERY_BATCHES = 16  # a mid-epoch stretch is looked at this often (the check reads every batch's time)
MAX_SETTLE_BATCHES = 64
MAX_DURATIONS = 200_000  # batch durations one stretch keeps (a very long epoch is cut there)
SHM_FULL = 0.9  # /dev/shm this full: the tuner stops rather than risk a worker's "Bus error"
# A settled tuner looks again when its epoch's data wait moved this far (a share of the loop,
# the monitor's straggler gap: beyond an epoch's noise), or the CPUs it may use by this many.
LOOK_AGAIN_WAIT = RANK_GAP
LOOK_AGAIN_CPUS = 1.0


class TunerOff(Exception):
    """The tuner cannot go on: the reason is the warning's."""


class Tuner:
    def __init__(self, name: str, publish, config, shards_by_worker: bool = False,
                 workers_of: Callable[[object], list[int]] | None = None, threads: bool = True) -> None:
        self.name = name
        # Thread counts are knobs too (the loop's torch threads, the workers' pools), unless
        # the user opts out: watch(..., tune_threads=False) or LOADERTOP_TUNE_THREADS=0.
        self.threads = threads and os.environ.get("LOADERTOP_TUNE_THREADS", "1").strip() not in ("0", "false", "no")
        # The worker pids of a DataLoader iterator: the hook's own reading, given by it (the
        # tuner does not import the trainer side); without it, this process's workers by name.
        self.workers_of: Callable[[object], list[int]] = workers_of or (lambda iterator: [])
        self.publish = publish  # writes the tuner's state into the hook file
        self.config = config  # the loader's settings as the hook published them (a callable)
        self.shards_by_worker = shards_by_worker
        self.explorer: Explorer | None = None
        self.state: TunePhase = "warm-up"
        self.reason = ""
        self.decisions: list[Decision] = []
        self.started_with: Knobs | None = None
        self.epoch = 0
        self.batches = 0
        self.me: M.Self | None = None
        self.loader = None  # the loader whose epoch runs (for its workers)
        self.readings: list[M.Reading] = []  # the stretch's first and latest, of one set of workers
        self.durations: list[float] = []  # the stretch's batch durations (seconds)
        self.wait_ns = 0
        self.skip = WARMUP_BATCHES  # batches not measured before the stretch starts
        self.last_ns: int | None = None  # the previous batch's delivery, in this segment
        self.read_ns = 0  # when the latest reading was taken
        self.cost_ns = 0  # time the tuner took in the loop to measure and decide
        self.timing = False
        self.apply_ns = 0  # time changes took in the loop: old workers shut down, a StatefulDataLoader restored
        self.worker_pids: list[int] = []
        self.find_workers = False  # look the workers up at the segment's first batch
        self.mid_epoch = False  # the loader can change mid-epoch (StatefulDataLoader, where proven)
        self.ran: Knobs | None = None  # the setting the last iterator ran at (a failed start goes back to it)
        self.rng: list | None = None  # the RNG states before a changed iterator starts (for its retry)
        self.restore: tuple | None = None  # (loader, seed): the next iterator's workers' private seed
        self.retry: tuple | None = None  # that seed, for a retry of a start that failed
        self.armed: ExitStack | None = None  # that seed in place while a framework builds the iterator
        self.pending: Knobs | None = None  # the setting to go back to at the next boundary (off)
        self.last_rate: float | None = None
        self.clock = time.perf_counter_ns  # the hook's clock: batch times come from it too
        # Who tunes and when among the ranks of the job (autotune/coordination.py): alone until
        # a board is found at the first boundary, and again once coordination fails.
        self.coordination: Coordination = Alone()
        self.coordinated = False  # the board was looked for (at the first boundary)
        self.role = RankRole("alone")
        self.plan: tuple[int, Knobs] | None = None  # a leader's change: from this epoch, every rank
        self.stretch_epoch = 0  # the epoch the stretch began in (a leader reads its peers' waits over it)
        self.last_wait: float | None = None
        self.board_for = board_for
        self.until_boundary = False  # nothing is measured until the next epoch boundary
        # This epoch's data wait, kept with peers only (the ranks compare it at the boundary).
        self.epoch_last_ns: int | None = None
        self.epoch_s = self.epoch_wait_s = 0.0
        self.last_epoch_s = 0.0  # the last epoch's length (a short first one is not compared)
        self.epoch_batches = 0
        self.settled_under: tuple[float, float] | None = None  # (data wait, CPUs it may use) when it settled
        self.watch_reading: M.Reading | None = None
        self.changed_epochs = 0  # consecutive boundaries at which the conditions differed
        self.refused: Knobs | None = None  # a leader's setting past this rank's bounds (said once)

    # --- the loop's calls ---------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return self.state in ("settled", "off")

    def boundary(self, loader, framework: bool = False) -> None:
        """An epoch boundary: the loader is about to build its next iterator (`framework`:
        a framework builds it, out of `building()`'s reach)."""
        self.last_ns = None
        self.loader = loader
        self.ran = self.rng = None
        self._release()
        if self.state == "off":
            self._go_back(loader)
            return
        with self._timed(), self._guarded():
            inner = innermost(loader)
            if self.explorer is None:
                why = L.why_not_tunable(inner, self.shards_by_worker)
                if why is not None:
                    raise TunerOff(why)
                self.me = M.Self()
                self.started_with = self._knobs(inner)
                self.explorer = Explorer(self.started_with)
                self._publish()
            self.epoch += 1
            if self.until_boundary:  # a setting that waited for this boundary: measured from its first batch
                self.until_boundary = False
                self.skip = 1
            self.ran = self._knobs(inner)
            self.role = self._role()
            if self.state == "settled" and self.role.role in ("alone", "leader", "straggler"):
                self._look_again_if_changed(inner)
            if self.me is not None:
                self.me.straggler = self.role.role == "straggler"
            if self.role.role in ("waiting", "follower"):
                self._hold(inner)
            else:
                if not self.idle and self._stretch_done(MIN_STRETCH_S):
                    self._decide()
                self.mid_epoch = (not framework and inner is loader and self._mid_epoch(inner)
                                  and self.coordination.mid_epoch)
                with self._applying():
                    self._apply(inner)
            self._tell(inner)
            changed = self.ran is not None and not L.same_workers(self._knobs(inner), self.ran)
            self.rng = L.rng_states(inner) if changed else None
            if framework and self.restore is not None:
                self.armed = ExitStack()  # until the framework's iterator gives its first batch
                self.armed.enter_context(L.private_seed(*self.restore))
                self.restore = None

    def _mid_epoch(self, inner) -> bool:
        why = L.why_not_mid_epoch(inner)
        if why is not None and L.is_stateful(inner) and self.epoch == 1:
            log.info("loadertop tune %s: changes at epoch boundaries only: %s", self.name, why)
        return why is None

    def rebuild(self, loader, error: Exception):
        """The loader's iterator failed to start at the setting the tuner just gave it (a full
        /dev/shm): start it at the setting that ran, from the same RNG draws, and turn the
        tuner off. Re-raises where the tuner changed nothing or that start fails too: the
        loop is never handed an iterator that is shut down."""
        inner = innermost(loader)
        ran, tried = self.ran, self._knobs(inner)
        if ran is None or L.same_workers(ran, tried):
            raise error
        L.apply(inner, ran)
        L.set_rng_states(self.rng)
        self._off(f"could not start {tried.label()}: {type(error).__name__}: {error}", running=ran)
        with ExitStack() as stack:
            if self.retry is not None:
                stack.enter_context(L.private_seed(*self.retry))
            stack.enter_context(L.quiet_worker_count())
            return iter(loader)

    def _release(self) -> None:
        if self.armed is not None:
            armed, self.armed = self.armed, None
            armed.close()

    @contextmanager
    def building(self):
        """Around the loader's `iter()`: a replaced persistent iterator takes its workers'
        seed from a private generator; torch's more-workers-than-CPUs warning is the
        tuner's own measured choice."""
        restore, self.restore = self.restore, None
        self.retry = restore
        if restore is None:
            with L.quiet_worker_count():
                yield
            return
        with L.private_seed(*restore), L.quiet_worker_count():
            yield

    def begin(self, loader, iterator=None) -> None:
        """The epoch's iterator is built (or a framework is building it): the batches from
        now on are one segment, timed from here."""
        self.loader = loader
        self.epoch_last_ns = self.clock()
        if self.idle:
            # Settled: its look-again reads the workers that run now (settling on a setting it
            # went back to starts that setting's workers afresh). With the trial's, gone, the
            # trainer's own CPU read low and the host busy: the starved demo read "CPUs 2.0 ->
            # 0.2" at every look and explored again and again.
            self.find_workers = self.state == "settled"
            return
        self.last_ns = self.clock()
        self.find_workers = True
        if iterator is not None:
            with self._timed(), self._guarded():
                self._look_up_workers(iterator)

    def delivered(self, now_ns: int, waited_ns: int) -> bool:
        """A batch reached the loop. True when a mid-epoch change is due (then switch())."""
        self.batches += 1
        if self.armed is not None:
            self._release()
        if self.epoch_last_ns is not None:  # the epoch's data wait, settled or not: the ranks compare it
            self.epoch_s += (now_ns - self.epoch_last_ns) / 1e9
            self.epoch_wait_s += waited_ns / 1e9
            self.epoch_batches += 1
            self.epoch_last_ns = now_ns
        if self.idle:
            if self.find_workers:
                with self._timed(), self._guarded():
                    self._look_up_workers(None)
            return False
        last, self.last_ns = self.last_ns, now_ns
        if self.until_boundary:
            return False
        if self.find_workers:
            with self._timed(), self._guarded():
                self._look_up_workers(None)
        if self.skip > 0:
            self.skip -= 1
            if self.skip == 0:
                with self._timed():
                    self._start_stretch()
            return False
        if last is None:
            return False
        if len(self.durations) < MAX_DURATIONS:
            self.durations.append((now_ns - last) / 1e9)
            self.wait_ns += waited_ns
        if now_ns - self.read_ns >= M.READ_EVERY_S * 1e9:
            self._read()
        return (self.mid_epoch and not self.idle and len(self.durations) % CHECK_EVERY_BATCHES == 0
                and self._stretch_done(MID_EPOCH_STRETCH_S))

    def resume(self) -> None:
        """The loop fetches again after something else (validation inside an epoch)."""
        if not self.idle:
            self.last_ns = self.clock()

    def end(self) -> None:
        """The epoch ended (StopIteration, or the framework's epoch end)."""
        self.last_ns = None
        if self.idle or self.skip > 0 or not self.durations:
            return
        if len(self.readings) < 2 or self.clock() - self.read_ns >= M.READ_EVERY_S * 1e9:
            self._read()  # the pair of this set of workers, before they go with the epoch

    def switch(self, loader):
        """A mid-epoch decision for a StatefulDataLoader; returns the iterator to go on with.
        A setting this loader cannot take mid-epoch waits for the epoch's end; one that fails
        to start leaves the loop at the setting that ran, from the same place (L.switch)."""
        iterator = loader._iterator
        target: Knobs | None = None
        with self._timed():
            with self._guarded():
                self._decide()
                ran = self._knobs(loader)
                # Settled too: a trial kept after the setting before it was read again (A B A)
                # is put back at once.
                if self.explorer is not None and self.explorer.current != ran and self.state != "off":
                    target = self.explorer.current
                    if L.same_workers(target, ran):
                        L.apply(loader, target)  # the loop's threads only: at once, the workers go on
                        target = None
                    elif not L.can_switch_mid_epoch(loader, target):
                        self._wait_for_the_boundary()
                        target = None
            if target is not None:
                # Outside the guard: where no setting can go on, the error is the loop's.
                with self._applying():
                    iterator, failed = L.switch(loader, target)
                self.worker_pids = self.workers_of(iterator)
                if failed is not None:
                    self._off(f"could not start {target.label()} mid-epoch: {type(failed).__name__}: {failed}",
                              running=ran)
        self.last_ns = self.clock()
        return iterator

    def _wait_for_the_boundary(self) -> None:
        """The new setting starts with the next iterator: nothing is measured until then, where
        the batches would be credited to a setting that is not running."""
        self.mid_epoch = False
        self.until_boundary = True
        self.durations = []
        self.readings = []

    # --- measuring ----------------------------------------------------------------------

    def _look_up_workers(self, iterator) -> None:
        self.find_workers = False
        pids = self._workers(self.loader, iterator)
        if pids != self.worker_pids:
            self.worker_pids = pids
            if self.skip == 0 and not self.idle and self.explorer is not None:
                self._read()  # the first reading of these workers

    def _look_again_if_changed(self, inner) -> None:
        """Settled: once the conditions it settled under changed (its data wait, or the CPUs it
        may use: a host whose load came or went), it explores again from where it is, the
        settings it rejected then included."""
        under, explorer, me = self.settled_under, self.explorer, self.me
        if under is None or explorer is None or me is None:
            return
        reading = me.read(self.worker_pids)
        before, self.watch_reading = self.watch_reading, reading
        if before is None or self.last_wait is None:
            return
        knobs = self._knobs(inner)
        m = M.measured(me, before, reading, wait=self.last_wait, num_workers=knobs.num_workers,
                       prefetch_factor=knobs.prefetch_factor, config=self.config())
        wait, cpus = under
        changed = []
        if abs(self.last_wait - wait) >= LOOK_AGAIN_WAIT and self.last_wait >= T.DATA_WAIT_WARNING:
            changed.append(f"data wait {wait:.0%} -> {self.last_wait:.0%}")
        # The CPUs only over every worker of the setting, read at both looks: where some are
        # missing (workers that start every epoch are gone at its boundary) the trainer's own
        # use reads low and the host busy (the starved demo read "CPUs 2.0 -> 0.2" that way).
        whole = set(before.workers) == set(reading.workers) and len(reading.workers) == knobs.num_workers
        if whole and abs(m.budget.cpus - cpus) >= LOOK_AGAIN_CPUS:
            changed.append(f"CPUs it may use {cpus:.1f} -> {m.budget.cpus:.1f}")
        # Held at two boundaries in a row: one epoch's reading of a busy host is noise.
        self.changed_epochs = self.changed_epochs + 1 if changed else 0
        if self.changed_epochs < 2:
            return
        self.changed_epochs = 0
        log.info("loadertop tune %s: epoch %d: %s since it settled: looking again", self.name, self.epoch,
                 ", ".join(changed))
        self.explorer = Explorer(explorer.kept)
        self.settled_under = None
        self.reason = "looking again: " + ", ".join(changed)
        self.state = "measuring"
        self.skip = 1
        self._publish()

    def _stretch_done(self, least_s: float) -> bool:
        """Enough of the stretch to judge: past its least length, a trial once its gain or
        loss is clear of the noise (or its time is up), the kept setting once its rate is
        known well enough to judge the next trial against."""
        if self.skip > 0 or self.until_boundary or len(self.durations) < MIN_STRETCH_BATCHES:
            return False
        seconds = sum(self.durations)
        if seconds < least_s:
            return False
        if seconds >= MAX_STRETCH_S or self.explorer is None:
            return True
        explorer = self.explorer
        so_far = Stretch(explorer.current, len(self.durations), seconds, 0.0, chunk_rates(self.durations))
        against = explorer.against
        if against is None:
            return so_far.relative_error <= KEPT_RELATIVE_ERROR or seconds >= MAX_KEPT_S
        gain, noise = compare(so_far, against)
        # A trial (and the setting kept, read again after it) is done once its difference is
        # clear, or once it is as long as the stretch it is judged against (two readings of the
        # same precision: longer would only delay).
        return noise <= max(abs(gain), MIN_MEASURED_GAIN) or seconds >= against.seconds

    def _start_stretch(self) -> None:
        self.stretch_epoch = self.epoch
        self.durations = []
        self.wait_ns = 0
        self.readings = []
        explorer = self.explorer
        self.state = "trying" if explorer is not None and explorer.trial is not None else "measuring"
        self._read()
        self._publish()

    def _read(self) -> None:
        """A reading of this process and its workers: the stretch's pair is its first and
        latest of one set of workers (a non-persistent loader's go with each epoch)."""
        if self.me is None or self.state == "off":
            return
        with self._timed(), self._guarded():
            reading = self.me.read(self.worker_pids)
            if reading.main is None:
                raise TunerOff(f"cannot read this process's threads in {procfs.PROC}/{self.me.pid}/task")
            if reading.shm is not None and reading.shm[0] and reading.shm[1] >= SHM_FULL * reading.shm[0]:
                raise TunerOff(f"{self.me.shm_path} is {reading.shm[1] / reading.shm[0]:.0%} full: more batches "
                               "in flight could crash a worker (Bus error)")
            same = self.readings and set(self.readings[0].workers) == set(reading.workers)
            self.readings = [self.readings[0], reading] if same else [reading]
        self.read_ns = self.clock()

    # --- deciding -----------------------------------------------------------------------

    def _decide(self) -> None:
        explorer = self.explorer
        if explorer is None or self.me is None:
            return
        if len(self.readings) < 2:
            self._read()
        if len(self.readings) < 2 or self.state == "off":
            return  # no pair of readings yet: the stretch goes on
        first, last = self.readings[0], self.readings[-1]
        knobs = explorer.current
        seconds = sum(self.durations)
        config = self.config()
        if self.coordination.starts_apart(self.stretch_epoch, seconds >= MAX_STRETCH_S):
            self._start_stretch()  # the ranks' first epoch: they wait for each other's start
            return
        own_wait = min(1.0, self.wait_ns / 1e9 / seconds)
        job_wait = self._job_wait(own_wait, seconds)
        if job_wait is None:
            return  # a peer's wait over this stretch is not on the board yet: the stretch goes on
        measured = M.measured(self.me, first, last, wait=job_wait,
                              num_workers=knobs.num_workers, prefetch_factor=knobs.prefetch_factor, config=config)
        stretch = Stretch(knobs, len(self.durations), seconds, self.wait_ns / 1e9, chunk_rates(self.durations),
                          measured=measured)
        self.last_rate = stretch.rate
        judged = explorer.judge(stretch)
        if judged is not None:
            self._record(judged)
        elif explorer.bracketing:
            gain, noise = compare(stretch, explorer.kept_stretch or stretch)
            spread = f" (noise ±{noise:.0%})" if math.isfinite(noise) else ""
            log.info("loadertop tune %s: epoch %d: %s: measured %+.0f%% steps/s%s against the stretch before; "
                     "%s again, to read the host after it", self.name, self.epoch, explorer.kept.arrow(knobs),
                     gain * 100, spread, explorer.kept.short(knobs))
        elif explorer.trial is not None and explorer.rounds:
            log.info("loadertop tune %s: epoch %d: the host's load moved %s around the trial: %s once more",
                     self.name, self.epoch, explorer.kept.short(explorer.trial), explorer.trial.short(explorer.kept))
        proposed = explorer.propose(propose(explorer.kept_stretch or stretch, bool(config.get("persistent_workers")),
                                            stateful=self.loader is not None and L.is_stateful(innermost(self.loader))))
        if proposed is not None:
            self._record(proposed)
        self.state = "settled" if explorer.settled else ("trying" if explorer.trial else "measuring")
        if explorer.settled:
            self.reason = "" if self.reason.startswith("looking again") else self.reason
            # What it settled under: looked at every epoch, and looked again once it changes.
            # The setting it settled on's own reading: where a trial was kept, the trial's (the
            # stretch just read is the setting before, read again after it).
            kept = explorer.kept_stretch if explorer.kept_stretch is not None else stretch
            kept_cpus = kept.measured.budget.cpus if kept.measured is not None else measured.budget.cpus
            self.settled_under = (kept.wait_share, kept_cpus)
            # The CPUs are read again from the workers that run from the next boundary on.
            self.watch_reading = last if kept is stretch else None
        self.durations = []
        self.wait_ns = 0
        self.readings = []
        # A new setting is measured once its workers have started and its queue is full
        # where they start mid-run (persistent workers, a mid-epoch change); a loader whose
        # workers start every epoch pays that every epoch, so there it is measured too.
        changed = explorer.current != knobs
        persistent = bool(config.get("persistent_workers")) or self.mid_epoch
        self.skip = _settle(explorer.current) if changed and persistent else 0
        if not self.idle and self.skip == 0:
            self._start_stretch()
        self._publish()

    def _apply(self, inner) -> None:
        explorer = self.explorer
        if explorer is None:
            return
        target = explorer.current
        if self.role.role == "leader" and self.plan is None and target != self.ran:
            # Every rank makes the change at the next boundary (the followers read it meanwhile):
            # until then nothing is measured, as the ranks still run the old setting.
            self.plan = (self.epoch + 1, target)
            self._wait_for_the_boundary()
            return
        if self.plan is not None and self.epoch < self.plan[0]:
            return
        self.plan = None
        self._set(inner, target)

    def _set(self, inner, target: Knobs) -> None:
        seed = L.base_seed(inner)
        if L.apply(inner, target):
            self.restore = (inner, seed)

    # --- the other ranks of the job ----------------------------------------------------------

    def _role(self) -> RankRole:
        """This rank's role among its peers at this boundary (alone where it has none)."""
        # This epoch's own reading only: a wait from before a change (or none, while a change
        # waits for the boundary) would name a straggler that is not one.
        self.last_wait = self._epoch_wait()
        if not self.coordinated:
            self.coordinated = True
            try:
                self.coordination = coordinate(self.board_for, self.name, self.started_with)
                atexit.register(self.coordination.close)  # a later job of the same name starts afresh
            except Exception as e:
                self._alone(e)
        self.last_wait = self.coordination.epoch_wait(self.last_wait,
                                                      self.epoch <= 2 and self.last_epoch_s < MAX_STRETCH_S)
        try:
            role = self.coordination.role(self.name, self.last_wait, self.epoch)
        except Exception as e:
            self._alone(e)
            return RankRole("alone")
        if role.role not in ("waiting", "follower") and self.role.role in ("waiting", "follower"):
            self.reason = ""
            if self.explorer is not None and self.ran is not None and self.ran != self.explorer.current:
                # Back to exploring after following another rank: from the setting it runs now.
                self.explorer = Explorer(self.ran)
                self.plan = None
        return role

    def _job_wait(self, own: float, seconds: float) -> float | None:
        """The data wait this rank plans with (a leader: its balanced ranks' longest,
        coordination.Ranks.job_wait); None until its peers' are on the board."""
        try:
            return self.coordination.job_wait(self.role, own, self.epoch, self.stretch_epoch,
                                              seconds >= MAX_STRETCH_S)
        except Exception as e:
            self._alone(e)
            return own

    def _epoch_wait(self) -> float | None:
        """The last epoch's data wait, then a new epoch's count begins."""
        seconds, waited, batches = self.epoch_s, self.epoch_wait_s, self.epoch_batches
        self.last_epoch_s = seconds
        self.epoch_s = self.epoch_wait_s = 0.0
        self.epoch_batches = 0
        return min(1.0, waited / seconds) if seconds > 0 and batches >= 8 else None

    def _hold(self, inner) -> None:
        """A rank that waits for another, or follows the leader: it does not explore; a
        follower runs the leader's setting. Its data wait is measured afresh each epoch."""
        role = self.role
        self.reason = f"waits for rank {role.peer}" if role.role == "waiting" else f"follows rank {role.peer}"
        self.mid_epoch = False
        if self.state == "settled":
            self.state = "measuring"  # its data wait is read every epoch: its role may change
        if role.role == "follower" and role.follow is not None and role.follow != self.ran:
            if not self.coordination.allows(role.follow):
                # A leader's setting this rank's own plan could not give (its CPUs, the tuner's
                # bounds): a peer on a bigger node, or an entry someone else wrote.
                self.reason = f"follows rank {role.peer} except {role.follow.label()}: past this rank's own bounds"
                if self.refused != role.follow:
                    self.refused = role.follow
                    log.warning("loadertop tune %s: %s", self.name, self.reason)
            else:
                log.info("loadertop tune %s: epoch %d: %s: follows rank %s", self.name, self.epoch,
                         self.ran.arrow(role.follow) if self.ran is not None else role.follow.label(), role.peer)
                with self._applying():
                    self._set(inner, role.follow)
        explorer = self.explorer
        if role.role == "waiting" and explorer is not None and explorer.trial is not None:
            # A trial no one will judge (the job waits for another rank): back to the kept one.
            explorer.drop_trial()
            with self._applying():
                self._set(inner, explorer.kept)
        self.durations = []
        self.wait_ns = 0
        self.readings = []
        self._publish()

    def _tell(self, inner) -> None:
        plan_from, plan = self.plan if self.plan is not None else (None, None)
        try:
            self.coordination.tell(self.epoch, self.last_wait, self._knobs(inner), plan_from, plan)
        except Exception as e:
            self._alone(e)

    def _alone(self, error: Exception) -> None:
        self.coordination = Alone()
        self.role = RankRole("alone")
        self.plan = None
        _warn_once(f"loadertop tune {self.name}: the ranks of this job cannot coordinate "
                   f"({type(error).__name__}: {error}); each rank tunes alone")

    def _go_back(self, loader) -> None:
        """Off: put the last setting measured good back, once."""
        target, self.pending = self.pending, None
        if target is None:
            return
        try:
            inner = innermost(loader)
            seed = L.base_seed(inner)
            self.ran, self.rng = self._knobs(inner), L.rng_states(inner)
            if L.apply(inner, target):
                self.restore = (inner, seed)
        except Exception as e:  # the loader stays as it is: the loop must go on
            log.warning("loadertop tune %s: could not go back to %s: %s", self.name, target.label(), e)

    # --- telling ------------------------------------------------------------------------

    def _record(self, d: Decision) -> None:
        d = replace(d, epoch=self.epoch, batch=self.batches, at=time.time())
        self.decisions.append(d)
        log.info("loadertop tune %s: %s", self.name, d.text())

    def as_dict(self) -> dict:
        explorer = self.explorer
        # What the loader runs (a follower runs its leader's setting, not its own explorer's).
        current = self._running() if isinstance(self.coordination, Ranks) else None
        current = current or (explorer.current if explorer else None)
        return {
            "state": self.state, "reason": self.reason, "epoch": self.epoch,
            "setting": current.as_dict() if current else None,
            "started_with": self.started_with.as_dict() if self.started_with else None,
            "steps_per_s": None if self.last_rate is None else round(self.last_rate, 3),
            "cost_s": round(self.cost_ns / 1e9, 4),
            "changes_s": round(self.apply_ns / 1e9, 4),
            "decisions": [d.as_dict() for d in self.decisions],
        }

    def _publish(self) -> None:
        try:
            self.publish(self.as_dict())
        except Exception:  # telling must never stop tuning, nor the loop
            log.debug("loadertop tune %s: could not publish", self.name, exc_info=True)

    @contextmanager
    def _timed(self):
        """Time spent measuring and deciding, counted once however the calls nest."""
        if self.timing:
            yield
            return
        self.timing = True
        t0 = self.clock()
        try:
            yield
        finally:
            self.timing = False
            self.cost_ns += self.clock() - t0

    @contextmanager
    def _applying(self):
        """Time a change takes (old workers shut down): the change's, not the deciding's."""
        t0 = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - t0
            self.apply_ns += spent
            self.cost_ns -= spent

    @contextmanager
    def _guarded(self):
        """Any error in the tuner turns it off with one warning; the loop goes on."""
        try:
            yield
        except Exception as e:
            self._off(str(e) if isinstance(e, TunerOff) else f"{type(e).__name__}: {e}")

    def _off(self, reason: str, running: Knobs | None = None) -> None:
        """Off with one warning, naming the setting the loader really has (`running`, where it
        is not the explorer's: a change that failed to start) and the one it goes back to."""
        if self.state == "off":
            return
        explorer = self.explorer
        keeps = explorer.kept if explorer else None
        now = running or self._running() or (explorer.current if explorer else None)
        if keeps is not None and now is not None and now != keeps:
            self.pending = keeps  # not measured good: back at the next boundary
        self.state, self.reason = "off", reason
        self._record(Decision("off", now, keeps, reason=reason))
        self._publish()
        text = f"loadertop tune {self.name}: off ({reason})"
        if now is not None and self.pending is not None and self.pending != now:
            text += f"; the loader runs {now.label()} until this epoch ends, then {self.pending.label()}"
        elif now is not None:
            text += f"; the loader keeps {now.label()}"
        _warn_once(text)

    def _knobs(self, inner) -> Knobs:
        return L.knobs_of(inner, self.threads)

    def _running(self) -> Knobs | None:
        """The setting the loader has now (its next iterator's, at a boundary)."""
        try:
            return self._knobs(innermost(self.loader)) if self.loader is not None else None
        except Exception:
            return None

    def _workers(self, loader, iterator) -> list[int]:
        """The workers of the loader being tuned: its iterator's, else this process's
        DataLoader workers (a framework built the iterator out of our sight)."""
        inner = innermost(loader) if loader is not None else None
        pids = self.workers_of(iterator) or self.workers_of(getattr(inner, "_iterator", None))
        if pids or not getattr(inner, "num_workers", 0):
            return pids
        children = procfs.children(os.getpid())
        named = [p for p in children if (st := procfs.read_stat(p)) is not None and st.comm == WORKER_COMM]
        return named or children


def _warn_once(text: str) -> None:
    """The one warning, never raised into the loop: with warnings as errors (`-W error`, a
    test suite's filters) it goes to the log instead."""
    try:
        warnings.warn(text, RuntimeWarning, stacklevel=5)
    except Exception:
        log.warning("%s", text)


def _settle(knobs: Knobs) -> int:
    """Batches to skip after a new setting starts: its workers' first batches, the queue filling."""
    return min(MAX_SETTLE_BATCHES, max(4, knobs.num_workers * (knobs.prefetch_factor or 1)))
