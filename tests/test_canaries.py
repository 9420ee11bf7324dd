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


# Each canary: what the probe reads, whatever the host does beside it (busy: the live snapshot
# found others keeping the trainer's CPUs busy; then what follows from the load is not asked).


def _quota(rep: dict, busy: bool) -> None:  # cgroup v1 cpu.cfs_quota_us and cpu.stat's throttling
    t = only_trainer(rep)
    assert t["cpu_quota"] == 1.0 and t["usable_cpus"] == 1
    assert busy or t["plan"]["cause"] == "quota", t["plan"]["cause"]


def _stopped(rep: dict, busy: bool) -> None:  # the workers' T state: a hang, at once
    assert [f["id"] for f in rep["findings"]] == ["loader_stalled"]


def _shm(rep: dict, busy: bool) -> None:  # the trainer's own /dev/shm, in its mount namespace
    assert only_trainer(rep)["shm"]["total_bytes"] == 19 * 2**19 and "shm_pressure" in findings(rep)


def _pinned(rep: dict, busy: bool) -> None:  # each rank's affinity, through torchrun
    assert len(rep["trainers"]) == 2
    for t in rep["trainers"]:
        evidence = t["plan"]["evidence"]
        assert len(t["cpu_set"]) == 1 and evidence["cpu_set"] == 1
        # Its own CPU, less what others keep busy on it: never divided by the ranks again.
        assert evidence["cpus"] >= min(0.5, 1 - evidence["other_processes_cpus"] - 0.05), evidence


def _pools(rep: dict, busy: bool) -> None:  # each worker's threads (the slow cadence) and its thread pools
    assert all(w["busy_threads"] >= 2 for w in only_trainer(rep)["workers"]), only_trainer(rep)["workers"]
    assert busy or "worker_threads" in findings(rep)


def _loop_threads(rep: dict, busy: bool) -> None:  # the loop's threads, its main thread's schedstat every tick
    assert only_trainer(rep)["main"]["busy_threads"] >= 2
    assert busy or "main_threads" in findings(rep)


CANARIES = {"quota": _quota, "stopped": _stopped, "small_shm_fills": _shm, "pinned_ranks": _pinned,
            "worker_threads": _pools, "main_threads_default": _loop_threads}


# Verdicts that are one outcome of a scenario: a /dev/shm that full crashes a worker (a Bus
# error, the job EXITED) at a moment of the host's choosing, before the window ends or after.
SAME_OUTCOME = {"small_shm_fills": {"SHM FULL", "EXITED"}}


def _busy(rep: dict) -> bool:
    return any(((t.get("plan") or {}).get("evidence") or {}).get("cpu_limit") == "busy_host" for t in rep["trainers"])


@pytest.mark.parametrize("name", list(CANARIES))
def test_a_live_snapshot_reads_what_its_recorded_twin_read(name):
    s = SCENARIOS[name]
    missing = can_record(s)
    if missing:
        pytest.skip(missing)
    twin = snapshot_report(name)
    CANARIES[name](twin, False)  # what the canary checks held when it was recorded, on a quiet host
    with tempfile.TemporaryDirectory() as tmp, started(s, Path(tmp)) as jobs:
        rep = report(*(j.pid for j in jobs), duration=s.duration, interval=s.interval, stacks=s.stacks)
    busy = _busy(rep)
    CANARIES[name](rep, busy)
    if not busy:  # on a busy host the model answers for that load, not for the quiet twin's
        said, recorded = kind_of(rep["verdict"]), kind_of(twin["verdict"])
        assert said == recorded or {said, recorded} <= SAME_OUTCOME.get(name, set()), (rep["verdict"], twin["verdict"])
