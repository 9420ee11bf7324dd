"""The live tier's canaries for the recorded scenarios (issue 42): one per probe path the replay
tier's recordings came through, run live again. A canary's snapshot must read what its
recorded twin read (tests/data/scenarios, tests/support/scenarios.py), so a probe that comes to
read otherwise (a kernel's cgroup files, /proc's schedstat, a mount namespace's /dev/shm, the
stopped state, torchrun's affinity) fails here and is re-recorded on purpose.

A canary's verdict depends on the host only where the model says it does: where the live
snapshot found other processes keeping the trainer's CPUs busy, the expected verdict is the
one the model gives for that (BUSY HOST), not the recorded quiet one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from support.reports import findings, only_trainer, report
from support.scenarios import SCENARIOS, can_record, snapshot_report, started

from loadertop.rules.diagnosis import kind_of

pytestmark = pytest.mark.live


def _quota(rep: dict) -> None:  # cgroup v1 cpu.cfs_quota_us and cpu.stat's throttling
    t = only_trainer(rep)
    assert t["cpu_quota"] == 1.0 and t["usable_cpus"] == 1 and t["plan"]["cause"] == "quota"


def _stopped(rep: dict) -> None:  # the workers' T state: a hang, at once
    assert [f["id"] for f in rep["findings"]] == ["loader_stalled"]


def _shm(rep: dict) -> None:  # the trainer's own /dev/shm, in its mount namespace
    assert only_trainer(rep)["shm"]["total_bytes"] == 19 * 2**19 and "shm_pressure" in findings(rep)


def _pinned(rep: dict) -> None:  # each rank's affinity, through torchrun
    assert len(rep["trainers"]) == 2
    assert all(len(t["cpu_set"]) == 1 and t["plan"]["evidence"]["cpus"] >= 0.5 for t in rep["trainers"])


def _pools(rep: dict) -> None:  # each worker's threads (the slow cadence) and its thread pools
    assert findings(rep)["worker_threads"]["evidence"]["busy_threads_per_worker"] >= 2


def _loop_threads(rep: dict) -> None:  # the loop's threads, its main thread's schedstat every tick
    assert "main_threads" in findings(rep)


CANARIES = {"quota": _quota, "stopped": _stopped, "small_shm_fills": _shm, "pinned_ranks": _pinned,
            "worker_threads": _pools, "main_threads_default": _loop_threads}


@pytest.mark.parametrize("name", list(CANARIES))
def test_a_live_snapshot_reads_what_its_recorded_twin_read(name):
    s = SCENARIOS[name]
    missing = can_record(s)
    if missing:
        pytest.skip(missing)
    twin = snapshot_report(name)
    CANARIES[name](twin)  # what the canary checks held when it was recorded
    with tempfile.TemporaryDirectory() as tmp, started(s, Path(tmp)) as jobs:
        rep = report(*(j.pid for j in jobs), duration=s.duration, interval=s.interval, stacks=s.stacks)
    CANARIES[name](rep)
    if any(((t.get("plan") or {}).get("evidence") or {}).get("cpu_limit") == "busy_host" for t in rep["trainers"]):
        return  # the host was busy here: the model answers for that load, not the quiet twin's
    assert kind_of(rep["verdict"]) == kind_of(twin["verdict"]), (rep["verdict"], twin["verdict"])
