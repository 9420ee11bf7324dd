"""A worker killed under a live job is named, with its signal, as it happens. The CPU-side rules on
real workloads (healthy, small tensors, thread pools, respawns, copy-on-read, a small /dev/shm, two
jobs on two CPUs) are proven on their recordings: tests/test_scenarios.py, with live canaries in
tests/test_canaries.py."""

from __future__ import annotations

import os
import signal
import time

from support.jobs import worker_pids


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
