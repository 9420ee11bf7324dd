"""Races, fuzzed: a real job churns its workers while /proc reads fail at random under the
sampler — files vanish between listing and reading, reads stop half-way or return garbage,
permission is refused, a PID shows up with a new start time (reused). Whatever the schedule:
no crash, no worker shown twice, no worker shown alive without a good read of it in that
tick, and no rate computed across two identities of one PID."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.jobs import Job

from loadertop.probes import procfs

# Real jobs whose workers come and go.
pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def churning_job(tmp_path_factory):
    # One-batch epochs without persistent workers: two new workers ~10 times a second.
    j = Job("--workers", "2", "--epoch-items", "8", "--batch-size", "8", "--step-ms", "1", "--duration", "300",
            tmp=tmp_path_factory.mktemp("races"))
    try:
        j.wait_ready()
        yield j
    finally:
        j.kill()


FAULTS = ("vanish", "truncate", "garbage", "denied", "reused")
# The real readers, taken once: monkeypatch is shared by hypothesis' examples of one test.
REAL_READ_BYTES, REAL_READ_STAT = procfs._read_bytes, procfs.read_stat
REAL_FILES_READ = procfs.ProcFiles.read  # stat and status kept open between ticks


class FaultyProc:
    """Wraps procfs's readers (plain, kept open, stat) with a random fault schedule, and records which
    (pid, start ticks) had a good stat read: the only processes that may be shown alive."""

    def __init__(self, seed: int, rate: float, kinds: frozenset[str]) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.kinds = sorted(kinds)
        self.good: set[tuple[int, int]] = set()
        self.real_read_bytes = REAL_READ_BYTES
        self.real_read_stat = REAL_READ_STAT

    def read_bytes(self, path: str):
        return self.spoil(path, self.real_read_bytes(path))

    def read_open(self, files: procfs.ProcFiles, path: str):
        return self.spoil(path, REAL_FILES_READ(files, path))

    def spoil(self, path: str, data: bytes | None):
        if not self.kinds or self.rng.random() >= self.rate:
            return data
        kind = self.rng.choice(self.kinds)
        if kind == "vanish":
            return None
        if kind == "truncate" and data:
            return data[: self.rng.randrange(len(data))]
        if kind == "garbage":
            return bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(64)))
        if kind == "denied" and path.endswith(("smaps_rollup", "environ", "maps")):
            raise PermissionError(13, "Permission denied", path)
        return data

    def read_stat(self, pid: int, tid: int | None = None, files: procfs.ProcFiles | None = None):
        stat = self.real_read_stat(pid, tid, files)
        if stat is not None and "reused" in self.kinds and self.rng.random() < self.rate / 4:
            stat = stat._replace(start_ticks=stat.start_ticks + 1 + self.rng.randrange(1000))
        if stat is not None and tid is None:
            self.good.add((stat.pid, stat.start_ticks))
        return stat


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), rate=st.floats(0.0, 0.5),
       kinds=st.frozensets(st.sampled_from(FAULTS), min_size=1))
def test_random_proc_faults_under_real_churn(churning_job, seed, rate, kinds):
    from loadertop.rules import Diagnoser
    from loadertop.sampler import Sampler

    sampler = Sampler([churning_job.pid], interval_s=0.05)  # attaching is not under test: ticks are
    diagnoser = Diagnoser()
    seen: set[tuple[int, float]] = set()
    faults = FaultyProc(seed, rate, kinds)
    try:
        with pytest.MonkeyPatch.context() as patch:  # undone after each example
            patch.setattr(procfs, "_read_bytes", faults.read_bytes)
            patch.setattr(procfs, "read_stat", faults.read_stat)
            patch.setattr(procfs.ProcFiles, "read", lambda files, path: faults.read_open(files, path))
            for _ in range(8):
                faults.good.clear()
                snap = sampler.tick()
                diagnoser.feed(snap)
                shown: list[int] = []
                for t in snap.trainers:
                    for w in t.workers:
                        shown.append(w.pid)
                        if t.status == "running" and w.status != "exited":
                            ticks = round((w.started_at - procfs.BOOT_TIME) * procfs.CLK_TCK)
                            assert (w.pid, ticks) in faults.good, f"worker {w.pid} shown alive without a good read"
                            if (w.pid, w.started_at) not in seen:
                                assert w.cpu_percent is None, "a rate across two identities of one PID"
                            seen.add((w.pid, w.started_at))
                assert len(shown) == len(set(shown)), f"a worker shown twice: {shown}"
    finally:
        sampler.close()
