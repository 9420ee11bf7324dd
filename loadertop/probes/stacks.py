"""Stack sampling with py-spy: data wait of each trainer's main thread, what each worker is
doing, and the DataLoader arguments of each worker, all from outside the process (what the
output means: pyspy.py).

py-spy runs as a subprocess with fixed arguments and timeouts, on its own thread and
cadence: `record --format raw --idle --nonblocking --threads` on each trainer in windows,
and `dump --json [--locals]` on one worker at a time. The tick only reads the latest
results (`StackSampler` implements the sampler's StackSource) and never waits for py-spy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .. import notices as N
from ..model import DataWait, Notice
from . import procfs
from .pyspy import MAIN, SUBCOUNTS, WAIT, WorkerInfo, data_wait_from_counts, parse_dump, parse_raw

# --- py-spy, its errors and their fixes ----------------------------------------------


def find_pyspy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def _ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def error_notice(stderr: str, pid: int) -> Notice:
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text or "eperm" in text:
        scope = _ptrace_scope()
        if os.geteuid() != 0:
            why = "ptrace refused: the trainer runs as another user" if procfs.owner_uid(pid) != os.geteuid() else (
                f"ptrace refused (kernel.yama.ptrace_scope={scope})" if scope else "ptrace refused"
            )
            fix = "run loadertop as the trainer's user, or as root (sudo)"
            if scope:
                fix += f"; ptrace_scope={scope} also needs root or `sysctl kernel.yama.ptrace_scope=0`"
        else:
            why = "ptrace refused even as root"
            fix = (
                "the container lacks CAP_SYS_PTRACE: run it with `--cap-add SYS_PTRACE` (Docker) or "
                "securityContext.capabilities.add: [SYS_PTRACE] (Kubernetes)"
            )
            if scope == 3:
                fix = "kernel.yama.ptrace_scope=3 forbids ptrace until reboot; boot with a lower value"
        return Notice(N.DATA_WAIT_PTRACE, f"data wait of trainer {pid} unavailable: {why}", fix, pid)
    if "python version" in text or "failed to find python" in text or "unsupported" in text:
        return Notice(
            N.DATA_WAIT_UNSUPPORTED,
            f"py-spy cannot read the Python of trainer {pid}: {stderr.strip().splitlines()[-1][:160]}",
            "upgrade py-spy (pip install -U py-spy) to one that supports this Python",
            pid,
        )
    last = stderr.strip().splitlines()[-1][:160] if stderr.strip() else "no output"
    return Notice(N.DATA_WAIT_ERROR, f"py-spy failed on trainer {pid}: {last}", None, pid)


NO_PYSPY = Notice(
    N.DATA_WAIT_NO_PYSPY,
    "data wait unavailable: the py-spy binary was not found",
    "pip install py-spy (it ships the binary), or put py-spy on PATH",
)


# --- the sampler thread ---------------------------------------------------------------


@dataclass
class _Window:
    started: float
    ended: float
    counts: dict[str, int]
    first_look: bool = False  # a trainer's short first window


@dataclass
class _Recording:
    proc: subprocess.Popen
    started: float  # epoch seconds: the window's place in time
    output: str
    errors: str
    started_mono: float  # for the hang timeout
    identity: float | None = None  # the trainer's start time when the window began
    window_s: int = 0  # its length
    first_look: bool = False


DUMP_GAP_S = 1.0  # saved-up dumps run at most this often
DUMP_TIMEOUT_S = 5.0  # one dump may take this long (py-spy reads a busy host's process slowly)


@dataclass(frozen=True)
class Profile:
    """How often py-spy looks, for one way of running loadertop. py-spy pays per sample
    (each reads every thread's stack) and per dump; what each profile costs is measured in
    docs/BENCHMARKS.md (§3 the live view, §3b the exporter)."""

    window_s: int  # one `py-spy record` window
    gap_s: float = 0.0  # pause between a trainer's windows (a duty cycle)
    rolling_s: float = 30.0  # data wait is read over the windows of this span
    dump_interval_s: float = 1.0  # one worker dump per this, in turn
    dump_burst: int = 1  # dumps saved up for workers found at once (attach, a new loader)
    refresh_doing: bool = True  # dump each worker again for what it is doing, or only once
    rate_hz: int = 10  # py-spy's samples a second within a window
    # One window at a time across the trainers, each trainer's gap grown with their number: what
    # py-spy costs stays that of one trainer's duty cycle however many there are (the node agent).
    spread: bool = False
    # A trainer's first window: this long, at first_rate_hz, then a full window at once (no gap)
    # that confirms it. 0: the first window is a full one. Its data wait is marked first_look.
    first_look_s: int = 0
    first_rate_hz: int = 50


# The live view: one 10 s window every 40 s (data wait over the last two: 200 samples), one
# worker dump every 40 s once the burst has read the workers found on attach. Every 30 s cost
# 0.15 % of a core more, which the 1.2 % budget of docs/BENCHMARKS.md §3 has no room for;
# 5 Hz windows cost as little but halve the samples data wait is read from. The rules read the
# dumps too (a worker waiting for indices), so they are not made rarer still.
# A new user decides in the first seconds whether the tool works: the first look at a trainer
# is 3 s at 50 Hz (150 samples: a 80 % wait within ±7 points at two standard errors), shown as
# provisional until the full window after it confirms it.
LIVE = Profile(window_s=10, gap_s=30.0, rolling_s=50.0, dump_interval_s=40.0, dump_burst=16, first_look_s=3)
# A recording is replayed tick by tick: back-to-back windows, a worker dump every 10 s.
RECORDING = Profile(window_s=10, rolling_s=30.0, dump_interval_s=10.0)
# A dashboard needs the trend, not every second: a 10 s window a minute; each worker is
# dumped once, for its worker_id label (no metric shows what it is doing).
EXPORTER = Profile(window_s=10, gap_s=50.0, rolling_s=120.0, dump_interval_s=2.0, refresh_doing=False, spread=True)


def snapshot_profile(duration_s: float) -> Profile:
    """A snapshot: one window spans it all, so that data wait covers the same time. A report
    is acted on, and data wait is a share of samples (binomial: one standard error is 1.4
    points at 1000 of them for a 75% wait, 4.8 at 80): a short snapshot samples faster, up
    to 50 Hz, for ~1000."""
    rate = max(10, min(50, round(SNAPSHOT_SAMPLES / max(1.0, duration_s))))
    return Profile(window_s=max(1, int(duration_s)), rolling_s=duration_s + 60, rate_hz=rate)


SNAPSHOT_SAMPLES = 1000


class StackSampler:
    """Runs py-spy windows on each watched trainer and dumps workers, on its own thread."""

    @classmethod
    def of(cls, profile: Profile, **kw: Any) -> StackSampler:
        return cls(window_s=profile.window_s, gap_s=profile.gap_s, rolling_s=profile.rolling_s,
                   dump_interval_s=profile.dump_interval_s, dump_burst=profile.dump_burst,
                   refresh_doing=profile.refresh_doing, rate_hz=profile.rate_hz, spread=profile.spread,
                   first_look_s=profile.first_look_s, first_rate_hz=profile.first_rate_hz, **kw)

    def __init__(
        self,
        window_s: int = 5,
        rate_hz: int = 10,
        rolling_s: float = 30.0,
        dump_interval_s: float = 1.0,
        stall_fraction: float = 1.0,
        pyspy: str | None = None,
        gap_s: float = 0.0,
        refresh_doing: bool = True,
        dump_burst: int = 1,
        spread: bool = False,
        first_look_s: int = 0,
        first_rate_hz: int = 50,
    ) -> None:
        """gap_s: pause between a trainer's windows (duty cycle), to sample less often.
        Worker dumps run on a credit: one earned every dump_interval_s, at most dump_burst
        saved up and spent a second apart, so the workers found on attach (or when a loader
        starts) get their arguments within seconds while the steady rate stays low.
        refresh_doing=False dumps each worker once (its arguments), not again for its frame."""
        self.window_s = max(1, int(window_s))
        self.first_look_s = max(0, min(int(first_look_s), self.window_s))
        self.first_rate_hz = first_rate_hz
        self.gap_s = gap_s
        self.spread = spread
        self._spread_next = 0.0  # spread: no window of a trainer seen before starts before this
        self.refresh_doing = refresh_doing
        self.rate_hz = rate_hz
        self.rolling_s = rolling_s
        self.dump_interval_s = dump_interval_s
        self.dump_burst = max(1, dump_burst)
        self.stall_fraction = stall_fraction
        self.pyspy = pyspy or find_pyspy()
        self._lock = threading.Lock()
        self._targets: dict[int, tuple[int, ...]] = {}
        self._recordings: dict[int, _Recording] = {}
        self._windows: dict[int, deque[_Window]] = {}
        self._stalled: dict[int, float] = {}
        self._stall_since: dict[int, float] = {}  # epoch start of the current run of stalled windows
        self._workers: dict[int, WorkerInfo] = {}
        self._dumped_at: dict[int, float] = {}
        self._timed_out: set[int] = set()  # workers whose last dump ran out of time: one retry free
        self._notices: dict[tuple[str, int | None], Notice] = {}
        self._refused_until: dict[int, float] = {}
        self._next_start: dict[int, float] = {}
        # Each watched pid's start time: py-spy is pointed at a pid, and a pid may be reused
        # by an unrelated process (as root, py-spy would read it): checked before and after.
        self._identity: dict[int, float] = {}
        # Children that may be workers of a loader that does not name them: dumped once to
        # tell. pid -> (is a worker, when it was told, monotonic).
        self._candidates: tuple[int, ...] = ()
        self._told: dict[int, tuple[bool, float]] = {}
        self._broken_until = 0.0  # py-spy could not even start: retried after a while
        self._tmp = tempfile.mkdtemp(prefix="loadertop-stacks-")
        self._accepting = True
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadertop-stacks", daemon=True)
        self._thread.start()

    # StackSource, called from the tick: only reads what the thread has produced.

    def watch(self, trainers: dict[int, tuple[int, ...]], started: dict[int, float] | None = None,
              candidates: Iterable[int] = ()) -> None:
        """Sample these trainers and dump these workers; `started`: each pid's start time
        (epoch seconds) as the caller saw it, read from /proc where not given. `candidates`:
        processes to dump to tell whether they are DataLoader workers (see loader_worker)."""
        started = started or {}
        candidates = tuple(sorted(set(candidates)))
        with self._lock:
            changed = trainers != self._targets or candidates != self._candidates
            self._targets = dict(trainers)
            self._candidates = candidates
            workers = {w for ws in trainers.values() for w in ws}
            for gone in [p for p in self._told if p not in workers and p not in candidates]:
                del self._told[gone]
            for pid in {*trainers, *workers, *candidates}:
                ident = started.get(pid)
                if ident is None and pid not in self._identity:
                    st = procfs.read_stat(pid)
                    ident = st.started_at if st is not None else None
                if ident is not None and self._identity.get(pid) != ident:
                    if pid in self._identity:
                        self._forget_pid(pid)  # the pid is another process now
                    self._identity[pid] = ident
        if changed:
            self._wake.set()  # a new trainer or worker: the thread looks now, not at its next wake

    def _forget_pid(self, pid: int) -> None:
        """What was read of an earlier process with this pid (hold the lock)."""
        self._windows.pop(pid, None)
        self._stalled.pop(pid, None)
        self._stall_since.pop(pid, None)
        self._workers.pop(pid, None)
        self._dumped_at.pop(pid, None)
        self._told.pop(pid, None)

    def _same(self, pid: int, ident: float | None) -> bool:
        """pid is still the process we were asked to watch."""
        st = procfs.read_stat(pid)
        return st is not None and ident is not None and abs(st.started_at - ident) < 0.05

    def data_wait(self, trainer_pid: int) -> DataWait | None:
        with self._lock:
            windows = list(self._windows.get(trainer_pid, ()))
            stalled = self._stalled.get(trainer_pid, 0.0)
        if not windows:
            return None
        end = windows[-1].ended
        recent = [w for w in windows if w.ended >= end - self.rolling_s - 1e-6]
        counts: dict[str, int] = {}
        for w in recent:
            for k, v in w.counts.items():
                counts[k] = counts.get(k, 0) + v
        dw = data_wait_from_counts(counts, end - recent[0].started, stalled)
        if all(w.first_look for w in recent):
            dw = replace(dw, first_look=True)
        return dw if dw.samples else None

    def windows(self, trainer_pid: int) -> list[tuple[float, float, DataWait]]:
        """Each completed window: (start, end, its data wait), for history and tests."""
        with self._lock:
            windows = list(self._windows.get(trainer_pid, ()))
        return [(w.started, w.ended, data_wait_from_counts(w.counts, w.ended - w.started, 0.0))
                for w in windows]

    def worker(self, pid: int) -> WorkerInfo | None:
        with self._lock:
            return self._workers.get(pid)

    def loader_worker(self, pid: int) -> bool | None:
        """Whether a dump of this candidate showed a DataLoader worker loop; None: not yet told."""
        with self._lock:
            told = self._told.get(pid)
        return told[0] if told is not None else None

    def notices(self) -> tuple[Notice, ...]:
        with self._lock:
            return tuple(self._notices.values())

    def flush(self, timeout: float) -> None:
        """Wait until the running windows of the watched trainers have been read."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                busy = bool(self._recordings)
            if not busy:
                return
            time.sleep(0.05)

    def stop_after_window(self) -> None:
        """Start no new window; running ones finish (a report's last window)."""
        with self._lock:
            self._accepting = False

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        with self._lock:
            for rec in self._recordings.values():
                _kill(rec.proc)
            self._recordings.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)

    # The thread.

    def _run(self) -> None:
        if self.pyspy is None:
            with self._lock:
                self._notices[(NO_PYSPY.id, None)] = NO_PYSPY
            return
        while not self._stop.is_set():
            try:
                self._loop()
            except Exception as e:  # noqa: BLE001 (the stack thread must outlive anything)
                with self._lock:
                    self._notices[(N.DATA_WAIT_ERROR, None)] = Notice(
                        N.DATA_WAIT_ERROR, f"stack sampling failed ({type(e).__name__}: {e}); retrying", None)
                self._stop.wait(1.0)

    def _loop(self) -> None:
        last_dump = last_loop = time.monotonic() - DUMP_GAP_S
        credit = float(self.dump_burst)
        while not self._stop.is_set():
            with self._lock:
                targets = dict(self._targets)
                accepting = self._accepting
            now = time.monotonic()
            order = list(targets) if accepting and now >= self._broken_until else []
            if self.spread:
                # The most overdue first (a new trainer's first window before all), one at a time.
                order.sort(key=lambda p: (p in self._windows, self._next_start.get(p, 0.0)))
            for pid in order:
                due = max(self._refused_until.get(pid, 0.0), self._next_start.get(pid, 0.0))
                if self.spread and self._recordings:
                    break  # one window at a time: the next trainer's starts when this one ends
                if self.spread and pid in self._windows and now < self._spread_next:
                    continue  # one window a duty cycle for them all; a new trainer's first one at once
                if pid not in self._recordings and now >= due:
                    self._start_recording(pid)
            for pid, rec in list(self._recordings.items()):
                if rec.proc.poll() is not None:
                    self._finish_recording(pid, rec)
                elif now - rec.started_mono > rec.window_s + 10:
                    _kill(rec.proc)  # a hung py-spy: give up this window, keep going
                    self._finish_recording(pid, rec, timed_out=True)
            credit = min(self.dump_burst, credit + (now - last_loop) / self.dump_interval_s)
            last_loop = now
            gap = min(DUMP_GAP_S, self.dump_interval_s)
            nothing_to_dump = False
            if credit >= 1.0 - 1e-9 and now - last_dump >= gap and now >= self._broken_until:
                worker = self._next_worker(targets)
                if worker is None:
                    nothing_to_dump = True  # until watch() brings a new worker, and wakes us
                else:
                    if self._dump(worker, now) or worker in self._timed_out:
                        credit -= 1.0
                    else:
                        # A dump that ran out of time (py-spy on a busy host) is tried once more
                        # on the same credit: spent, it left a worker unread for a whole
                        # dump_interval_s (600 s in a test beside a CPU hog).
                        self._timed_out.add(worker)
                    last_dump = now
            # Sleep until something is due (a window ends or starts, a dump's credit) rather
            # than polling: each wake-up takes the GIL from the UI.
            wake = [] if nothing_to_dump else [last_dump + max(gap, (1.0 - credit) * self.dump_interval_s)]
            wake += [rec.started_mono + rec.window_s for rec in self._recordings.values()]
            if accepting:
                wake += [max(self._refused_until.get(p, 0.0), self._next_start.get(p, 0.0))
                         for p in targets if p not in self._recordings]
            # py-spy exits just after its window: look again a fifth of a second apart then.
            delay = min(5.0, max(0.2, min(wake, default=now + 5.0) - time.monotonic()))
            self._wake.wait(delay)
            self._wake.clear()

    def _cannot_run(self, e: OSError) -> None:
        """py-spy itself will not start (a broken install, a binary for another machine)."""
        self._broken_until = time.monotonic() + 60
        with self._lock:
            self._notices[(N.DATA_WAIT_NO_PYSPY, None)] = Notice(
                N.DATA_WAIT_NO_PYSPY, f"py-spy at {self.pyspy} cannot run: {e.strerror or e}",
                "reinstall it: pip install --force-reinstall py-spy")

    def _start_recording(self, pid: int) -> None:
        pyspy = self.pyspy
        if pyspy is None:
            return
        with self._lock:
            ident = self._identity.get(pid)
        if not self._same(pid, ident):
            self._next_start[pid] = time.monotonic() + 1.0  # gone, or not ours: the tick will tell
            return
        output = os.path.join(self._tmp, f"{pid}-{time.monotonic_ns()}.txt")
        errors = output + ".err"
        first = bool(self.first_look_s) and pid not in self._windows
        window, rate = (self.first_look_s, self.first_rate_hz) if first else (self.window_s, self.rate_hz)
        with open(errors, "w") as err:
            try:
                proc = subprocess.Popen(
                    # Full file names: a frame is recognised by its package path wherever the job's
                    # files are (py-spy shortens them relative to the target's sys.path, and a
                    # chrooted job's came out bare).
                    [pyspy, "record", "--format", "raw", "--idle", "--nonblocking", "--threads", "--full-filenames",
                     "--rate", str(rate), "--duration", str(window),
                     "--pid", str(pid), "--output", output],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                )
            except OSError as e:
                self._cannot_run(e)
                return
        with self._lock:
            self._recordings[pid] = _Recording(proc, time.time(), output, errors, time.monotonic(), ident,
                                               window_s=window, first_look=first)

    def _finish_recording(self, pid: int, rec: _Recording, timed_out: bool = False) -> None:
        ended = time.time()
        text = _read_text(rec.output)
        stderr = _read_text(rec.errors)
        for path in (rec.output, rec.errors):
            try:
                os.unlink(path)
            except OSError:
                pass
        counts = parse_raw(text, pid) if text else {}
        if counts and not self._same(pid, rec.identity):
            counts = {}  # the pid was reused during the window: not our trainer's samples
        if self.spread:  # the next window of any trainer, one duty cycle on
            self._spread_next = time.monotonic() + self.gap_s
        # After a first look, the full window that confirms it at once.
        self._next_start[pid] = time.monotonic() + (0.0 if rec.first_look and counts else self.gap_s)
        with self._lock:
            self._recordings.pop(pid, None)
            if timed_out:
                self._notices[(N.DATA_WAIT_TIMEOUT, pid)] = Notice(
                    N.DATA_WAIT_TIMEOUT,
                    f"py-spy did not finish a {rec.window_s}s window on trainer {pid}; retrying",
                    None,
                    pid,
                )
            if counts:
                self._notices = {k: v for k, v in self._notices.items() if k[1] != pid}
                windows = self._windows.setdefault(pid, deque(maxlen=max(2, int(600 / self.window_s))))
                windows.append(_Window(rec.started, ended, counts, rec.first_look))
                total = sum(v for k, v in counts.items() if k not in SUBCOUNTS)
                waiting = counts.get(WAIT, 0) + counts.get(MAIN, 0)
                # Stalled: every sample of the window inside next(). A loop that waits 97%
                # still receives batches: its few samples elsewhere are its steps.
                if waiting >= self.stall_fraction * total:
                    # From the start of the first of consecutive stalled windows: a loop that
                    # waited all through two windows waited in the gap between them too.
                    since = self._stall_since.setdefault(pid, rec.started)
                    self._stalled[pid] = ended - since
                else:
                    self._stall_since.pop(pid, None)
                    self._stalled[pid] = 0.0
            elif rec.proc.returncode not in (0, None) and os.path.exists(f"/proc/{pid}"):
                notice = error_notice(stderr, pid)
                self._notices[(notice.id, pid)] = notice
                if notice.id == N.DATA_WAIT_PTRACE:
                    self._refused_until[pid] = time.monotonic() + 60

    def _next_worker(self, targets: dict[int, tuple[int, ...]]) -> int | None:
        """Candidates not yet told first (a loader's workers cannot be shown before), then new
        workers (their arguments), then the one whose stack is the oldest."""
        workers = [w for ws in targets.values() for w in ws]
        now = time.monotonic()
        with self._lock:
            live = set(workers)
            for gone in [p for p in self._workers if p not in live]:
                del self._workers[gone]
                self._dumped_at.pop(gone, None)
            self._timed_out &= live
            refused = {p for p, until in self._refused_until.items() if now < until}
            # A "no" is asked again later: a spawned worker is not in its loop until it has
            # unpickled its dataset, and a process may start a loader later on.
            untold = [p for p in self._candidates if p not in self._told
                      or (not self._told[p][0] and now - self._told[p][1] >= self._retell_after(p))]
            if untold:  # the longest untold first
                return min(untold, key=lambda p: self._told.get(p, (False, float("-inf")))[1])
        owners = {w: t for t, ws in targets.items() for w in ws}
        candidates = [w for w in workers if owners[w] not in refused
                      and (self.refresh_doing or w not in self._dumped_at)]
        if not candidates:
            return None
        return min(candidates, key=lambda w: self._dumped_at.get(w, float("-inf")))

    def _retell_after(self, pid: int) -> float:
        """Seconds before a candidate that was no worker is dumped again (hold the lock)."""
        young = time.time() - self._identity.get(pid, 0.0) < YOUNG_S
        return RETELL_YOUNG_S if young else RETELL_S

    def _dump(self, pid: int, now: float) -> bool:
        """Dump one process's stack; False only where py-spy ran out of time."""
        pyspy = self.pyspy
        if pyspy is None:
            return True
        self._dumped_at[pid] = now
        with self._lock:
            known = self._workers.get(pid)
            ident = self._identity.get(pid)
        if not self._same(pid, ident):
            return True
        args = [pyspy, "dump", "--json", "--nonblocking", "--pid", str(pid)]
        if known is None or known.worker_id is None:
            args.insert(3, "--locals")
        try:
            out = subprocess.run(args, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S,
                                 stdin=subprocess.DEVNULL, errors="replace")
        except subprocess.TimeoutExpired:
            return False
        except OSError as e:
            self._cannot_run(e)
            return True
        info = parse_dump(out.stdout, pid) if out.returncode == 0 else None
        if info is None or not self._same(pid, ident):
            if pid in self._candidates:
                with self._lock:
                    self._told[pid] = (False, now)
            return True  # nothing readable, or the pid was reused while py-spy read it
        info = replace(info, read_at=time.time())
        if pid in self._candidates:
            with self._lock:
                self._told[pid] = (info.worker_loop is not None, now)
            if info.worker_loop is None:
                return True
        # Which fetcher a dump caught the worker in says what its dataset is; a dump between
        # batches says nothing, and keeps what an earlier one said.
        iterable = info.iterable if info.iterable is not None else known.iterable if known is not None else None
        if known is not None and info.worker_id is None:
            info = replace(known, doing=info.doing, python_threads=info.python_threads | known.python_threads,
                           read_at=info.read_at, iterable=iterable)
        else:
            info = replace(info, iterable=iterable)
        with self._lock:
            self._workers[pid] = info
        self._timed_out.discard(pid)
        return True


# A candidate that was no worker is dumped again: soon while it is young (a spawned worker
# enters its loop once it has unpickled its dataset), rarely after.
YOUNG_S = 60.0
RETELL_YOUNG_S = 3.0
RETELL_S = 60.0


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
