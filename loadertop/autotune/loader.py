"""Changing a DataLoader's worker count and prefetch in place, where the batches cannot change.

torch's DataLoader (torch/utils/data/dataloader.py) lets `num_workers` and `prefetch_factor`
be set after it is built; they take effect when it builds its next iterator. Only these two
are ever set here, and, with thread tuning, `worker_init_fn` (wrapped: the user's runs, then
the workers' pools are capped, autotune/threads.py) and the loop's torch.set_num_threads
(at once). Thread counts can change float reductions in their last bits, never which items
the loop sees. What else a change must respect:

- With `persistent_workers=True` the loader keeps one iterator for its lifetime: a new count
  needs that iterator's workers shut down first, and then a new iterator is built where the
  untouched loop would only have reset the old one. Building one draws the workers' base
  seed from the loader's generator (the global RNG when it has none), which would shift
  every later shuffle; that draw is taken from a private generator instead, so the sampler
  sees exactly the RNG state it would have seen.
- A map-style loader's batches come from its sampler, not its workers (with `in_order`, the
  default): they do not depend on the count. An IterableDataset's do (each worker yields its
  own stream): it is tuned only where the user says it shards by worker.
- torchdata's StatefulDataLoader saves its place (`state_dict()`), which lets the count
  change mid-epoch: the state is the sampler's position and, per worker, the dataset's
  (none for a map-style dataset that keeps no state), so the same position with another
  count yields the same batches in the same order (tests/test_autotune_live.py proves it
  for the installed torchdata). Only there: an IterableDataset's workers each hold a place
  in their own stream, which no other count can take over (a switch repeated items), and
  a sampler that is not restored exactly is drawn again; those wait for the epoch's end.

Wrappers keep the DataLoader they wrap one attribute away (loadertop/wrapped.py), and settings
go to that one. torch is never imported here: its module is taken from the training script's.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager
from dataclasses import replace

from ..model import Knobs
from .threads import WorkerThreads, set_main_threads, user_worker_init


def knobs_of(loader, threads: bool = False) -> Knobs:
    """The loader's settings; with `threads`, the loop's torch threads and the workers' cap."""
    n = int(loader.num_workers)
    knobs = Knobs(n, loader.prefetch_factor if n else None)
    if not threads:
        return knobs
    torch = sys.modules.get("torch")
    fn = getattr(loader, "worker_init_fn", None)
    return replace(knobs, main_threads=torch.get_num_threads() if torch is not None else None,
                   worker_threads=fn.threads if isinstance(fn, WorkerThreads) and n else None)


def same_workers(a: Knobs, b: Knobs) -> bool:
    """a and b start the same workers: only the loop's threads differ (set at once)."""
    return (a.num_workers, a.prefetch_factor, a.worker_threads) == (b.num_workers, b.prefetch_factor, b.worker_threads)


def is_stateful(loader) -> bool:
    """torchdata's StatefulDataLoader (by name: torchdata is not imported here)."""
    return any(c.__name__ == "StatefulDataLoader" for c in type(loader).__mro__)


def why_not_tunable(loader, shards_by_worker: bool) -> str | None:
    """None when the tuner may change this loader's count, else why not (one warning)."""
    for attr in ("num_workers", "prefetch_factor", "persistent_workers", "dataset"):
        if not hasattr(loader, attr):
            return f"{type(loader).__name__} has no {attr}: not a torch DataLoader"
    dataset = loader.dataset
    iterable = _iterable(dataset)
    if iterable and not shards_by_worker:
        return (f"{type(dataset).__name__} is an IterableDataset: each worker yields its own stream, so the "
                "worker count changes what the loop sees; pass shards_by_worker=True if it shards by "
                "get_worker_info() so that the epoch yields the same items whatever the count")
    # batch_size=None: the loader yields what its dataset yields; a dataset that batches itself
    # (webdataset's `.batched(32)`, its documented idiom) yields batches, and the loop's steps
    # are measured as with any other.
    return None


def apply(loader, knobs: Knobs) -> bool:
    """Set knobs for the loader's next iterator; with persistent workers, shut the current
    iterator's workers down first. True when a persistent iterator was shut down (the next
    one must be built with `private_seed`)."""
    if knobs.main_threads is not None:
        set_main_threads(knobs.main_threads)
    if same_workers(knobs, knobs_of(loader, threads=True)):
        return False
    stopped = False
    iterator = getattr(loader, "_iterator", None)
    # torchdata's sampler draws its order when an iterator is made, and a new iterator makes
    # two where a persistent one reset makes one: a StatefulDataLoader's place is carried over
    # to the new count instead, so the next epoch's order is the one an untouched loop sees.
    place = None
    if loader.persistent_workers and iterator is not None:
        if knobs.num_workers and is_stateful(loader):
            place = loader.state_dict()
        loader._iterator = None  # first: a failed shutdown must not leave a dead iterator to reset
        iterator._shutdown_workers()
        stopped = True
    elif knobs.num_workers and is_stateful(loader) and getattr(loader, "next_iter_state", None):
        place = loader.next_iter_state  # a start that failed: its place, for the count it goes back to
    _set_workers(loader, knobs)
    if place is not None:
        loader.load_state_dict(translate_state(place, knobs.num_workers))
    return stopped


def _set_workers(loader, knobs: Knobs) -> None:
    loader.num_workers = knobs.num_workers
    if knobs.num_workers:
        loader.prefetch_factor = knobs.prefetch_factor
        now = getattr(loader, "worker_init_fn", None)
        if knobs.worker_threads is not None or isinstance(now, WorkerThreads):
            user = user_worker_init(now)
            loader.worker_init_fn = user if knobs.worker_threads is None else WorkerThreads(knobs.worker_threads, user)


