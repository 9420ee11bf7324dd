"""What runs inside the user's training process: `loadertop.watch()` and its hook file, the
framework adapters (Lightning, Hugging Face, Accelerate) and the fetch gaps they measure.

Everything here imports only the standard library, the framework it adapts and the hook
file's format (loadertop/hookfile.py), and nothing on the monitor's side imports it
(tests/test_layering.py): a change to how the monitor reads /proc is never a change to code
that runs in every watched job. The one way out is `watch(..., tune=True)`, which loads the
in-place tuner (loadertop/autotune) when it is asked for.
"""

from __future__ import annotations

import sys

from ..hookfile import DIRECTORY
from .hook import WatchedLoader


def watch(loader, name: str | None = None, directory: str = DIRECTORY, tune: bool = False,
          shards_by_worker: bool = False, tune_threads: bool = True) -> WatchedLoader:
    """Wrap a DataLoader so that loadertop reads its exact data wait. Returns the wrapper.

    tune=True: measure num_workers and prefetch_factor in place while the job trains, and
    keep what is measured faster (loadertop/autotune). shards_by_worker=True: the loader's
    IterableDataset shards its items by worker so that the epoch yields the same items
    whatever the count (without it, an IterableDataset is watched but not tuned).
    tune_threads=False (or LOADERTOP_TUNE_THREADS=0): the tuner leaves thread counts alone
    (the loop's torch threads and the workers' pools, which it tunes by default; a thread
    count can change float reductions in their last bits)."""
    if "accelerate.accelerator" in sys.modules:
        from .accelerate import teach

        teach()  # accelerator.prepare(watched) then shards the loader and keeps it watched
    return WatchedLoader(loader, name, directory, tune=tune, shards_by_worker=shards_by_worker,
                         tune_threads=tune_threads)


__all__ = ["watch", "WatchedLoader"]
