"""What py-spy's output says, pure: the trainer's main thread classified sample by sample
(waiting for a worker's batch, loading in the main process, or compute), a window of raw
samples turned into a data wait, and a worker's dump into what it is doing and its
DataLoader arguments. No process is started here (see stacks.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..model import WAITING_FOR_INDICES, DataWait
from ..numbers import int_or_none
from ..text import printable, printable_or_none
from ..vocabulary import Loop

# --- classification of the trainer's main thread (pure) ---------------------------

WAIT = "worker_wait"  # blocked until a worker's batch arrives
MAIN = "main_process"  # loading work the main process does itself
ITERABLE = "iterable"  # of MAIN, samples in an IterableDataset's fetcher (not a category of its own)
# Of WAIT, samples waiting for another rank to send this rank's batch: Accelerate's
# DataLoaderDispatcher (dispatch_batches) loads on rank 0 and broadcasts to every rank.
DISPATCHED = "dispatched"
# The framework whose loop the samples run in, by a file its frames show; the first that
# matches (the Hugging Face Trainer fetches through Accelerate's loaders, Lightning can wrap
# a StatefulDataLoader: the outer loop is the one whose settings the user writes).
LOOPS: tuple[tuple[Loop, tuple[str, ...]], ...] = (
    ("huggingface", ("transformers/trainer.py",)),
    ("lightning", ("lightning/pytorch/loops/", "pytorch_lightning/loops/")),
    ("accelerate", ("accelerate/data_loader.py",)),
    ("torchdata", ("torchdata/stateful_dataloader/",)),
)
_LOOP_KEY = "loop "
SUBCOUNTS = (ITERABLE, DISPATCHED, *(_LOOP_KEY + name for name, _ in LOOPS))  # not categories: not in a total
BREAKDOWN = ("forward", "backward", "optimizer", "device_sync", "other")

# Inside DataLoader.__next__, frames that are work in the main process, not waiting.
_MAIN_WORK = (
    "SingleProcessDataLoaderIter",  # num_workers=0 (torchdata's _Stateful… too): the dataset runs here
    "rebuild_storage",  # unpickling tensors passed through shared memory
    "torch/multiprocessing/reductions.py",
    "_process_data",
    "pin_memory.py",  # pinning in the main thread
    "collate.py",
    "fetch.py",
)


# A sample whose innermost frame is one of these is blocked, not working: receiving a
# batch, or the file-descriptor hand-shake with a worker's resource sharer (which waits
# for that worker's GIL) counts as waiting for the worker.
_BLOCKED_LEAF = (
    "multiprocessing/connection.py",
    "multiprocessing/resource_sharer.py",
    "multiprocessing/reduction.py",
    "selectors.py",
    "socket.py",
    "threading.py",
    "queue.py",
)


def is_data_next(frame: str) -> bool:
    """torch's DataLoader iterator handing out a batch: by its file, or by its class where the
    file name came bare (py-spy shortens names relative to the target's sys.path, and a job
    chrooted into another root without a mount namespace gave `dataloader.py:733`)."""
    return ".__next__ (" in frame and ("torch/utils/data/dataloader.py" in frame
                                       or "DataLoaderIter.__next__ (dataloader.py:" in frame)


def is_dispatch(frame: str) -> bool:
    """Accelerate's DataLoaderDispatcher handing out a batch: rank 0 loads it (torch's
    __next__ further in), the other ranks wait for its broadcast."""
    return "accelerate/data_loader.py" in frame and ("DataLoaderDispatcher." in frame or "_fetch_batches (" in frame)


def classify_main(frames: list[str]) -> str:
    """The category of one sample of the trainer's main thread (frames root → leaf)."""
    for i, frame in enumerate(frames):
        if is_data_next(frame):
            rest = frames[i + 1 :]
            if rest and any(b in rest[-1] for b in _BLOCKED_LEAF):
                return WAIT
            return MAIN if any(m in f for f in rest for m in _MAIN_WORK) else WAIT
    if any(is_dispatch(f) for f in frames):
        return WAIT  # waiting for the dispatching rank's broadcast
    for frame in frames:
        if "torch/autograd/" in frame or "Tensor.backward (" in frame:
            return "backward"
        if "torch/optim/" in frame:
            return "optimizer"
        if "synchronize (" in frame or "torch/cuda/streams.py" in frame:
            return "device_sync"
        if "Module._call_impl (" in frame or "Module._wrapped_call_impl (" in frame:
            return "forward"
    return "other"


