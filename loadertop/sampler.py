"""The sampler owns the probes and turns each tick into one immutable Snapshot.

It keeps what must survive between ticks (previous counters, which processes are trainers,
which workers were seen, the last data of a trainer that exited) so that every output
can stay a pure consumer of snapshots. `History` keeps a bounded run of recent snapshots.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from . import notices as N
from .model import DataWait, Event, LoaderConfig, Notice, ProcessSample, Snapshot, TrainerSnapshot
from .notices import NoticeBoard, describe_exit, job_status_notice, trainer_exit_notice
from .numbers import int_or_none
from .probes import procfs
from .probes.cgroup import CpuLimit, cpu_limit, memory_headroom, sched_group
from .probes.discovery import Discovery, Key, Tree, key_of
from .probes.exits import ExitWatch
from .probes.gpu import GpuProbe
from .probes.hook_files import HookReader
from .probes.host import HostProbe, cpu_set, usable_cpus
from .probes.launch import JOB_KEYS, POD_KEYS, job_id, kubernetes_pod
from .probes.processes import ProcessSampler
from .probes.pyspy import WorkerInfo
from .probes.shm import read_shm
from .redact import ENV_WHITELIST, redact_cmdline
from .roster import WorkerRoster

USABLE_CPUS_REFRESH_S = 30.0
MEMORY_HEADROOM_REFRESH_S = 5.0


class StackSource(Protocol):
    """What the sampler needs from stack sampling (py-spy): never blocks the tick."""

    def watch(self, trainers: dict[int, tuple[int, ...]], started: dict[int, float] | None = None,
              candidates: Iterable[int] = ()) -> None: ...
    def loader_worker(self, pid: int) -> bool | None: ...
    def data_wait(self, trainer_pid: int) -> DataWait | None: ...
    def worker(self, pid: int) -> WorkerInfo | None: ...
    def stop_after_window(self) -> None: ...
    def flush(self, timeout: float) -> None: ...
    def close(self) -> None: ...
    def notices(self) -> tuple[Notice, ...]: ...


@dataclass
class _Trainer:
    key: Key
    job_pid: int
    confirmed: bool  # it had workers or is a launcher's rank: stays a trainer from now on
    exit_notice: Notice | None = None
    cmdline: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    job_id: str | None = None
    owner_uid: int | None = None  # the user it runs as
    namespace: str | None = None  # its Kubernetes pod's, where it runs in one
    pod: str | None = None
    usable_cpus: int | None = None
    usable_at: float = float("-inf")
    cpu_set: tuple[int, ...] = ()
    cpu_limit: CpuLimit | None = None
    sched_group: str | None = None  # the scheduler's group (cgroup, else autogroup): refreshed with the CPUs
    throttling: tuple[int, int] | None = None  # (periods, throttled) at the last tick
    throttled_fraction: float | None = None
    memory_headroom: int | None = None
    memory_at: float = float("-inf")
    roster: WorkerRoster = field(default_factory=WorkerRoster)
    pin_ticks: tuple[float, int] | None = None
    last: TrainerSnapshot | None = None
    last_workers: tuple[ProcessSample, ...] = ()  # the last non-empty set: kept after exit
    exited: bool = False

    @property
    def pid(self) -> int:
        return self.key[0]


@dataclass
class _Job:
    pid: int
    start_ticks: int
    trainers: dict[Key, _Trainer] = field(default_factory=dict)
    exited: bool = False


class Sampler:
    def __init__(
        self,
        pids: Iterable[int],
        interval_s: float = 1.0,
        gpu: GpuProbe | None = None,
        stacks: StackSource | None = None,
        processes: ProcessSampler | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.host = HostProbe()
        self.discovery = Discovery()
        self.processes = processes or ProcessSampler()
        self.gpu = gpu if gpu is not None else GpuProbe()
        self.stacks = stacks
        self.exits = ExitWatch()
        self.hooks = HookReader()
        self.jobs: list[_Job] = []
        self._candidates: dict[int, Key] = {}  # children a stack dump is to tell apart (probes.discovery)
        for pid in pids:
            st = procfs.read_stat(pid)
            if st is None:
                raise ProcessLookupError(pid)
            self.jobs.append(_Job(pid=pid, start_ticks=st.start_ticks))
        self.host.jobs = frozenset(j.pid for j in self.jobs)

    def add_job(self, pid: int) -> bool:
        """Watch one more job (the node agent found it); False where it is gone already."""
        if any(j.pid == pid for j in self.jobs):
            return True
        st = procfs.read_stat(pid)
        if st is None:
            return False
        self.jobs.append(_Job(pid=pid, start_ticks=st.start_ticks))
        self.host.jobs = frozenset(j.pid for j in self.jobs)
        return True

    def drop_ended(self) -> list[int]:
        """Forget the jobs whose process ended (the node agent: their series go with them,
        never left behind as values that look live). Their pids."""
        ended = [j.pid for j in self.jobs if j.exited]
        if ended:
            self.jobs = [j for j in self.jobs if not j.exited]
            self.host.jobs = frozenset(j.pid for j in self.jobs)
        return ended

    # --- the tick -------------------------------------------------------------------

    def tick(self, complete: bool = False) -> Snapshot:
        """One snapshot; `complete` reads USS/PSS of every process never read yet (a report's
        last tick), whatever that costs."""
        now = time.time()
        mono = time.monotonic()
        board = NoticeBoard()
        events: list[Event] = []
        host = self.host.sample()
        gpus, gpu_notices = self.gpu.sample()
        for n in gpu_notices:
            board.add(n)
        live: set[Key] = set()
        trainers: list[TrainerSnapshot] = []
        self.processes.begin_tick()
        self._recognise_workers()
        walked = [(job, *self._walk_job(job, mono, board)) for job in self.jobs]
        # smaps and threads first, so this tick's samples carry what they read; one budget
        # for every job, stalest first, so that no job's processes starve the others'.
        family = [tree.stats[p] for _, tree, current in walked for p in current]
        family += [tree.stats[w] for _, tree, current in walked for p in current for w in tree.workers.get(p, ())]
        self.processes.refresh_slow(family, now, complete)
        for job, tree, current in walked:
            trainers.extend(self._tick_job(job, tree, current, now, board, events, live))
        self.processes.forget(live)
        self.discovery.forget(live)
        self.host.known_workers = {t.pid: tuple(w.pid for w in t.workers if w.found_by in ("hook", "stack"))
                                   for t in trainers if t.status == "running"}
        self.exits.watch(live)
        if self.stacks is not None:
            running = [t for t in trainers if t.status == "running"]
            owners = {t.pid for t in trainers}
            candidates = {pid: tree.stats[pid] for _, tree, _ in walked for pid in tree.candidates
                          if pid not in owners and pid not in tree.workers}
            self._candidates = {pid: key_of(st) for pid, st in candidates.items()}
            self.stacks.watch(
                {t.pid: tuple(w.pid for w in t.workers) for t in running},
                # Who each pid is: py-spy is pointed at pids, and checks them against these.
                {p.pid: p.started_at for t in running for p in (t.main, *t.workers)}
                | {pid: st.started_at for pid, st in candidates.items()},
                candidates=self._candidates,
            )
            for n in self.stacks.notices():
                board.add(n)
            trainers = [self._with_stacks(t) for t in trainers]
        trainers = [self._with_hook(t, now) for t in trainers]
        self.hooks.forget({(t.pid, t.started_at) for t in trainers})
        for n in self.hooks.notices():
            board.add(n)
        if self.stacks is None and not any(t.data_wait for t in trainers):
            board.add(
                Notice(
                    N.DATA_WAIT_OFF,
                    "data wait is not measured: stack sampling is off",
                    "run without --no-stacks (needs py-spy and ptrace), or add loader = loadertop.watch(loader)",
                )
            )
        trainers = [self._with_gpus(t, gpus) for t in trainers]
        for pid in self.processes.denied_memory & {t.pid for t in trainers}:
            board.add(
                Notice(
                    N.MEMORY_PERMISSION,
                    f"USS/PSS of trainer {pid} and its workers cannot be read (smaps is "
                    "closed to other users)",
                    "run loadertop as the trainer's user, or as root",
                    pid,
                )
            )
        return Snapshot(
            time=now,
            monotonic=mono,
            interval_s=self.interval_s,
            host=host,
            trainers=tuple(trainers),
            gpus=gpus,
            events=tuple(events),
            notices=tuple(board.all()),
            jobs=tuple(j.pid for j in self.jobs),
        )

    def _recognise_workers(self) -> None:
        """Workers that do not carry torch's worker name (torchdata's StatefulDataLoader):
        those the hooks published, and candidates a stack dump showed in a worker loop."""
        self.discovery.hook_workers = {
            trainer: {p for c in configs.values() for p in c.get("worker_pids") or ()}
            for (trainer, _), configs in self.hooks.configs.items()
        }
        if self.stacks is not None:
            for pid, key in self._candidates.items():
                if self.stacks.loader_worker(pid):
                    self.discovery.stack_workers.add(key)

    def _walk_job(self, job, mono, board):
        """The job's process tree this tick, and its trainer pids."""
        tree = (
            Tree(root=None)
            if job.exited
            else self.discovery.walk(
                job.pid, job.start_ticks, [t.pid for t in job.trainers.values() if not t.exited], mono
            )
        )
        if tree.root is None or tree.root.state == "Z":
            # Gone, or a zombie its parent has not reaped yet: either way the job ended.
            job.exited = True
            board.add(job_status_notice(job.pid))
        confirmed = [state.key for state in job.trainers.values() if state.confirmed]
        pids, notice = self.discovery.trainers(tree, confirmed)
        board.add(notice)
        return tree, pids

    def _tick_job(self, job, tree, current, now, board, events, live) -> list[TrainerSnapshot]:
        out = []
        for pid in current:
            st = tree.stats[pid]
            key = key_of(st)
            state = job.trainers.get(key)
            if state is None:
                state = _Trainer(key=key, job_pid=job.pid, confirmed=False)
                self._describe(state, st)
                job.trainers[key] = state
                events.append(Event(now, "trainer_found", pid, pid, " ".join(state.cmdline)[:200]))
            state.confirmed = state.confirmed or pid in tree.workers or self.discovery.is_rank(tree, pid)
            out.append(self._sample_trainer(state, st, tree, now, board, events, live))
        # Trainers not seen this tick: exited (or, if provisional, simply replaced).
        for key, state in list(job.trainers.items()):
            if key[0] in current and key_of(tree.stats[key[0]]) == key:
                continue
            if not state.confirmed:
                del job.trainers[key]
                continue
            if not state.exited:
                state.exited = True
                code = self.exits.exit_code(key)
                how = describe_exit(code)
                events.append(Event(now, "trainer_exited", state.pid, state.pid, how, code))
                state.exit_notice = trainer_exit_notice(state.pid, code)
                events += state.roster.end(now, state.pid, self.exits.exit_code)
            board.add(state.exit_notice)  # said while its last data is shown
            if state.last is not None:
                out.append(self._exited_view(state.last, state.last_workers))
        return out

    def _describe(self, state: _Trainer, st: procfs.Stat) -> None:
        state.cmdline = redact_cmdline(self.discovery.cmdline(st) or [st.comm])
        try:
            env = procfs.environ_subset(st.pid, ENV_WHITELIST | JOB_KEYS | POD_KEYS)
        except PermissionError:
            env = None
        if env is None:
            state.env = state.job_id = None
            return
        state.namespace, state.pod = kubernetes_pod(env, st.pid, procfs.PROC)
        state.owner_uid = procfs.owner_uid(st.pid)
        state.job_id = job_id(env, self.host.hostname, state.job_pid, state.owner_uid, state.namespace)
        state.env = {k: v for k, v in env.items() if k in ENV_WHITELIST}

    def _sample_trainer(self, state, st, tree, now, board, events, live):
        pid = st.pid
        live.add(state.key)
        self._refresh_limits(state, now)
        main = self.processes.sample(st, now, main_thread=True)
        # Workers: live ones in start order; zombies are dead, reported once as exited.
        worker_stats = sorted(
            (tree.stats[w] for w in tree.workers.get(pid, ())), key=lambda s: (s.start_ticks, s.pid)
        )
        # Each worker's main thread every tick too: its queueing for a CPU is the busy host's sign
        # (rules.measure.queued_s_per_s), and the slow cadence reads it too seldom live.
        workers = {key_of(w): self.processes.sample(w, now, main_thread=True, found_by=tree.found_by.get(w.pid))
                   for w in worker_stats if w.state != "Z"}
        zombies = {key_of(w): w.exit_code for w in worker_stats if w.state == "Z"}
        live.update(workers)
        events += state.roster.update(now, pid, workers, zombies, self.exits.exit_code, tree.stats)
        pin, pin_cpu = self._pin_thread(state, tree.pin_threads.get(pid), now)
        shm, notice = read_shm(pid)
        board.add(notice)
        if shm is not None:
            segments = self.processes.torch_segments([state.key, *workers])
            if segments is not None:
                shm = replace(shm, torch_bytes=sum(segments.values()),
                              torch_largest_bytes=max(segments.values(), default=None))
        if not workers:
            board.add(
                Notice(
                    N.NO_WORKERS,
                    f"trainer {pid} has no DataLoader workers (yet): it has not started a "
                    "loader with num_workers > 0, or it loads in the main process",
                    None,
                    pid,
                )
            )
        if state.env is None:
            board.add(
                Notice(
                    N.ENV_PERMISSION,
                    f"the environment of trainer {pid} cannot be read: rank and thread "
                    "variables unknown",
                    "run loadertop as the trainer's user, or as root",
                    pid,
                )
            )
        env = state.env or {}
        snap = TrainerSnapshot(
            pid=pid,
            started_at=st.started_at,
            job_pid=state.job_pid,
            rank=int_or_none(env.get("RANK")),
            local_rank=int_or_none(env.get("LOCAL_RANK")),
            world_size=int_or_none(env.get("WORLD_SIZE")),
            cmdline=state.cmdline,
            env=tuple(sorted(env.items())),
            status="running",
            usable_cpus=state.usable_cpus,
            main=main,
            pin_memory_thread=pin,
            pin_memory_cpu_percent=pin_cpu,
            workers=tuple(workers.values()),
            worker_respawns=state.roster.respawns,
            shm=shm,
            cpu_set=state.cpu_set,
            cpu_quota=state.cpu_limit.cpus if state.cpu_limit else None,
            sched_group=state.sched_group,
            cpus_busy=self.host.per_cpu.busy_cpus(state.cpu_set),
            throttled_fraction=state.throttled_fraction,
            memory_headroom_bytes=state.memory_headroom,
            job_id=state.job_id,
            owner_uid=state.owner_uid,
            namespace=state.namespace,
            pod=state.pod,
        )
        state.last = snap
        if snap.workers:
            state.last_workers = snap.workers
        return snap

    @staticmethod
    def _refresh_limits(state: _Trainer, now: float) -> None:
        """The trainer's CPUs and quota (rarely change), its memory headroom (every few
        seconds), and how often its quota ran out since the last tick."""
        pid = state.pid
        if now - state.usable_at >= USABLE_CPUS_REFRESH_S:
            state.usable_cpus = usable_cpus(pid)
            state.cpu_set = cpu_set(pid) or ()
            state.cpu_limit = cpu_limit(pid)
            state.sched_group = sched_group(pid)
            state.usable_at = now
        if now - state.memory_at >= MEMORY_HEADROOM_REFRESH_S:
            state.memory_headroom = memory_headroom(pid)
            state.memory_at = now
        counts = state.cpu_limit.throttling() if state.cpu_limit else None
        if counts is not None and state.throttling is not None and counts[0] > state.throttling[0]:
            state.throttled_fraction = (counts[1] - state.throttling[1]) / (counts[0] - state.throttling[0])
        elif counts is None:
            state.throttled_fraction = None
        state.throttling = counts

    def _pin_thread(self, state: _Trainer, pin, now):
        if pin is None:
            return None, None
        if not pin:
            state.pin_ticks = None
            return False, None
        ticks = sum(t.cpu_ticks for t in pin)
        cpu = None
        if state.pin_ticks is not None and now > state.pin_ticks[0]:
            cpu = 100.0 * (ticks - state.pin_ticks[1]) / procfs.CLK_TCK / (now - state.pin_ticks[0])
        state.pin_ticks = (now, ticks)
        return True, cpu

    @staticmethod
    def _exited_view(last: TrainerSnapshot, workers: tuple[ProcessSample, ...]) -> TrainerSnapshot:
        def gone(p: ProcessSample) -> ProcessSample:
            return replace(p, status="exited", cpu_percent=None)

        return replace(
            last,
            status="exited",
            main=gone(last.main),
            workers=tuple(gone(w) for w in (last.workers or workers)),
            pin_memory_cpu_percent=None,
        )

    def _with_stacks(self, t: TrainerSnapshot) -> TrainerSnapshot:
        assert self.stacks is not None
        if t.status != "running":
            # The window that covered the exit is read after it: keep its samples.
            return replace(t, data_wait=self.stacks.data_wait(t.pid) or t.data_wait)
        workers = []
        loaders: dict[tuple, list[int]] = {}
        kinds: dict[tuple, bool] = {}  # a loader's dataset is iterable: as any worker's fetcher said
        for w in t.workers:
            info = self.stacks.worker(w.pid)
            if info is None:
                workers.append(w)
                continue
            workers.append(replace(w, worker_id=info.worker_id, doing=info.doing, doing_at=info.read_at))
            self.processes.python_helpers[w.pid] = info.python_threads
            if info.num_workers is not None:
                # A loader is what its workers' _worker_loop says of it. Not which fetcher a dump
                # caught each in (None between batches): one webdataset loader of 4 workers was
                # shown as two, w0 and w3 beside w1 and w2.
                key = (info.dataset_class, info.num_workers, info.persistent_workers)
                loaders.setdefault(key, []).append(w.pid)
                if info.iterable is not None:
                    kinds.setdefault(key, info.iterable)
        data_wait = self.stacks.data_wait(t.pid)
        return replace(
            t,
            data_wait=data_wait,
            workers=tuple(workers),
            main=replace(t.main, doing=main_doing(data_wait)),
            loaders=tuple(LoaderConfig(k[0], k[1], k[2], tuple(v), iterable=kinds.get(k)) for k, v in loaders.items()),
        )

    def _with_hook(self, t: TrainerSnapshot, now: float) -> TrainerSnapshot:
        """The hook's exact figures win over stack sampling where the script publishes them."""
        if t.status != "running":
            return t
        dw = self.hooks.data_wait(t.pid, t.started_at, now)
        if dw is None:
            return t
        sampled = t.data_wait
        if (dw.fraction is not None and sampled is not None and sampled.fraction
                and sampled.main_process_fraction is not None):
            # py-spy still says where the wait goes (receiving vs waiting for a worker): its
            # split, scaled to the hook's exact total.
            main = dw.fraction * sampled.main_process_fraction / sampled.fraction
            dw = replace(dw, main_process_fraction=main, worker_wait_fraction=dw.fraction - main,
                         breakdown=sampled.breakdown, iterable=dw.iterable or sampled.iterable)
        if sampled is not None and dw.loop is None:
            dw = replace(dw, loop=sampled.loop)  # watch(loader) in a framework's loop: its frames say which
        loaders = self.hooks.loaders(t.pid, t.started_at, tuple(w.pid for w in t.workers)) or t.loaders
        return replace(t, data_wait=dw, loaders=loaders, main=replace(t.main, doing=main_doing(dw)))

    @staticmethod
    def _with_gpus(t: TrainerSnapshot, gpus) -> TrainerSnapshot:
        if not gpus:
            return t
        pids = {t.pid}
        try:
            pids.update(procfs.read_nspid(t.pid))  # NVML may report the pid from inside a container
        except PermissionError:
            pass
        used = tuple(g.index for g in gpus if pids & set(g.process_pids))
        return replace(t, gpus=used)

    def close(self) -> None:
        self.exits.close()
        self.gpu.close()
        self.discovery.close()
        self.processes.close()
        if self.stacks is not None:
            self.stacks.close()


