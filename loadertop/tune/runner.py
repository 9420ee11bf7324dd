"""Runs `loadertop tune`: each configuration in a fresh child process (tune/trial.py), watched
with the monitor's own probes, within a time budget; then the best few again, to tell real
differences from noise.

The child is started by file path with the user's interpreter, so loadertop's process never
imports torch or the user's code, and a factory that hangs or crashes only ends its trial.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
from statistics import fmean

from ..fields import context_switches
from ..model import Snapshot
from ..probes.gpu import GpuProbe
from ..probes.processes import ProcessSampler
from ..sampler import Sampler
from ..started import stop_job
from . import grid
from .grid import Config, Summary, Trial
from .result import Machine, TuneResult, TuneSpec
from .trial import TrialConfig

TRIAL_SCRIPT = os.path.join(os.path.dirname(__file__), "trial.py")
TICK_S = 0.5
REPEATS = 3  # the best few settings run once more
EXTENSIONS = 2  # times the default grid may double its most workers
OVERRUN = 1.5  # past this share of the budget (settings that hang until their timeout), stop
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 30.0


class FactoryError(Exception):
    """The user's factory cannot give a dataset: no configuration can run."""


class Progress:
    """What the view is told; the default says nothing."""

    def planned(self, configs: list[Config], machine: Machine, window_s: float) -> None: ...
    def started(self, config: Config, index: int, total: int, repeat: bool) -> None: ...
    def update(self, config: Config, rate: float | None, elapsed_s: float) -> None: ...
    def finished(self, trial: Trial, best: Summary | None) -> None: ...


