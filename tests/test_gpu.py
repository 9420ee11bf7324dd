"""GPU paths with a fake at the NVML boundary, and the no-GPU behaviour for real."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from support.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    FakeNvml,
)
from support.jobs import PYTHON, loadertop, wait_for

from loadertop.outputs.report import build_report
from loadertop.probes.gpu import GpuProbe
from loadertop.rules import diagnose, diagnosed
from loadertop.sampler import Sampler


@pytest.mark.parametrize(
    "error,notice",
    [(NVML_ERROR_LIBRARY_NOT_FOUND, "no_gpu"), (NVML_ERROR_DRIVER_NOT_LOADED, "no_gpu"),
     (NVML_ERROR_NO_PERMISSION, "gpu_permission"), (NVML_ERROR_LIB_RM_VERSION_MISMATCH, "gpu_driver_mismatch")],
)
def test_init_failures_are_one_notice_each(error, notice):
    gpus, notices = GpuProbe(lib=FakeNvml(init_error=error)).sample()
    assert gpus == ()
    assert [n.id for n in notices] == [notice]
    if notice == "no_gpu":
        assert notices[0].message == "no NVIDIA driver found; GPU metrics off"
    else:
        assert notices[0].fix


def test_fields_the_gpu_does_not_support_are_none_not_zero():
    fake = FakeNvml(utilization=[55.0], unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"})
    (gpu,), notices = GpuProbe(lib=fake).sample()
    assert notices == ()
    assert gpu.utilization_percent == 55.0 and gpu.memory_total_bytes == 80 * 2**30
    assert gpu.power_watts is None and gpu.pcie_rx_bytes_per_s is None and gpu.pcie_tx_bytes_per_s is None
    assert gpu.power_limit_watts == 700.0 and gpu.name == "NVIDIA H100 80GB HBM3"


def test_per_process_utilization_where_supported():
    probe = GpuProbe(lib=FakeNvml(processes=[1234]))
    probe.sample()
    assert probe.process_utilization(0) == {1234: 40.0}
    unsupported = GpuProbe(lib=FakeNvml(processes=[1234], unsupported={"nvmlDeviceGetProcessUtilization"}))
    unsupported.sample()
    assert unsupported.process_utilization(0) == {}


def test_a_busy_gpu_lowers_the_severity_of_a_data_wait():
    # A loop that waits 30% for data while its GPU stays 95% busy loses less than the wait
    # says: input_bound is a warning there, critical beside a GPU at 20%. The GPU figures come
    # through the NVML boundary (the fake), as on a real machine.
    from dataclasses import replace

    from support.synth import TRAINER, host, snapshot, story, trainer

    def verdict_with(utilization: float):
        (gpu,), _ = GpuProbe(lib=FakeNvml(utilization=[utilization], processes=[TRAINER])).sample()
        snaps = story(20, lambda t: snapshot(t, [replace(trainer(workers=2, worker_cpu=97.0, wait=0.3, usable=8),
                                                         gpus=(0,))], host(), gpus=[gpu]))
        found = {f.id: f for f in diagnose(snaps)}
        return found["input_bound"]

    idle, busy = verdict_with(20.0), verdict_with(95.0)
    assert idle.severity == "critical" and busy.severity == "warning"
    assert busy.evidence["gpu_utilization_percent"] == 95.0
    assert "GPU utilization is 95%" in busy.title


@pytest.mark.live
def test_starving_trainer_on_a_gpu_story(job):
    """A real starved job, with NVML faked to list its trainer on GPU 0 while utilization
    falls: the trainer is mapped to the GPU, input_bound carries the GPU evidence and
    pin_memory_off fires (CPU torch runs no pin-memory thread)."""
    j = job("--workers", "1", "--persistent", "--item-ms", "25", "--batch-size", "8", "--step-ms", "10")
    j.wait_ready()
    fake = FakeNvml(gpus=2, utilization=[90.0, 70.0, 45.0, 30.0, 25.0, 22.0], processes=[j.pid])
    from loadertop.probes.stacks import StackSampler

    stacks = StackSampler(window_s=6)
    sampler = Sampler([j.pid], interval_s=0.5, gpu=GpuProbe(lib=fake), stacks=stacks)
    history = []
    try:
        for _ in range(14):
            history.append(sampler.tick())
            time.sleep(0.5)
        stacks.stop_after_window()
        stacks.flush(10)
        history.append(sampler.tick())
    finally:
        sampler.close()
    trainer = history[-1].trainers[0]
    assert trainer.gpus == (0,)  # GPU 1 runs nothing of ours
    findings = {f.id: f for f in diagnose(history, hold_s=2.0)}
    assert "input_bound" in findings, findings
    assert findings["input_bound"].evidence["gpu_utilization_percent"] < 40
    assert "pin_memory_off" in findings
    report = build_report(history, diagnosed(history, hold_s=2.0).diagnosis)
    gpus = report["trainers"][0]["gpus"]
    assert [g["index"] for g in gpus] == [0] and gpus[0]["utilization_percent"] is not None


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_container_pid_is_matched_through_nspid(job):
    """NVML inside a container reports the pid in the container's namespace: match NSpid."""
    r = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("pid namespaces are not permitted here")
    j = job("--workers", "1", "--persistent", "--item-ms", "5",
            cmd=["unshare", "-p", "-f", "--mount-proc", PYTHON])
    # The trainer: the process whose own children are the workers (unshare is above it).
    trainer = wait_for(lambda: next((p for p in _tree(j.pid) if _children_are_workers(p)), None), 60,
                       what="trainer")
    with open(f"/proc/{trainer}/status") as f:
        inner = int(f.read().split("NSpid:")[1].splitlines()[0].split()[-1])
    assert inner != trainer
    sampler = Sampler([j.pid], gpu=GpuProbe(lib=FakeNvml(processes=[inner])))
    try:
        snap = sampler.tick()
    finally:
        sampler.close()
    assert [(t.pid, t.gpus) for t in snap.trainers] == [(trainer, (0,))]


def _children_are_workers(pid: int) -> bool:
    from support.jobs import comm

    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return any(comm(int(c)) == "pt_data_worker" for c in f.read().split())
    except OSError:
        return False


def _tree(pid: int) -> list[int]:
    from support.jobs import descendants

    return [pid, *descendants(pid)]


def test_no_gpu_end_to_end(job):
    j = job("--workers", "1", "--persistent")
    j.wait_ready()
    r = loadertop("snapshot", str(j.pid), "--duration", "1", "--json", "--no-stacks")
    report = json.loads(r.stdout)
    assert report["trainers"][0]["gpus"] == []
    notice = next(n for n in report["notices"] if n["id"] == "no_gpu")
    assert "GPU metrics off" in notice["message"]
    assert "pin_memory_off" not in {f["id"] for f in report["findings"]}