_THREAD = re.compile(r"thread \((0x[0-9a-fA-F]+|\d+)\): ")


def parse_raw(text: str, main_tid: int) -> dict[str, int]:
    """Counts per category of the main thread's samples in `py-spy record --format raw
    --threads` output. Lines: `[process …;]thread (TID): NAME;frame;…;frame COUNT`."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        m = _THREAD.search(stack)
        if m is None or m.group(1) != str(main_tid):
            continue
        frames = stack[m.end() :].split(";")[1:]  # the first item is the thread's name
        category = classify_main(frames)
        counts[category] = counts.get(category, 0) + int(count)
        if category == MAIN and "_IterableDatasetFetcher" in stack:
            counts[ITERABLE] = counts.get(ITERABLE, 0) + int(count)
        if category == WAIT and not any(is_data_next(f) for f in frames):
            counts[DISPATCHED] = counts.get(DISPATCHED, 0) + int(count)
        loop = loop_of(stack)
        if loop is not None:
            counts[_LOOP_KEY + loop] = counts.get(_LOOP_KEY + loop, 0) + int(count)
    return counts


def loop_of(stack: str) -> str | None:
    """The framework whose loop one sample's frames run in; None for a loop of the script's own."""
    for name, files in LOOPS:
        if any(f in stack for f in files):
            return name
    return None


def data_wait_from_counts(counts: dict[str, int], window_s: float, stalled_for_s: float) -> DataWait:
    total = sum(v for k, v in counts.items() if k not in SUBCOUNTS)
    if not total:
        return DataWait(None, None, None, (), 0, window_s, stalled_for_s)
    wait, main = counts.get(WAIT, 0), counts.get(MAIN, 0)
    # The loop most samples ran in: a framework's loop shows in every sample (or every fetch)
    # of it; a helper the script borrows from one shows now and then.
    loops: dict[Loop, int] = {name: counts.get(_LOOP_KEY + name, 0) for name, _ in LOOPS}
    return DataWait(
        fraction=(wait + main) / total,
        worker_wait_fraction=wait / total,
        main_process_fraction=main / total,
        breakdown=tuple((c, counts.get(c, 0) / total) for c in BREAKDOWN),
        samples=total,
        window_s=window_s,
        stalled_for_s=stalled_for_s,
        iterable=True if counts.get(ITERABLE) else None,
        dispatched_fraction=counts[DISPATCHED] / total if counts.get(DISPATCHED) else None,
        loop=max(loops.items(), key=lambda item: item[1])[0] if any(loops.values()) else None,
    )


# --- what a worker is doing (pure) -------------------------------------------------

_LIBRARY_PARTS = ("/lib/python", "site-packages", "dist-packages", "<frozen")


def _is_library(filename: str) -> bool:
    return any(p in filename for p in _LIBRARY_PARTS)


def _frame_label(frame: dict) -> str:
    return f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: int | None
    num_workers: int | None
    persistent_workers: bool | None
    dataset_class: str | None
    doing: str | None
    # Its other Python threads (queue feeder, resource sharer): busy at times, never a pool.
    python_threads: frozenset[int] = frozenset()
    read_at: float | None = None  # when the dump was taken (epoch seconds)
    iterable: bool | None = None  # its loader reads an IterableDataset
    # The worker loop its main thread runs (torch's, torchdata's…): None where it runs none,
    # which is how a process that is not a DataLoader worker looks.
    worker_loop: str | None = None


def _local(frame: dict, name: str) -> str | None:
    for item in frame.get("locals") or ():
        if item.get("name") == name:
            return item.get("repr")
    return None


def worker_doing(frames: list[dict]) -> str:
    """From a worker's main thread (frames leaf → root, as py-spy dumps them)."""
    names = [f.get("name") or "" for f in frames]
    files = [f.get("filename") or "" for f in frames]
    fetch = next((i for i, fn in enumerate(files) if fn.endswith("torch/utils/data/_utils/fetch.py")), None)
    if fetch is not None:
        below = frames[:fetch]  # what the fetcher called: the dataset, then its callees
        if any((f.get("filename") or "").endswith("_utils/collate.py") for f in below):
            return "collating"
        if not below:
            return "fetching"
        entry = below[-1]  # what the fetcher called: the dataset's __getitem__ or __iter__
        user = [f for f in below if not _is_library(f.get("filename") or "")]
        deepest = user[0] if user else entry  # the innermost frame of the user's own code
        if deepest is entry:
            return _frame_label(entry)
        return f"{entry.get('name')} > {_frame_label(deepest)}"
    if any(n.endswith("_worker_loop") for n in names):
        loop = names.index(next(n for n in names if n.endswith("_worker_loop")))
        callees = " ".join(names[:loop])
        if "Queue.get" in callees:
            return WAITING_FOR_INDICES
        if "put" in callees or "_send" in callees or "dumps" in callees:
            return "sending a batch"
        return "in the worker loop"
    return _frame_label(frames[0]) if frames else "unknown"


