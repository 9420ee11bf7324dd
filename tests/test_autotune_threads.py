"""The tuner's thread knobs (issue 35): the training loop's torch threads, set at once, and a
cap on each worker's pools, set through a worker_init_fn that runs the user's own first.
On real torch DataLoaders and real workers; the live convergence is in test_threads_live.py."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from support.synth import TRAINER, host, process, snapshot, story, trainer
from torch.utils.data import DataLoader, Dataset

from loadertop.autotune import loader as L
from loadertop.autotune import ranks_board
from loadertop.autotune import tuner as TU
from loadertop.autotune.policy import Stretch, with_workers
from loadertop.autotune.propose import propose
from loadertop.autotune.threads import WorkerThreads, user_worker_init
from loadertop.model import Decision, Knobs
from loadertop.rules import plan as P
from loadertop.rules.measure import measure


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_thread_knobs_read_as_the_log_and_the_report_say_them():
    two = Knobs(2, 2, main_threads=2)
    one = Knobs(2, 2, main_threads=1)
    assert Decision("try", two, one, reason="why").text() == "main_threads 2 -> 1: trying (why)"
    capped = Knobs(2, 2, main_threads=2, worker_threads=1)
    assert two.arrow(capped) == "worker_threads as set -> 1"
    assert capped.arrow(two) == "worker_threads 1 -> as set"
    assert capped.label() == "num_workers=2 prefetch_factor=2 main_threads=2 worker_threads=1"
    assert capped.short(two) == "num_workers=2 worker_threads=1"
    assert capped.as_dict() == {"num_workers": 2, "prefetch_factor": 2, "main_threads": 2, "worker_threads": 1}
    assert Knobs(2, 2).as_dict() == {"num_workers": 2, "prefetch_factor": 2}  # not tuned: as before
    # Another rank reads the same setting back from the node's board.
    entry = ranks_board.Entry(0, 3, 0.2, capped, None, None, 0.0)
    assert ranks_board.Entry.from_json(entry.as_json()).setting == capped


def test_a_worker_count_move_keeps_the_threads_it_runs_at():
    knobs = Knobs(2, 2, main_threads=1, worker_threads=1)
    assert with_workers(knobs, 4) == Knobs(4, 2, main_threads=1, worker_threads=1)
    assert with_workers(knobs, 0) == Knobs(0, None, main_threads=1)


def test_the_loops_threads_change_at_once_and_the_workers_cap_wraps_the_users_init(torch_threads):
    def user(worker_id):
        pass

    loader = DataLoader(list(range(8)), num_workers=2, worker_init_fn=user)
    torch.set_num_threads(2)
    now = L.knobs_of(loader, threads=True)
    assert now == Knobs(2, 2, main_threads=2, worker_threads=None)
    assert L.knobs_of(loader) == Knobs(2, 2)  # opted out: no thread knobs at all
    # The loop's threads alone: no worker is restarted, the change is at once.
    assert L.apply(loader, Knobs(2, 2, main_threads=1)) is False
    assert torch.get_num_threads() == 1 and loader.worker_init_fn is user
    L.apply(loader, Knobs(2, 2, main_threads=1, worker_threads=1))
    fn = loader.worker_init_fn
    assert isinstance(fn, WorkerThreads) and fn.threads == 1 and fn.user_fn is user
    assert L.knobs_of(loader, threads=True) == Knobs(2, 2, main_threads=1, worker_threads=1)
    L.apply(loader, Knobs(3, 2, main_threads=1, worker_threads=None))  # back: the user's own, unwrapped
    assert loader.worker_init_fn is user and user_worker_init(WorkerThreads(1, WorkerThreads(2, user))) is user


class Pools(Dataset):
    """What each worker's pools are: torch's threads, the environment a library reads."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([torch.get_num_threads(), int(os.environ.get("OMP_NUM_THREADS", "0")),
                             int(os.environ.get("SEEN_USER_INIT", "0"))])


def mark_user_init(worker_id):
    os.environ["SEEN_USER_INIT"] = "1"
    torch.set_num_threads(4)  # a user's init that asks for more: the cap is the last word


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_the_cap_reaches_real_workers_after_the_users_init(context, torch_threads):
    loader = DataLoader(Pools(), batch_size=1, num_workers=2, worker_init_fn=mark_user_init,
                        multiprocessing_context=context)
    L.apply(loader, Knobs(2, 2, worker_threads=1))
    rows = torch.cat(list(loader))
    assert rows.tolist() == [[1, 1, 1]] * 4
    assert pickle.loads(pickle.dumps(loader.worker_init_fn)).threads == 1