class Tuner:
    def __init__(self, spec: TuneSpec, progress: Progress | None = None, machine: Machine | None = None) -> None:
        self.spec = spec
        self.progress = progress or Progress()
        self.machine = machine or Machine.read()
        self.gpu = GpuProbe()
        self.trials: dict[Config, list[Trial]] = {}
        self.loaded: dict = {}
        self.started_at = time.monotonic()
        self.startup_s = 3.0  # spawn, imports, factory: re-estimated after each trial
        self.skipped: list[Config] = []

    # --- the plan ---------------------------------------------------------------------

    def configs(self, pin: list[bool]) -> list[Config]:
        workers = self.spec.workers if self.spec.workers is not None else grid.default_workers(self.machine.cpu_share)
        return grid.grid(workers, self.spec.prefetch, pin)

    def _times(self, runs_left: int) -> tuple[float, float]:
        """(warm-up, window) for the next trial, from what is left of the budget."""
        left = self.spec.budget_s - (time.monotonic() - self.started_at)
        per = max(0.0, left) / max(1, runs_left)
        warmup = min(5.0, max(0.5, 0.15 * per))
        window = min(MAX_WINDOW_S, max(MIN_WINDOW_S, per - self.startup_s - warmup))
        return warmup, window

    def run(self) -> TuneResult:
        pin = {"on": [True], "off": [False]}.get(self.spec.pin_memory, [False])
        configs = self.configs(pin)
        stopped = False
        _, window = self._times(len(configs) + REPEATS)
        self.progress.planned(configs, self.machine, window)
        try:
            queue_ = list(configs)
            i = 0
            while queue_:
                if time.monotonic() - self.started_at > OVERRUN * self.spec.budget_s:
                    self.skipped = list(queue_)  # hanging settings ate the budget: say so, stop
                    break
                config = queue_.pop(0)
                self._run_one(config, i, len(configs), len(queue_) + 1 + REPEATS, repeat=False)
                i += 1
                pinned = any(c.pin_memory for c in configs)
                if self.spec.pin_memory == "auto" and self.loaded.get("cuda") and not pinned:
                    # A GPU: pinning is worth measuring; add the pinned settings.
                    more = [c for c in self.configs([True]) if c.num_workers > 0]
                    configs += more
                    queue_ += more
            # With the default grid, follow a curve still climbing at its edge (I/O-bound
            # loaders): twice the workers, up to twice, while the budget lasts.
            for _ in range(EXTENSIONS if self.spec.workers is None else 0):
                wider = self._extension()
                if wider is None or time.monotonic() - self.started_at > 0.85 * self.spec.budget_s:
                    break
                configs.append(wider)
                self._run_one(wider, i, len(configs), 1 + REPEATS, repeat=False)
                i += 1
            candidates = self._repeat_candidates()
            for j, config in enumerate(candidates):
                if time.monotonic() - self.started_at > self.spec.budget_s:
                    break
                self._run_one(config, i, len(configs) + len(candidates), len(candidates) - j, repeat=True)
                i += 1
        except KeyboardInterrupt:
            stopped = True
        return self._result(stopped)

    def _extension(self) -> Config | None:
        best = grid.still_climbing(self._summaries())
        if best is None or 2 * best.config.num_workers > grid.MAX_WORKERS:
            return None
        return Config(2 * best.config.num_workers, best.config.prefetch_factor, best.config.pin_memory)

    def _repeat_candidates(self) -> list[Config]:
        summaries = self._summaries()
        ranked = sorted(grid.usable(summaries), key=lambda s: -grid.rate_of(s))
        candidates = [s.config for s in ranked[:REPEATS]]
        rec = grid.recommend(summaries, self.machine.cpu_share)
        if rec is not None and rec.chosen.config not in candidates:
            candidates[-1:] = [rec.chosen.config]  # the pick itself must be measured twice
        return candidates

    def _summaries(self) -> list[Summary]:
        return [grid.summarize(c, ts, self.machine.memory_available) for c, ts in sorted(self.trials.items())]

    def _best(self) -> Summary | None:
        return grid.fastest(self._summaries())

    def _run_one(self, config: Config, index: int, total: int, runs_left: int, repeat: bool) -> None:
        warmup, window = self._times(runs_left)
        self.progress.started(config, index, total, repeat)
        trial = Trial(config)
        self.trials.setdefault(config, []).append(trial)
        try:
            self._measure(trial, warmup, window)
        except FactoryError:
            self.trials[config].remove(trial)  # nothing of this setting was measured
            raise
        self.progress.finished(trial, self._best())

    # --- one trial ----------------------------------------------------------------------

    def _child_config(self, config: Config, warmup: float, window: float) -> TrialConfig:
        return {
            "factory": self.spec.factory, "collate": self.spec.collate, "batch_size": self.spec.batch_size,
            "num_workers": config.num_workers, "prefetch_factor": config.prefetch_factor,
            "pin_memory": config.pin_memory, "per_step_ms": self.spec.per_step_ms,
            "warmup_s": warmup, "window_s": window,
        }

    def _measure(self, trial: Trial, warmup: float, window: float) -> None:
        run = TrialRun(self, trial, warmup, window)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
        proc = subprocess.Popen(
            [self.spec.python, TRIAL_SCRIPT, json.dumps(self._child_config(trial.config, warmup, window))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=self.spec.cwd,
            start_new_session=True,  # its own group: Ctrl-C reaches loadertop, which ends the trial
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        events: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, events), daemon=True)
        reader.start()
        stderr_watch = _StderrWatch(stderr)
        sampler = None
        try:
            sampler = Sampler([proc.pid], interval_s=TICK_S, gpu=self.gpu,
                              processes=ProcessSampler(slow_interval_s=2.0, slow_budget_s=0.02))
            while not run.done:
                run.on_snapshot(sampler.tick())
                end = time.monotonic() + TICK_S
                while time.monotonic() < end and not run.done:
                    try:
                        event = events.get(timeout=max(0.0, end - time.monotonic()))
                    except queue.Empty:
                        break
                    if event is None:  # the child's stdout closed: it exited
                        run.error = self._death(proc, stderr)
                        break
                    run.on_event(event)
                if not run.done:
                    # A worker whose batch does not fit in /dev/shm loses it in its queue's feeder
                    # thread (a traceback on stderr) and torch then waits for it forever: end now.
                    lost = stderr_watch.shm_full()
                    if lost:
                        run.error = (f"/dev/shm is full: a worker could not hand over a batch ({lost}); "
                                     "torch waits for it")
                if not run.done:
                    run.error = run.timeout_error(time.monotonic())
            if run.result is not None:
                run.in_window.append(sampler.tick(complete=True))  # USS/PSS of every process, at the end
        except KeyboardInterrupt:
            trial.stopped = True
            trial.error = "stopped (Ctrl-C)"
            raise
        finally:
            if sampler is not None:
                sampler.close()
            _end(proc, graceful=run.result is not None)
            stderr.close()
        if run.result is None:
            trial.error = run.error or "the trial ended without a result"
            return
        self._fill(trial, run.result, run.in_window)

    def _any_measured(self) -> bool:
        return any(t.rate is not None for ts in self.trials.values() for t in ts)

    def _rate(self, samples: int, batches: int, seconds: float) -> float | None:
        if seconds <= 0:
            return None
        return (batches if self.spec.per_step_ms else samples) / seconds

    def _error(self, event: dict) -> str:
        where = event.get("where") or []
        message = event.get("message", "failed")
        if "shared memory" in message or "No space left on device" in message:
            message = f"/dev/shm is full: {_without_segment(message)}"
        text = message[:200] + (f" (at {where[-1]})" if where else "")
        if event.get("stage") in ("import", "factory") and not self._any_measured():
            raise FactoryError(f"{self.spec.factory}: {text}")
        return text

    def _death(self, proc: subprocess.Popen, stderr) -> str:
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the trial stopped talking"
        stderr.seek(0)
        tail = [ln for ln in stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        if code == -signal.SIGBUS:
            how += ": a Bus error, /dev/shm is full"
        last = f": {tail[-1].strip()[:200]}" if tail else ""
        if not self.loaded and tail and "No module named 'torch'" in "\n".join(tail):
            raise FactoryError(f"torch is not installed for {self.spec.python} (use --python)")
        return f"the trial process died ({how}){last}"

    def _fill(self, trial: Trial, result: dict, snaps) -> None:
        window = result["window_s"]
        trial.batches_per_s = result["batches"] / window if window else None
        trial.samples_per_s = result["samples"] / window if window else None
        trial.rate = trial.batches_per_s if self.spec.per_step_ms else trial.samples_per_s
        # Without a step to emulate, the loop does nothing but wait: a share only means
        # something next to a step.
        trial.data_wait = result["wait_s"] / window if window and self.spec.per_step_ms else None
        pick = 1 if self.spec.per_step_ms else 2
        trial.chunk_rates = [c[pick] / c[0] for c in result["chunks"] if c[0] > 0]
        trainers = [t for s in snaps for t in s.trainers]
        worker_cpu = [w.cpu_percent for t in trainers for w in t.workers if w.cpu_percent is not None]
        trial.worker_cpu_percent = fmean(worker_cpu) if worker_cpu else None
        main_cpu = [t.main.cpu_percent for t in trainers if t.main.cpu_percent is not None]
        trial.main_cpu_percent = fmean(main_cpu) if main_cpu else None
        busy = [w.busy_threads for t in trainers for w in t.workers if w.busy_threads is not None]
        trial.busy_threads_per_worker = fmean(busy) if busy else None
        switches = []
        for t in trainers:
            rates = [r for r in map(context_switches, (t.main, *t.workers)) if r is not None]
            if rates:
                switches.append(sum(rates))
        trial.ctx_switches_per_s = fmean(switches) if switches else None
        rss = [sum(p.rss_bytes or 0 for p in (t.main, *t.workers)) for t in trainers]
        trial.rss_bytes = max(rss) if rss else None
        if trainers:
            last = trainers[-1]
            procs = (last.main, *last.workers)
            if all(p.pss_bytes is not None for p in procs):
                trial.pss_bytes = sum(p.pss_bytes for p in procs)
                trial.uss_bytes = sum(p.uss_bytes or 0 for p in procs)
        shm = [t.shm for t in trainers if t.shm is not None]
        used = [s.torch_bytes if s.torch_bytes is not None else s.used_bytes for s in shm]
        used = [u for u in used if u is not None]
        trial.shm_peak_bytes = max(used) if used else None
        trial.shm_total_bytes = next((s.total_bytes for s in shm if s.total_bytes), None)

    def _result(self, stopped: bool) -> TuneResult:
        summaries = self._summaries()
        return TuneResult(
            spec=self.spec, machine=self.machine, summaries=summaries,
            recommendation=grid.recommend(summaries, self.machine.cpu_share),
            batch_size=self.loaded.get("batch_size"), dataset=self.loaded.get("dataset"),
            extra_kwargs=tuple(self.loaded.get("kwargs") or ()), cuda=bool(self.loaded.get("cuda")),
            elapsed_s=time.monotonic() - self.started_at, stopped=stopped, skipped=tuple(self.skipped),
            metric=self.spec.metric,
        )

    def close(self) -> None:
        self.gpu.close()


class TrialRun:
    """One trial's child as it reports: the events it sent, the snapshots of its measured
    window, the peak of /dev/shm, and what ended it (a result or an error)."""

    def __init__(self, tuner: Tuner, trial: Trial, warmup: float, window: float) -> None:
        self.tuner = tuner
        self.trial = trial
        self.warmup = warmup
        self.window = window
        self.spawned = time.monotonic()
        self.deadline = self.spawned + tuner.spec.first_batch_timeout_s
        self.first_batch_at: float | None = None
        self.window_started: float | None = None
        self.in_window: list[Snapshot] = []
        self.shm_peak: tuple[int, int | None] = (0, None)  # (used, total) over the whole trial
        self.result: dict | None = None
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def on_snapshot(self, snap: Snapshot) -> None:
        for t in snap.trainers:
            if t.shm is not None and t.shm.used_bytes is not None:
                self.shm_peak = max(self.shm_peak, (t.shm.used_bytes, t.shm.total_bytes), key=lambda u: u[0])
        if self.window_started is not None:
            self.in_window.append(snap)

    def on_event(self, event: dict) -> None:
        """One line from the child (tune/trial.py)."""
        tuner, kind = self.tuner, event.get("event")
        if kind == "loaded":
            tuner.loaded = event
            self.deadline = time.monotonic() + tuner.spec.first_batch_timeout_s  # now the loader's turn
        elif kind == "first_batch":
            self.first_batch_at = time.monotonic()
            self.trial.first_batch_s = event["s"]
            self.deadline = self.first_batch_at + self.warmup + self.window + 30
        elif kind == "window":
            self.window_started = time.monotonic()
            tuner.startup_s = max(0.5, self.window_started - self.spawned - self.warmup)
        elif kind == "progress":
            rate = tuner._rate(event["samples"], event["batches"], event["elapsed"])
            tuner.progress.update(self.trial.config, rate, event["elapsed"])
        elif kind == "result":
            self.result = event
        elif kind == "error":
            self.error = tuner._error(event)

    def timeout_error(self, now: float) -> str | None:
        """Why the trial is over its deadline, or None while it is not. A factory that never
        returned, with nothing measured yet, ends the whole tune (FactoryError)."""
        if now <= self.deadline:
            return None
        what = "no first batch" if self.first_batch_at is None else "the window did not end"
        limit = self.tuner.spec.first_batch_timeout_s if self.first_batch_at is None else self.window + 30
        error = f"{what} within {limit:.0f} s: the dataset or a worker hangs"
        used, total = self.shm_peak
        if total and used >= grid.SHM_LIMIT * total:
            # torch's loader blocks, not crashes, when its shared memory runs out
            error = (f"{what} within {limit:.0f} s with /dev/shm full ({used / 2**20:.0f} of "
                     f"{total / 2**20:.0f} MiB): the batches in flight do not fit")
        if not self.tuner.loaded and not self.tuner._any_measured():
            raise FactoryError(f"the factory {self.tuner.spec.factory} did not return within "
                               f"{limit:.0f} s (a hang while importing or building the dataset)")
        return error


def _read_lines(stream, events: queue.Queue) -> None:
    for raw in stream:
        try:
            event = json.loads(raw)
        except ValueError:
            continue  # the user's own prints
        if isinstance(event, dict) and "event" in event:
            events.put(event)
    events.put(None)


SHM_FULL = re.compile(rb"^\w*Error: (unable to allocate shared memory|.*No space left on device).*", re.M)


class _StderrWatch:
    """Reads what a running trial adds to its stderr file, without moving the offset the
    trial writes at (the file description is shared with it)."""

    def __init__(self, file) -> None:
        self.fd = file.fileno()
        self.seen = 0

    def shm_full(self) -> str | None:
        """The error line of a worker's failed hand-over through /dev/shm, once printed."""
        size = os.fstat(self.fd).st_size
        if size <= self.seen:
            return None
        start = max(0, self.seen - 512)  # a line cut by the last read is read whole
        text = os.pread(self.fd, size - start, start)
        self.seen = size
        found = SHM_FULL.search(text)
        if found is None:
            return None
        return _without_segment(found.group(0).decode(errors="replace"))[:200]


def _without_segment(message: str) -> str:
    """torch names the /dev/shm segment it could not create: the size of /dev/shm is the news."""
    return re.sub(r" for file <[^>]*>", "", message)


def _end(proc: subprocess.Popen, graceful: bool) -> None:
    """Let a finished trial exit, then make sure it and its workers are gone."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    if graceful:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    stop_job(proc)  # workers left behind, or a hung trial
    if proc.stdout:
        proc.stdout.close()
