"""Where the in-place tuner looks next, from the kept setting's measurement (pure): with
thread tuning, fewer threads where they oversubscribe the CPUs (the loop's torch threads where
they take the CPUs its workers need, the workers' pools where they do); the plan's setting
(the throughput model, rules/plan.py; for workers that wait on I/O, its worker count rounded up
to a power of two, so noise in one reading does not change the trial); then the neighbours in
worker count that the measurement makes plausible: more workers only while the loop waits for
data as the field calls input-bound, fewer only while the trainer's CPUs are contended and
fewer workers would still keep up. One knob per move: the Explorer keeps only what measures
faster."""

from __future__ import annotations

from dataclasses import replace

from ..model import Knobs
from ..rules import plan as P
from ..rules import thresholds as T
from ..rules.measure import Measured
from ..rules.throughput import Setting, Terms, predict, terms
from .policy import MIN_MEASURED_GAIN, Proposal, Stretch, neighbours, with_workers

# Run-queue wait of the loop's busy threads, seconds per second, from which its CPUs count as
# contended: the workers' bursts preempt the step's own threads.
CONTENDED_RUNQUEUE = T.MAIN_QUEUED_SHARE
CONTENDED_CPU_SHARE = 0.9  # or the trainer keeps this share of its CPUs busy


def propose(stretch: Stretch, persistent: bool, stateful: bool = False) -> Proposal:
    """Where to look next, from the kept setting's measurement: fewer threads where they
    oversubscribe, the plan's setting, then the neighbours the measurement makes plausible.
    `stateful`: torchdata's StatefulDataLoader, whose sampler draws its order once in the main
    process and twice with workers: a change between 0 and some workers would change the
    batches, so its worker count stays on its side of 0."""
    m = stretch.measured
    knobs = stretch.knobs
    now = Setting(knobs.num_workers, 0, knobs.prefetch_factor or 2)
    plan = P.make_plan(m)
    moves: list[tuple[Knobs, str]] = _thread_moves(m, knobs, plan)
    predicted: dict[Knobs, float] = {}
    if plan.gain is not None:  # the plan's thread change, where a move is it
        for k, _ in moves:
            if (k.main_threads != knobs.main_threads and plan.cause == P.MAIN_THREADS) or (
                    k.worker_threads != knobs.worker_threads and plan.cause == P.THREADS):
                predicted[k] = plan.gain
    low = 1 if knobs.num_workers > 0 else 0
    top = P.most_workers(m, now, plan.cause) if knobs.num_workers or not stateful else 0
    batch = P.batch_bytes(m)
    t = terms(m)

    def allowed(k: Knobs, most: int = top) -> bool:
        setting = Setting(k.num_workers, 0, k.prefetch_factor or 2)
        return low <= k.num_workers <= most and P.fits(m, setting, batch) is None

    if (plan.changes_workers and (not plan.thread_change or knobs.main_threads is not None) and plan.gain is not None
            and plan.gain >= MIN_MEASURED_GAIN):
        suggested = with_workers(knobs, plan.chosen.num_workers)
        if plan.chosen.num_workers:
            suggested = replace(suggested, prefetch_factor=plan.chosen.prefetch_factor)
        gain = plan.gain
        if suggested.num_workers > knobs.num_workers and (coarse := _on_the_coarse_ladder(t, plan, top)):
            rounded = replace(suggested, num_workers=coarse[0])
            if allowed(rounded):
                suggested, gain = rounded, coarse[1]
        if allowed(suggested) and (suggested.num_workers > 0 or not (persistent or stateful)):
            moves.append((suggested, f"the model predicts {gain:+.0%} steps/s"))
            predicted[suggested] = gain
    down, up = neighbours(knobs.num_workers, low, top)
    wait = m.wait or 0.0
    # More workers only while the loop waits as the field calls input-bound (a few % is
    # the loop receiving batches, which more workers do not shorten).
    if up is not None and wait >= T.DATA_WAIT_WARNING and plan.cause not in P.OVERSUBSCRIBED:
        k = with_workers(knobs, up)
        if allowed(k):
            moves.append((k, f"the loop waits {wait:.0%} of the time for data"))
    elif up is None and wait >= T.DATA_WAIT_CRITICAL and P.workers_queue_for_their_own_cpus(m, plan.cause):
        # The model caps workers that queue for the CPUs (more would queue longer), yet where
        # the loop waits this much for them and only the job's own workers take the CPUs,
        # one more worker measured about +10 % on 2 CPUs (BENCHMARKS §9, main_threads: the
        # CPUs are shared differently, not more of them used). A trial settles it; never
        # past a quota, another process or a thread pool, where it is the slow epoch.
        most = P.workers_the_cpus_run(m, now)
        _, step = neighbours(knobs.num_workers, low, most)
        if step is not None and allowed(more := with_workers(knobs, step), most):
            moves.append((more, f"the loop waits {wait:.0%} of the time for its workers, which queue for the CPUs: "
                                f"one more may share them better"))
    if down is not None and _contended(m) and t is not None:
        k = with_workers(knobs, down)
        # Only where fewer still keep up: a loop that would wait for them gains nothing.
        keeps_up = predict(t, Setting(down, 0, k.prefetch_factor or 2)).bound != "workers"
        if keeps_up and allowed(k):
            moves.append((k, f"the loop's threads wait {m.main_runqueue:.2f} s/s for a CPU while the "
                             f"trainer keeps {_busy(m)} CPUs busy"))
    if wait < T.DATA_WAIT_WARNING:  # the loop hardly waits: fewer is the likelier gain
        moves.sort(key=lambda mv: mv[0].num_workers > knobs.num_workers)
    if t is not None:  # the model's figure for the neighbours it did not propose itself
        current = predict(t, now)
        for k, _ in moves:
            if k not in predicted and k.num_workers != knobs.num_workers:
                predicted[k] = predict(t, Setting(k.num_workers, 0, k.prefetch_factor or 2)).gain_over(current)
    return Proposal(moves=tuple(moves), predicted=tuple(predicted.items()))


