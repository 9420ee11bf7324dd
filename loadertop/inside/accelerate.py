"""Accelerate's `prepare()` keeps a watched loader watched.

`prepare()` rebuilds each DataLoader it is given (sharded across ranks, batches moved to the
device) and passes anything else through as it is, so a watched loader, which is not a
DataLoader, would come back unsharded. Taught once, in a process that has imported Accelerate,
`Accelerator.prepare`, `prepare_data_loader` and `skip_first_batches` take the loader out of a
watched one, let Accelerate rebuild it, and hand the rebuilt loader back watched under the same
name: the same file, the same figures going on. Calls with no watched loader are Accelerate's
own, untouched. Accelerate is never imported here: its class is taken from the modules the
training script already loaded.

Taught when loadertop is imported after Accelerate, and again at each watch(). In
`accelerator.prepare(model, loadertop.watch(loader))` the bound `prepare` is looked up before
watch() runs, so a first such call can reach Accelerate's own `prepare`: its per-object
`_prepare_one`, looked up later, is taught too, and catches the loader there.
"""

from __future__ import annotations

import functools
import sys

from .hook import WatchedLoader

_TAUGHT = "_loadertop_keeps_watched"


def teach() -> None:
    """Teach Accelerate's Accelerator, when the training script has imported it."""
    module = sys.modules.get("accelerate.accelerator")
    accelerator = getattr(module, "Accelerator", None)
    if accelerator is None or getattr(accelerator, _TAUGHT, False):
        return
    accelerator.prepare = _prepare(accelerator.prepare)
    for name in ("_prepare_one", "prepare_data_loader", "skip_first_batches"):
        if callable(getattr(accelerator, name, None)):
            setattr(accelerator, name, _first(getattr(accelerator, name)))
    setattr(accelerator, _TAUGHT, True)


def _rewatch(watched: WatchedLoader, rebuilt):
    """The loader Accelerate built, under the watched one's name: the publisher goes on."""
    if rebuilt is watched._loader or isinstance(rebuilt, WatchedLoader):
        return watched
    rewatched = WatchedLoader(rebuilt, watched._name, watched._directory)
    rewatched._tuner = watched._tuner  # the same name's publisher: the same tuner goes on
    return rewatched


def _prepare(prepare):
    @functools.wraps(prepare)
    def prepare_keeping_watch(self, *args, **kwargs):
        if not any(isinstance(a, WatchedLoader) for a in args):
            return prepare(self, *args, **kwargs)
        inner = tuple(a._loader if isinstance(a, WatchedLoader) else a for a in args)
        result = prepare(self, *inner, **kwargs)
        # One object back for one given, a tuple in the same order for several.
        results = result if len(args) > 1 else (result,)
        if not isinstance(results, tuple) or len(results) != len(args):
            return result  # not the shape this was written for: Accelerate's answer, as it is
        out = tuple(_rewatch(a, r) if isinstance(a, WatchedLoader) else r for a, r in zip(args, results, strict=True))
        return out if len(args) > 1 else out[0]

    return prepare_keeping_watch


def _first(method):
    """A method whose first argument is a loader and whose result is the loader rebuilt, or
    the same loader (`_prepare_one`'s second pass gives back what it does not prepare)."""

    @functools.wraps(method)
    def keeping_watch(self, loader, *args, **kwargs):
        if not isinstance(loader, WatchedLoader):
            return method(self, loader, *args, **kwargs)
        return _rewatch(loader, method(self, loader._loader, *args, **kwargs))

    return keeping_watch
