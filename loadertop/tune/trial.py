"""One `loadertop tune` trial, run as `python -m loadertop.tune.trial CONFIG_JSON` in a fresh
child process: import the user's factory, build a DataLoader with one configuration, warm
it up and time a window of it. Loadertop's own process never imports torch or user code.

It talks to the parent on stdout, one JSON object per line:
  {"event": "loaded", ...}        the factory returned a dataset
  {"event": "first_batch", "s"}   seconds from creating the iterator to the first batch
  {"event": "window"}             warm-up over: the measured window starts
  {"event": "progress", ...}      about twice a second
  {"event": "result", ...}        the window's figures
  {"event": "error", ...}         what went wrong, with the user's frames summarized
After the result it keeps the loader (and its workers) alive until stdin closes, so the
parent can read the workers' memory one last time.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from typing import TypedDict


class TrialConfig(TypedDict):
    """What `loadertop tune` hands this script (as JSON in argv[1]): one setting to time."""

    factory: str  # "module:function" returning the dataset
    collate: str | None  # "module:function", or None for the default collate
    batch_size: int | None  # None: the factory's, else 1
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    per_step_ms: float | None  # a pause per batch, as a GPU step would leave the CPUs free
    warmup_s: float
    window_s: float

# Exit codes the parent reads: the user's code failed, or the loader did.
EXIT_FACTORY, EXIT_LOADER = 3, 4
CHUNKS = 5  # the window is cut into chunks: their spread is the noise of its rate
# DataLoader keywords a factory may return with its dataset; the ones tune sets are refused.
TUNED = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def user_frames(tb) -> list[str]:
    """The frames of a traceback outside torch, loadertop and the standard library: where in
    the user's code it went wrong, innermost last."""
    skip = (os.path.dirname(__file__).rsplit(os.sep, 1)[0], os.path.dirname(os.__file__), "site-packages/torch/")
    mine = [f for f in traceback.extract_tb(tb) if not any(s in f.filename for s in skip)]
    return [f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in mine[-3:]]


def fail(stage: str, error: BaseException, code: int) -> None:
    frames = user_frames(error.__traceback__)
    # A worker's exception reaches the main process re-raised with the worker's traceback as
    # text: its last "File" line is where the user's code failed.
    text = str(error).strip()
    if "Original Traceback" in text:
        found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
        if found:
            path, line, name = found[-1]
            frames = [f"{os.path.basename(path)}:{line} in {name}"]
        message = text.splitlines()[-1]  # "ValueError: the user's message"
    else:
        message = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    emit("error", stage=stage, message=message, where=frames)
    sys.exit(code)


