"""Synthetic snapshots for rule and UI tests: time comes from the story, not from sleeps."""

from __future__ import annotations

from dataclasses import replace

from loadertop.model import (
    DataWait,
    Event,
    GpuSnapshot,
    HostSnapshot,
    LoaderConfig,
    ProcessSample,
    ShmSnapshot,
    Snapshot,
    TrainerSnapshot,
)

T0 = 1_800_000_000.0
TRAINER = 4000


def process(pid: int, cpu: float | None = 50.0, **kw) -> ProcessSample:
    base = dict(
        pid=pid, started_at=T0 - 100, status="running", cpu_percent=cpu, rss_bytes=300 << 20,
        uss_bytes=20 << 20, pss_bytes=80 << 20, memory_sampled_at=T0, threads=3, busy_threads=1,
        runqueue_wait_s_per_s=0.0, ctx_switches_voluntary_per_s=20.0, ctx_switches_involuntary_per_s=5.0,
        worker_id=None, doing=None,
    )
    base.update(kw)
    return ProcessSample(**base)


def data_wait(fraction: float | None, main: float = 0.0, samples: int = 300, stalled: float = 0.0,
              window: float = 30.0) -> DataWait:
    if fraction is None:
        return DataWait(None, None, None, (), 0, window, 0.0)
    rest = 1.0 - fraction
    return DataWait(fraction, fraction - main, main,
                    (("forward", rest * 0.4), ("backward", rest * 0.4), ("optimizer", rest * 0.1),
                     ("device_sync", 0.0), ("other", rest * 0.1)),
                    samples, window, stalled)


def trainer(workers: int = 2, worker_cpu: float | None = 95.0, wait: float | None = 0.5,
            usable: int = 8, pid: int = TRAINER, **kw) -> TrainerSnapshot:
    ws = tuple(process(pid + 1 + i, worker_cpu, worker_id=i, doing="D.__getitem__ (d.py:9)")
               for i in range(workers))
    base = dict(
        pid=pid, started_at=T0 - 200, job_pid=pid, rank=None, local_rank=None, world_size=None,
        cmdline=("python", "train.py"), env=(), status="running", usable_cpus=usable,
        main=process(pid, 90.0, threads=12), pin_memory_thread=False, pin_memory_cpu_percent=None,
        workers=ws, worker_respawns=0,
        shm=ShmSnapshot("/dev/shm", 8 << 30, 100 << 20, 50 << 20),
        data_wait=data_wait(wait) if not isinstance(wait, DataWait) else wait,
        loaders=(LoaderConfig("D", workers, True, tuple(w.pid for w in ws)),) if workers else (),
    )
    base.update(kw)
    return TrainerSnapshot(**base)


def host(cpu_count: int = 8, cpu: float | None = 40.0, load: float = 2.0, **kw) -> HostSnapshot:
    base = dict(hostname="gpu-node", cpu_count=cpu_count, usable_cpus=cpu_count, mem_total_bytes=64 << 30,
                mem_available_bytes=32 << 30, load_avg=(load, load, load), cpu_percent=cpu,
                dataloader_workers=None, dataloader_trainers=None)
    base.update(kw)
    return HostSnapshot(**base)


def snapshot(t: float, trainers=(), host_=None, gpus=(), events=()) -> Snapshot:
    return Snapshot(time=T0 + t, monotonic=1000.0 + t, interval_s=1.0, host=host_ or host(),
                    trainers=tuple(trainers), gpus=tuple(gpus), events=tuple(events), jobs=(TRAINER,))


def story(seconds: int, make) -> list[Snapshot]:
    """One snapshot per second; make(t) returns the snapshot at second t."""
    return [make(t) for t in range(seconds)]


def gpu(index: int = 0, util: float | None = 30.0, pids=(TRAINER,)) -> GpuSnapshot:
    return GpuSnapshot(index, f"GPU-{index}", "NVIDIA H100", util, 20.0, 10 << 30, 80 << 30, 200.0, 700.0,
                       1980, 1e9, 2e9, tuple(pids))


def worker_exit(t: float, pid: int, code: int | None, trainer_pid: int = TRAINER) -> Event:
    return Event(T0 + t, "worker_exited", trainer_pid, pid, "", code)


__all__ = ["replace", "process", "data_wait", "trainer", "host", "snapshot", "story", "gpu", "worker_exit"]


class Replayed:
    """A sampler that hands out the given snapshots one a tick (for the exporter, which samples)."""

    def __init__(self, snapshots) -> None:
        self.left = list(snapshots)

    def tick(self) -> Snapshot:
        return self.left.pop(0)

    def close(self) -> None:
        pass