def base_seed(loader) -> int:
    iterator = getattr(loader, "_iterator", None)
    return int(getattr(iterator, "_base_seed", 0) or 0) & 0x7FFF_FFFF_FFFF_FFFF


@contextmanager
def private_seed(loader, seed: int):
    """Build an iterator whose workers' base seed comes from a private generator: the RNG the
    sampler draws from is left as an untouched loop would leave it."""
    torch = sys.modules.get("torch")
    original = loader.generator
    if torch is None:
        yield
        return
    generator = torch.Generator()
    generator.manual_seed(seed)
    loader.generator = generator
    try:
        yield
    finally:
        loader.generator = original


def rng_states(loader) -> list | None:
    """The states of the generators an iterator's start may draw from (torch's global one,
    the loader's, its sampler's): a start that failed is tried again from the same draws, so
    the retry yields what the first try would have."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    sampler, batches = getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)
    generators = [getattr(loader, "generator", None), getattr(sampler, "generator", None),
                  getattr(getattr(batches, "sampler", None), "generator", None)]
    unique = {id(g): g for g in generators if g is not None and hasattr(g, "get_state")}
    return [(None, torch.get_rng_state())] + [(g, g.get_state()) for g in unique.values()]


def set_rng_states(states: list | None) -> None:
    torch = sys.modules.get("torch")
    for generator, state in states or ():
        if generator is None and torch is not None:
            torch.set_rng_state(state)
        else:
            generator.set_state(state)


@contextmanager
def quiet_worker_count():
    """torch warns at each iterator that more workers than CPUs may be slow: the tuner measured
    that count, and an I/O-bound loader gains from it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


def _iterable(dataset) -> bool:
    return any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__)


def _replays_the_same(sampler) -> bool:
    """A sampler whose place torchdata restores exactly: one with a state of its own, one of
    torchdata's (its iterator saves the permutation), or a sequential one. Any other is fast-
    forwarded by drawing it again, and a random one then draws another order."""
    if sampler is None:
        return True
    kind = type(sampler)
    return (hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")) \
        or kind.__module__.split(".")[0] == "torchdata" or kind.__name__ == "SequentialSampler"


def why_not_mid_epoch(loader) -> str | None:
    """None where a change mid-epoch is proven to keep the items and their order (a
    StatefulDataLoader over a map-style dataset that keeps no state, in order, whose
    sampler's place is restored exactly: tests/test_autotune_live.py), else why it waits
    for the epoch's end."""
    if not is_stateful(loader):
        return "only torchdata's StatefulDataLoader can carry its place over to another worker count"
    dataset = loader.dataset
    if _iterable(dataset):
        return (f"{type(dataset).__name__} is an IterableDataset: its workers' places in their streams do not "
                "carry over to another count")
    if hasattr(dataset, "state_dict"):
        return f"{type(dataset).__name__} keeps a state of its own per worker"
    if not getattr(loader, "in_order", True):
        return "the loader yields out of order (in_order=False)"
    sampler = getattr(loader, "sampler", None)
    if not _replays_the_same(sampler):
        return f"its sampler ({type(sampler).__name__}) would draw its order again on restore"
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and not _replays_the_same(batch_sampler) \
            and type(batch_sampler).__name__ != "BatchSampler":
        return f"its batch sampler ({type(batch_sampler).__name__}) would draw its order again on restore"
    return None


def can_switch_mid_epoch(loader, new: Knobs) -> bool:
    """This loader, now, from workers to workers: its saved place carries over to `new`."""
    if why_not_mid_epoch(loader) is not None or getattr(loader, "_iterator", None) is None:
        return False
    return loader.num_workers > 0 and new.num_workers > 0


def translate_state(state: dict, num_workers: int) -> dict:
    """A multi-process StatefulDataLoader's saved place, for `num_workers` workers: the main
    process's snapshot (the sampler's position) with the count changed, and no per-worker
    snapshot (a map-style dataset's workers keep none that matters), the next batch going to
    worker 0. KeyError where the format is not torchdata's as tested."""
    snapshot = state["_snapshot"]
    main = snapshot["_main_snapshot"]
    if main["_num_workers"] == num_workers:
        return state
    return {**state, "_snapshot": {**snapshot, "_main_snapshot": {**main, "_num_workers": num_workers},
                                   "_worker_snapshots": {}, "_last_yielded_worker_id": num_workers - 1}}


def switch(loader, knobs: Knobs):
    """Change a StatefulDataLoader's count mid-epoch: save its place, shut its workers down,
    restore the place with the new count. Returns (the iterator to go on with, None), or,
    where the new count could not start (a full /dev/shm), (an iterator at the count that
    ran, from the same place, the error). Raises only when that fails too: the loop must
    never be handed an iterator that is shut down."""
    ran = knobs_of(loader, threads=knobs.main_threads is not None)
    saved = loader.state_dict()
    state = translate_state(saved, knobs.num_workers)
    seed = base_seed(loader)
    iterator = loader._iterator
    loader._iterator = None
    iterator._shutdown_workers()
    try:
        return _restore(loader, knobs, state, seed), None
    except Exception as e:
        return _restore(loader, ran, saved, seed), e


def _restore(loader, knobs: Knobs, state: dict, seed: int):
    _set_workers(loader, knobs)
    if knobs.main_threads is not None:
        set_main_threads(knobs.main_threads)
    loader.load_state_dict(state)
    with private_seed(loader, seed), quiet_worker_count():
        return iter(loader)