def load_factory(spec: str):
    """`module.path:name` or `path/to/file.py:name`."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(os.path.basename(target)[:-3], target)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    factory = getattr(module, name, None)
    if factory is None:
        raise AttributeError(f"{target} has no {name!r}")
    if not callable(factory):
        raise TypeError(f"{spec} is a {type(factory).__name__}, not a callable")
    return factory


def dataset_and_kwargs(made):
    """A factory returns a Dataset, a (dataset, kwargs) pair, or a dict with a "dataset" key
    and more DataLoader keywords (batch_size, collate_fn, sampler, ...)."""
    from torch.utils.data import Dataset, IterableDataset

    kwargs: dict = {}
    if isinstance(made, dict):
        kwargs = dict(made)
        made = kwargs.pop("dataset", None)
    elif isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], dict):
        made, kwargs = made[0], dict(made[1])
    if not isinstance(made, (Dataset, IterableDataset)) and not (
        hasattr(made, "__getitem__") and hasattr(made, "__len__")
    ):
        raise TypeError(
            f"the factory returned {type(made).__name__}, not a Dataset: return a Dataset, "
            "(dataset, dataloader_kwargs) or {'dataset': dataset, **dataloader_kwargs}"
        )
    fixed = sorted(k for k in kwargs if k in TUNED)
    if fixed:
        raise TypeError(f"the factory sets {', '.join(fixed)}: leave those to tune")
    return made, kwargs


def batch_len(batch, default: int) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    for _ in range(8):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            if not hasattr(batch[0], "shape") and not isinstance(batch[0], (list, tuple, dict)):
                return len(batch)
            batch = batch[0]
        else:
            break
    return default


def run(cfg: TrialConfig) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # no shadowing of the user's modules
    try:
        sys.path.insert(0, os.getcwd())
        factory = load_factory(cfg["factory"])
    except BaseException as e:  # noqa: BLE001 - any failure of the user's import is reported
        fail("import", e, EXIT_FACTORY)
    try:
        dataset, kwargs = dataset_and_kwargs(factory())
        if collate := cfg.get("collate"):
            kwargs["collate_fn"] = load_factory(collate)
    except BaseException as e:  # noqa: BLE001
        fail("factory", e, EXIT_FACTORY)

    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)  # the loop only receives batches; its threads would blur the workers'
    batch_size = cfg.get("batch_size") or kwargs.pop("batch_size", None) or 1
    kwargs.pop("batch_size", None)
    workers = cfg["num_workers"]
    loader_kwargs = dict(kwargs, batch_size=batch_size, num_workers=workers, pin_memory=cfg["pin_memory"])
    if workers > 0:
        loader_kwargs.update(prefetch_factor=cfg["prefetch_factor"], persistent_workers=True)
    try:
        length = len(dataset)
    except TypeError:
        length = None
    emit("loaded", dataset=type(dataset).__name__, length=length, batch_size=batch_size,
         kwargs=sorted(kwargs), cuda=torch.cuda.is_available())
    step_s = (cfg.get("per_step_ms") or 0) / 1000.0
    try:
        loader = DataLoader(dataset, **loader_kwargs)
        started = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        emit("first_batch", s=time.perf_counter() - started)
        epochs = 0

        def next_batch():
            nonlocal it, epochs
            try:
                return next(it)
            except StopIteration:  # a short dataset: the next epoch, workers kept
                epochs += 1
                it = iter(loader)
                return next(it)

        warm_until = time.perf_counter() + cfg["warmup_s"]
        while time.perf_counter() < warm_until:
            if step_s:
                time.sleep(step_s)
            batch = next_batch()
        emit("window")
        chunk_s = cfg["window_s"] / CHUNKS
        t0 = time.perf_counter()
        end = t0 + cfg["window_s"]
        batches = samples = 0
        wait = 0.0
        chunks = []  # (seconds, batches, samples) of each chunk of the window
        chunk_start, chunk_batches, chunk_samples = t0, 0, 0
        last_progress = t0
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            if step_s:  # the training step: the GPU works, the CPUs stay free for the workers
                time.sleep(step_s)
            w0 = time.perf_counter()
            batch = next_batch()
            now = time.perf_counter()
            wait += now - w0
            n = batch_len(batch, batch_size)
            batches += 1
            samples += n
            chunk_batches += 1
            chunk_samples += n
            if now - chunk_start >= chunk_s:
                chunks.append((now - chunk_start, chunk_batches, chunk_samples))
                chunk_start, chunk_batches, chunk_samples = now, 0, 0
            if now - last_progress >= 0.5:
                emit("progress", batches=batches, samples=samples, elapsed=now - t0)
                last_progress = now
        elapsed = time.perf_counter() - t0
        if chunk_batches and time.perf_counter() - chunk_start >= chunk_s / 2:
            chunks.append((time.perf_counter() - chunk_start, chunk_batches, chunk_samples))
    except BaseException as e:  # noqa: BLE001 - a worker's crash, a bad collate, a full /dev/shm
        fail("loader", e, EXIT_LOADER)
    emit("result", batches=batches, samples=samples, window_s=elapsed, wait_s=wait, epochs=epochs,
         chunks=chunks, batch_size=batch_size)
    sys.stdin.read()  # hold the workers until the parent has read their memory


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
