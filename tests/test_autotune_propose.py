"""Where the in-place tuner looks first (autotune/propose.py), on synthetic measurements: the
model's jump in worker count, and how it stays the same when the measurement moves within its
noise. The thread moves are in test_autotune_threads.py, the live runs in test_autotune_live.py
and bench/ranks.py."""

from __future__ import annotations

from support.synth import TRAINER, host, process, replace, snapshot, story, trainer

from loadertop.autotune.policy import Stretch
from loadertop.autotune.propose import propose
from loadertop.model import Knobs
from loadertop.rules import plan as P
from loadertop.rules.measure import measure


def one_worker(wait: float, worker_cpu: float, cpus: int = 2) -> Stretch:
    """A loop on 1 worker that waits `wait` of its time for it; the worker busy worker_cpu %."""
    def make(t):
        tr = trainer(workers=1, worker_cpu=worker_cpu, wait=wait, usable=cpus, cpu_set=tuple(range(cpus)),
                     main=process(TRAINER, 30.0, threads=4, busy_threads=1))
        # A worker that waits on I/O is seen asleep (state S) most ticks; one that computes, runnable.
        asleep = worker_cpu < 50.0
        tr = replace(tr, workers=tuple(replace(w, status="sleeping" if asleep else "running") for w in tr.workers))
        return snapshot(t, [tr], host(cpus, cpu=40.0))
    history = story(30, make)
    m = measure(history[-1], history[-1].trainers[0], [s.trainers[0] for s in history], {}, None)
    return Stretch(Knobs(1, 2), 100, 10.0, wait * 10.0, (10.0,) * 6, measured=m)


def first_move(s: Stretch) -> int:
    moves = propose(s, persistent=True).moves
    assert moves and "the model predicts" in moves[0][1], moves
    return moves[0][0].num_workers


def test_a_model_estimate_within_its_noise_gives_the_same_first_trial():
    # An I/O-bound worker: the plan's cheapest count within its band reads 3 at one data wait
    # and 4 at a slightly longer one (the balanced ranks of BENCHMARKS §10, run to run).
    # The tuner's jump rounds up to a power of two, so both runs try the same count.
    lower, higher = one_worker(0.60, 10.0), one_worker(0.65, 10.0)
    assert (P.make_plan(lower.measured).chosen.num_workers, P.make_plan(higher.measured).chosen.num_workers) == (3, 4)
    assert first_move(lower) == first_move(higher) == 4
    # Past 4 the next edge is a doubling away: 5 is tried as 8 (I/O waits; 8 fit 2 CPUs' cap).
    longer = one_worker(0.74, 10.0)
    assert P.make_plan(longer.measured).chosen.num_workers == 5
    assert first_move(longer) == 8


def test_workers_that_would_queue_for_the_cpus_keep_the_models_count():
    # Workers that compute as well as wait (cause `loader`) and CPU-bound ones on 2 CPUs keep
    # the model's 3 and 2: the rounding never adds workers that would queue for the CPUs.
    busy = one_worker(0.70, 60.0)
    assert P.make_plan(busy.measured).chosen.num_workers == 3
    assert first_move(busy) == 3
    cpu_bound = one_worker(0.70, 95.0)
    assert P.make_plan(cpu_bound.measured).chosen.num_workers == 2
    assert first_move(cpu_bound) == 2


def test_each_move_carries_the_models_predicted_gain_where_it_gives_one():
    # The trial's decisions carry it, so the advice can show the measured gain beside it.
    s = one_worker(0.70, 60.0)
    proposal = propose(s, persistent=True)
    predicted = dict(proposal.predicted)
    first, why = proposal.moves[0]
    assert why == f"the model predicts {predicted[first]:+.0%} steps/s"
    assert predicted[first] == P.make_plan(s.measured).gain
    assert all(isinstance(g, float) for g in predicted.values())