def _on_the_coarse_ladder(t: Terms | None, plan: P.Plan, top: int) -> tuple[int, float] | None:
    """The plan's worker count rounded up to a power of two (within top), and its predicted
    gain, for workers that wait on I/O where the model predicts it no slower: None where it stays.

    The plan's count is the cheapest within T.TOLERANCE of the best, so an estimate at a band's
    edge reads one count in one run and the next in another (the balanced ranks' 3.5 workers
    read 3, then 4: BENCHMARKS §10). Powers of two put one edge per doubling, not one per count.
    Only up, within the cap, only for workers that wait on I/O (the plan's cause), and only
    where the extra workers fit: there they cost memory, not speed, and a trial keeps them only
    if it measures faster."""
    n = plan.chosen.num_workers
    up = min(top, 1 << (n - 1).bit_length()) if n > 1 else n
    if up <= n or t is None or plan.cause != P.LOADER_IO:
        return None  # workers that compute would only queue for the CPUs
    current = predict(t, plan.now)
    chosen, rounded = predict(t, plan.chosen), predict(t, replace(plan.chosen, num_workers=up))
    if rounded.relative(current) < chosen.relative(current):
        return None
    return up, rounded.gain_over(current)


def _thread_moves(m: Measured, knobs: Knobs, plan: P.Plan) -> list[tuple[Knobs, str]]:
    """With thread tuning (the kept setting names the loop's threads): the loop's threads
    down to the plan's limit where they take the CPUs its workers need; the workers' pools
    capped at one thread each where they oversubscribe the CPUs."""
    moves: list[tuple[Knobs, str]] = []
    if knobs.main_threads is None:
        return moves
    if knobs.main_threads > 1 and P.main_threads_take_cpus(m):
        limit = plan.chosen.main_threads or P.main_threads_limit(m)
        if limit < knobs.main_threads:
            moves.append((replace(knobs, main_threads=limit),
                          f"the loop runs {m.main_busy_threads:.1f} busy threads that take the CPUs its workers need"))
    lw = m.loader
    if knobs.num_workers and knobs.worker_threads is None and lw is not None and plan.cause == P.THREADS:
        moves.append((replace(knobs, worker_threads=1),
                      f"each worker runs {lw.busy_threads or 0:.1f} busy threads: their pools oversubscribe the CPUs"))
    return moves


def _busy(m: Measured) -> str:
    used = m.budget.used
    return "n/a" if used is None else f"{used:.1f} of {m.budget.cpus:.1f}"


def _contended(m: Measured) -> bool:
    """The loop's threads queue for CPUs, or the trainer keeps its CPUs busy: fewer workers
    may give the step its CPUs back."""
    threads = max(1.0, m.main_busy_threads)
    if m.main_runqueue / threads >= CONTENDED_RUNQUEUE:
        return True
    used = m.budget.used
    return used is not None and used >= CONTENDED_CPU_SHARE * m.budget.cpus
