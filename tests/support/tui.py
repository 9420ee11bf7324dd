"""Driving the TUI in the tests: synthetic streams to show, and waiting on the app through its Pilot."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from support.synth import TRAINER, gpu, host, snapshot, story, trainer


def starved(seconds: int = 20, exit_at: int | None = None, trainers: int = 1):
    def make(t):
        out = []
        for k in range(trainers):
            tr = trainer(workers=2 + k, worker_cpu=97.0, wait=0.62, pid=TRAINER + 1000 * k)
            if exit_at is not None and t >= exit_at:
                tr = replace(tr, status="exited", workers=tuple(replace(w, status="exited") for w in tr.workers))
            out.append(tr)
        return snapshot(t, out, host(cpu=30.0))

    return story(seconds, make)


async def wait_until(pilot, predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)


def text_of(app, widget_type) -> str:
    return str(app.query_one(widget_type).render())


def moving(seconds: int = 40, with_gpu: bool = True):
    """A trainer whose data wait climbs 10% -> 80% while its GPU empties; worker 0's CPU climbs too."""
    def make(t):
        wait = 0.1 + 0.7 * t / (seconds - 1)
        tr = trainer(workers=2, worker_cpu=97.0, wait=wait, gpus=(0,) if with_gpu else ())
        tr = replace(tr, workers=(replace(tr.workers[0], cpu_percent=10.0 + 2 * t), *tr.workers[1:]))
        return snapshot(t, [tr], host(cpu=30.0 + t), gpus=[gpu(0, util=90.0 - 2 * t)] if with_gpu else [])

    return story(seconds, make)