def parse_dump(text: str, pid: int) -> WorkerInfo | None:
    """The worker's main thread from `py-spy dump --json [--locals]`; None for anything else
    (null, {}, [1]: a py-spy of another version, a cut-short output)."""
    try:
        threads = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(threads, list) or not all(isinstance(t, dict) for t in threads):
        return None
    for t in threads:
        frames = t.get("frames")
        if frames is not None and (not isinstance(frames, list) or not all(isinstance(f, dict) for f in frames)):
            return None
        if not all(isinstance(item, dict) for f in frames or () for item in f.get("locals") or ()):
            return None
    try:
        return _parse_threads(threads, pid)
    except (TypeError, AttributeError, ValueError):
        return None


MAX_COUNT = 65536  # worker ids and counts: anything larger is not torch's (a process may show any locals)


def _count(text: str | None) -> int | None:
    value = int_or_none(text)
    return value if value is not None and 0 <= value < MAX_COUNT else None


def _parse_threads(threads: list[dict], pid: int) -> WorkerInfo | None:
    main = next((t for t in threads if t.get("os_thread_id") == pid), None)
    if main is None:
        main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    if main is None:
        return None
    frames = main.get("frames") or []
    loop = next((f for f in frames if (f.get("name") or "").endswith("_worker_loop")), None)
    dataset = _local(loop, "dataset") if loop else None
    persistent = _local(loop, "persistent_workers") if loop else None
    return WorkerInfo(
        worker_id=_count(_local(loop, "worker_id")) if loop else None,
        num_workers=_count(_local(loop, "num_workers")) if loop else None,
        persistent_workers={"True": True, "False": False}.get(persistent or ""),
        # Names the process chose (its classes, functions, files): printable before they are shown.
        dataset_class=printable(dataset[1:].split(" ", 1)[0]) if dataset and dataset.startswith("<") else None,
        doing=printable(worker_doing(frames)),
        python_threads=frozenset(
            t["os_thread_id"] for t in threads if t is not main and isinstance(t.get("os_thread_id"), int)
        ),
        iterable=_fetcher_kind(frames),
        worker_loop=printable_or_none(loop.get("short_filename") or loop.get("filename")) if loop else None,
    )


def _fetcher_kind(frames: list[dict]) -> bool | None:
    """True for an IterableDataset's fetcher in the stack, False for a map-style one."""
    names = " ".join(f.get("name") or "" for f in frames)
    if "_IterableDatasetFetcher" in names:
        return True
    if "_MapDatasetFetcher" in names:
        return False
    return None
