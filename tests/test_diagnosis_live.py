"""A worker killed under a live job is named, with its signal, as it happens. The CPU-side rules on
real workloads (healthy, small tensors, thread pools, respawns, copy-on-read, a small /dev/shm, two
jobs on two CPUs) are proven on their recordings: tests/test_scenarios.py, with live canaries in
tests/test_canaries.py."""

from __future__ import annotations

import os
import signal
import time

from support.jobs import state, wait_for, worker_pids


def test_sigkilled_worker_is_named(job):
    j = job("--workers", "2", "--persistent", "--item-ms", "10")
    j.wait_ready()
    victim = sorted(worker_pids(j.pid))[0]

    from loadertop.rules import Diagnoser
    from loadertop.sampler import Sampler

    sampler = Sampler([j.pid])
    diagnoser = Diagnoser()
    try:
        wait_for(lambda: victim in {w.pid for t in diagnoser_fed(diagnoser, sampler) for w in t.workers}, 30,
                 what="loadertop to see the worker")
        # The trainer is held while its worker is killed: torch reaps a dead worker within
        # ~0.2 s, and beside a CPU hog it did so before loadertop's exit watch got a CPU to read
        # how it died. Held, the worker stays a zombie: what is tested is that loadertop reads
        # its exit status and names it, not a race with the host's scheduler.
        os.kill(j.pid, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: state(victim) == "Z", 10, what="the worker to be a zombie")
        deadline = time.monotonic() + 20
        found = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.5)
            found = [f for f in diagnoser.feed(sampler.tick()) if f.id == "worker_died"]
    finally:
        os.kill(j.pid, signal.SIGCONT)
        sampler.close()
    assert found, "worker_died not raised"
    assert found[0].evidence["worker_pid"] == victim
    assert found[0].evidence["signal"] == signal.SIGKILL
    assert "OOM" in found[0].suggestion


def diagnoser_fed(diagnoser, sampler):
    """One tick, fed to the diagnoser: its trainers."""
    snap = sampler.tick()
    diagnoser.feed(snap)
    return snap.trainers