def main_doing(dw: DataWait | None) -> str | None:
    """The main thread's largest share of time, e.g. 'waiting for data 62%'."""
    if dw is None or dw.fraction is None:
        return None
    shares = [("waiting for data", dw.worker_wait_fraction or 0.0),
              ("loading in main process", dw.main_process_fraction or 0.0)]
    shares += [(name.replace("_", " "), share) for name, share in dw.breakdown]
    name, share = max(shares, key=lambda item: item[1])
    return f"{name} {share:.0%}"


def run_ticks(sampler: Sampler, duration_s: float, on_snapshot: Callable[[Snapshot], object],
              before_last: Callable[[], object] | None = None) -> None:
    """Tick every interval until duration_s passed (inf: until interrupted) or every job
    exited; never overlapping. The last tick completes the slow readings so that a report has
    USS/PSS for everyone; before_last() runs just before it (the stack sampler's last window)."""
    start = time.monotonic()
    n = 0
    while True:
        last = (n + 1) * sampler.interval_s > duration_s + 1e-6
        if n:
            time.sleep(max(0.0, start + n * sampler.interval_s - time.monotonic()))
        if last and before_last is not None:
            before_last()
        on_snapshot(sampler.tick(complete=last))
        n += 1
        if last:
            return
        if all(j.exited for j in sampler.jobs):
            if before_last is not None:
                before_last()
                on_snapshot(sampler.tick(complete=True))
            return


class History:
    """The recent snapshots, bounded so memory does not grow with uptime."""

    def __init__(self, maxlen: int = 3600) -> None:
        self._items: deque[Snapshot] = deque(maxlen=maxlen)

    def append(self, snapshot: Snapshot) -> None:
        self._items.append(snapshot)

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> Snapshot:
        return self._items[index]