def main_pool(t):
    # The loop's 2 busy threads on 2 CPUs beside 2 workers, and the loop waits (test_plan's case).
    tr = trainer(workers=2, worker_cpu=70.0, wait=0.22, usable=2, cpu_set=(0, 1),
                 main=process(TRAINER, 150.0, threads=6, busy_threads=2, runqueue_wait_s_per_s=0.3))
    return snapshot(t, [tr], host(2, cpu=100.0))


def pools(t):
    # Each of 2 workers runs 3 busy threads on 2 CPUs: their pools oversubscribe them.
    tr = trainer(workers=2, worker_cpu=95.0, wait=0.5, usable=2, cpu_set=(0, 1),
                 main=process(TRAINER, 30.0))
    workers = tuple(process(w.pid, 95.0, worker_id=w.worker_id, busy_threads=3, runqueue_wait_s_per_s=1.2,
                            doing="D.__getitem__ (d.py:9)") for w in tr.workers)
    return snapshot(t, [type(tr)(**{**vars(tr), "workers": workers})], host(2, cpu=100.0))


def measured(make):
    history = story(30, make)
    return measure(history[-1], history[-1].trainers[0], [s.trainers[0] for s in history], {}, None)


def stretch(knobs, make):
    return Stretch(knobs, 100, 10.0, 2.0, (10.0,) * 6, measured=measured(make))


def test_the_first_move_is_fewer_loop_threads_where_they_take_the_workers_cpus():
    moves = propose(stretch(Knobs(2, 2, main_threads=2), main_pool), persistent=True).moves
    assert moves and moves[0][0] == Knobs(2, 2, main_threads=1), moves
    assert "busy threads" in moves[0][1]
    # Opted out (no thread knobs): never a thread move.
    assert all(k.main_threads is None and k.worker_threads is None
               for k, _ in propose(stretch(Knobs(2, 2), main_pool), persistent=True).moves)


def test_workers_whose_pools_oversubscribe_are_capped_at_one_thread_each():
    moves = propose(stretch(Knobs(2, 2, main_threads=1), pools), persistent=True).moves
    assert (Knobs(2, 2, main_threads=1, worker_threads=1)) in [k for k, _ in moves], moves


def queued(worker_cpu: float, cpus_busy: float | None = None):
    """2 CPU-bound workers that queue for 2 CPUs, the loop on one thread waiting 90 % for them
    (bench/advice.py's main_threads job after the thread limit); cpus_busy: the CPUs' use,
    where other processes take what the trainer does not."""
    def make(t):
        kw = {"cpus_busy": cpus_busy} if cpus_busy is not None else {}
        tr = trainer(workers=2, worker_cpu=worker_cpu, wait=0.9, usable=2, cpu_set=(0, 1),
                     main=process(TRAINER, 15.0, threads=4, busy_threads=1), **kw)
        workers = tuple(process(w.pid, worker_cpu, worker_id=w.worker_id, runqueue_wait_s_per_s=0.3,
                                doing="D.__getitem__ (d.py:9)") for w in tr.workers)
        host_cpu = 93.0 if cpus_busy is None else 100.0
        return snapshot(t, [type(tr)(**{**vars(tr), "workers": workers})], host(2, cpu=host_cpu))
    return make


def test_workers_that_queue_for_their_own_cpus_get_one_more_tried_while_the_loop_waits_for_them():
    # The model caps workers that queue for the CPUs; on 2 CPUs one more measured about +10 %
    # (BENCHMARKS §9): the tuner tries it, and keeps it only if measured faster.
    own = stretch(Knobs(2, 2, main_threads=1), queued(85.0))
    assert P.make_plan(own.measured).cause == P.TOO_MANY_WORKERS
    moves = propose(own, persistent=True).moves
    assert [k for k, _ in moves] == [Knobs(3, 2, main_threads=1)], moves
    assert "queue for the CPUs" in moves[0][1]
    # Where other processes take the CPUs, one more worker would only take a smaller share.
    shared = stretch(Knobs(2, 2, main_threads=1), queued(40.0, cpus_busy=2.0))
    assert P.make_plan(shared.measured).cause == P.BUSY_HOST
    busy = propose(shared, persistent=True).moves
    assert all(k.num_workers <= 2 for k, _ in busy), busy


def test_a_tuner_that_opted_out_has_no_thread_knobs(monkeypatch, torch_threads):
    t = TU.Tuner("train", lambda d: None, dict, threads=False)
    loader = DataLoader(list(range(8)), num_workers=2)
    assert t._knobs(loader) == Knobs(2, 2)
    monkeypatch.setenv("LOADERTOP_TUNE_THREADS", "0")
    assert TU.Tuner("train", lambda d: None, dict)._knobs(loader) == Knobs(2, 2)
    monkeypatch.delenv("LOADERTOP_TUNE_THREADS")
    assert TU.Tuner("train", lambda d: None, dict)._knobs(loader).main_threads == torch.get_num_threads()
