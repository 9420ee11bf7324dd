"""The thread knobs of the in-place tuner: the training loop's torch threads, and a cap on
the pools each DataLoader worker may start.

torch.set_num_threads takes effect at once in the process that calls it: the loop's threads
change between two batches. A worker's pools are set when it starts: WorkerThreads is a
worker_init_fn that runs the user's own, then caps what the worker may start: torch's pool,
the BLAS and OpenMP pools already loaded (threadpoolctl, where installed: a worker forked
from the trainer inherits pools it cannot resize through the environment), and, through the
environment, the pools of libraries the worker loads later. It is a module-level class so
that spawn-started workers unpickle it. torch is never imported here: its module is the
training script's.
"""

from __future__ import annotations

import os
import sys

# What a library reads when it starts its pool in the worker (OpenMP, MKL, OpenBLAS, numexpr).
POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def set_main_threads(n: int) -> None:
    """The loop's torch threads, from now on (no-op without torch loaded)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def limit_pools(n: int) -> None:
    """Cap this process's thread pools at n: torch's, those already loaded, those to come."""
    for name in POOL_VARIABLES:
        os.environ[name] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(n)
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:
        return
    threadpool_limits(limits=n)


class WorkerThreads:
    """worker_init_fn: the user's own first (its seeds, its setup), then the pools capped."""

    def __init__(self, threads: int, user_fn=None) -> None:
        self.threads = threads
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        limit_pools(self.threads)

    def __repr__(self) -> str:
        return f"WorkerThreads({self.threads}, {self.user_fn!r})"


def user_worker_init(fn):
    """The user's worker_init_fn, under any cap the tuner put around it."""
    while isinstance(fn, WorkerThreads):
        fn = fn.user_fn
    return fn
