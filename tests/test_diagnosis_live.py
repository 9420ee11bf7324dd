"""Diagnosis on real workloads that provoke each CPU-side rule, and a healthy job that must
provoke none."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from jobs import PYTHON, loadertop, worker_pids
from test_snapshot_cli import SCHEMA

from loadertop.started import can_unshare_shm, shm_wrapper


def report(*pids: int, duration: float = 10, interval: float = 0.5, stacks: bool = True) -> dict:
    import jsonschema

    args = ["snapshot", *map(str, pids), "--duration", str(duration), "--interval", str(interval), "--json"]
    r = loadertop(*args, *([] if stacks else ["--no-stacks"]))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    jsonschema.validate(out, SCHEMA)
    return out


def findings(rep: dict) -> dict[str, dict]:
    return {f["id"]: f for f in rep["findings"]}


def test_healthy_job_has_no_findings(job):
    # Batches are ready long before the 150 ms step ends; what is left of data wait is the
    # hand-over of each batch (~2-3 ms here, more when the machine is busy).
    j = job("--workers", "2", "--persistent", "--batch-size", "8", "--step-ms", "150")
    j.wait_ready()
    rep = report(j.pid)
    assert rep["findings"] == [], rep["findings"]
    # A few % in truth; a 10 s window at 10 Hz reads it within its sampling error.
    assert rep["trainers"][0]["data_wait_fraction"] < 0.15


def test_batches_of_many_small_tensors_are_slow_to_receive_not_to_load(job):
    # Each of the 256 tensors in a batch is its own shared-memory hand-over: the workers sit
    # waiting for indices while the loop waits ~40% receiving. More workers would not help,
    # and the workers' busy feeder/sharer threads are not a thread pool.
    j = job("--workers", "2", "--persistent", "--batch-size", "8", "--step-ms", "30",
            "--tensors-per-item", "32", "--tensor-kb", "64")
    j.wait_ready()
    f = findings(report(j.pid, duration=12))
    assert set(f) == {"main_process_bound"}, f
    assert f["main_process_bound"]["evidence"]["workers_waiting_for_indices"] is True
    # The share itself varies with the host (9-40 % here across days): the finding needs it
    # above the warning threshold beyond sampling error, which is what holds everywhere.
    assert f["main_process_bound"]["evidence"]["main_process_fraction"] >= 0.05


def test_workers_with_intra_op_thread_pools(job):
    j = job("--workers", "2", "--persistent", "--worker-threads", "8", "--matmuls", "6", "--batch-size", "2")
    j.wait_ready()
    rep = report(j.pid, duration=10, stacks=False)
    f = findings(rep)
    assert "worker_threads" in f, (f, [w["busy_threads"] for w in rep["trainers"][0]["workers"]])
    assert f["worker_threads"]["change"]["env"]["OMP_NUM_THREADS"] == "1"
    assert f["worker_threads"]["evidence"]["busy_threads_per_worker"] >= 2


def test_workers_recreated_every_epoch(job):
    j = job("--workers", "2", "--epoch-items", "32", "--batch-size", "8", "--step-ms", "20")
    j.wait_ready()
    f = findings(report(j.pid, duration=10))
    assert "worker_respawn" in f, f
    assert f["worker_respawn"]["change"] == {"DataLoader": {"persistent_workers": True}}


def test_copy_on_read_memory_growth(job):
    j = job("--workers", "2", "--persistent", "--objects", "3000000", "--objects-per-item", "150",
            "--item-ms", "10", "--batch-size", "4", "--step-ms", "5")
    j.wait_ready(timeout=120)
    rep = report(j.pid, duration=30, interval=1.0, stacks=False)
    f = findings(rep)
    assert "worker_memory_growth" in f, (f, [w["uss_bytes"] for w in rep["trainers"][0]["workers"]])
    assert "numpy" in f["worker_memory_growth"]["suggestion"]


@pytest.mark.skipif(not can_unshare_shm(), reason="unshare of a mount namespace is not permitted here")
def test_small_dev_shm_fills(job):
    # 2 workers x prefetch_factor 4 = 8 batches of 1 MiB in flight (9 with the one in use)
    # in a 9.5 MiB /dev/shm: 84-95 % full, below the crash.
    size = 19 * 2**19
    j = job("--workers", "2", "--persistent", "--prefetch", "4", "--tensor-kb", "128", "--batch-size", "8",
            "--step-ms", "150", cmd=[*shm_wrapper(size), PYTHON])
    j.wait_ready()
    rep = report(j.pid, duration=8, stacks=False)
    f = findings(rep)
    assert "shm_pressure" in f, (f, rep["trainers"][0]["shm"])
    assert f["shm_pressure"]["evidence"]["shm_total_bytes"] == size
    assert f["shm_pressure"]["change"]["docker"]["shm_size"].endswith("m")


def test_two_jobs_sharing_two_cores(job):
    a = job("--workers", "2", "--persistent", "--item-ms", "20")
    b = job("--workers", "2", "--persistent", "--item-ms", "20")
    a.wait_ready()
    b.wait_ready()
    rep = report(a.pid, b.pid, duration=12, stacks=False)
    found = [f for f in rep["findings"] if f["id"] in ("too_many_workers", "cpu_oversubscribed")]
    assert {f["trainer_pid"] for f in found} == {a.pid, b.pid}, rep["findings"]
    for f in found:
        assert f["change"]["DataLoader"]["num_workers"] < 2


def test_sigkilled_worker_is_named(job):
    j = job("--workers", "2", "--persistent", "--item-ms", "10")
    j.wait_ready()
    victim = sorted(worker_pids(j.pid))[0]

    from loadertop.rules import Diagnoser
    from loadertop.sampler import Sampler

    sampler = Sampler([j.pid])
    diagnoser = Diagnoser()
    try:
        diagnoser.feed(sampler.tick())
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        found = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.5)
            found = [f for f in diagnoser.feed(sampler.tick()) if f.id == "worker_died"]
    finally:
        sampler.close()
    assert found, "worker_died not raised"
    assert found[0].evidence["worker_pid"] == victim
    assert found[0].evidence["signal"] == signal.SIGKILL
    assert "OOM" in found[0].suggestion

