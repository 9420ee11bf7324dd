"""`loader = loadertop.watch(loader)`: exact data wait from inside the training script.

The writer's side; loadertop/probes/hook_files.py reads, and loadertop/hookfile.py defines
the file both read.

For clusters where ptrace (py-spy) is refused. The wrapper times each `next()` and writes
cumulative counters into a small fixed-layout file in /dev/shm (two pwrites, ~3 µs a batch),
which the monitor reads from outside without ptrace and without a network port. It imports
nothing heavy, never changes what the loader yields, and never raises into the training
loop: if the file cannot be written it warns once and does nothing more.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import secrets
import stat
import struct
import time
import warnings
from typing import Any

from ..hookfile import (
    CONFIG_AT,
    CONFIG_LEN_AT,
    COUNTERS_AT,
    DIRECTORY,
    HEADER,
    IN_NEXT_AT,
    MAGIC,
    SIZE,
    TAIL,
    hook_path,
)
from ..wrapped import innermost

_names = itertools.count()


def _warn(text: str) -> None:
    """A warning that never raises into the training script: with warnings as errors (`-W
    error`, a test suite's filters) it goes to the log instead."""
    try:
        warnings.warn(text, RuntimeWarning, stacklevel=4)
    except Exception:
        logging.getLogger("loadertop").warning("%s", text)


def _batch_bytes(batch, depth: int = 0) -> int:
    """Bytes of the tensors in a batch (nested lists, tuples, dicts), without importing torch."""
    if depth > 6:
        return 0
    if hasattr(batch, "element_size") and hasattr(batch, "nelement"):
        return int(batch.element_size() * batch.nelement())
    if isinstance(batch, dict):
        return sum(_batch_bytes(v, depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_batch_bytes(v, depth + 1) for v in batch)
    return 0


def _config(outer) -> dict:
    """The loader's settings, read from the DataLoader inside any wrapper (timm's, webdataset's,
    Accelerate's); where it comes from and what it waits on, from the loader the loop holds."""
    loader = innermost(outer)
    ctx = getattr(loader, "multiprocessing_context", None)
    dataset = getattr(loader, "dataset", None)
    return {
        "batch_size": getattr(loader, "batch_size", None),
        "num_workers": getattr(loader, "num_workers", None),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "dataset_class": type(dataset).__name__ if dataset is not None else None,
        # Without importing torch: an IterableDataset anywhere in the dataset's bases.
        "iterable": any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__) if dataset is not None
        else None,
        "multiprocessing_context": getattr(ctx, "_name", None) or (str(ctx) if ctx is not None else None),
        "dispatched": _dispatched(outer),
        "loop": _loop_of(outer),
        "worker_pids": [],
    }


# The framework a loader's class comes from: its settings are written in that framework's terms.
_LOOP_PACKAGES = {"accelerate": "accelerate", "torchdata": "torchdata", "lightning": "lightning",
                  "pytorch_lightning": "lightning", "transformers": "huggingface"}


def _loop_of(loader) -> str | None:
    return _LOOP_PACKAGES.get(type(loader).__module__.split(".")[0])


def _dispatched(loader) -> bool:
    """Accelerate's DataLoaderDispatcher on a rank other than 0: rank 0 loads this rank's
    batches and sends them, so this loop's wait is for rank 0, not for a loader of its own."""
    if type(loader).__name__ != "DataLoaderDispatcher":
        return False
    rank = getattr(getattr(loader, "state", None), "process_index", 0)
    return isinstance(rank, int) and rank != 0


def worker_pids(iterator) -> list[int]:
    """The worker processes of a torch DataLoader iterator (none for num_workers=0)."""
    try:
        return [int(p.pid) for p in getattr(iterator, "_workers", ()) if p.pid]
    except (TypeError, ValueError, AttributeError):
        return []


def _is_stale_own(path: str) -> bool:
    """A file at our path that an earlier process with our pid left behind: a regular file of
    ours, written before this process started."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        with open(path, "rb") as f:
            raw = f.read(HEADER.size)
        started = HEADER.unpack_from(raw, 0)[2] if len(raw) == HEADER.size and raw[:8] == MAGIC else 0.0
    except (OSError, struct.error):
        return False
    ours = _own_start()  # a stale file was written before this process started
    return ours is not None and started < ours - 1.0


def _own_start() -> float | None:
    """When this process started (seconds since the epoch), from /proc: the standard
    library only, as everything the training script imports."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _create(path: str) -> int:
    """Our own new file at path: O_EXCL, so that nothing planted there (a file another user
    can truncate under our mmap, a symlink, a FIFO) is ever used; a stale file of our own is
    replaced once."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        if not _is_stale_own(path):
            raise
        os.unlink(path)
        return os.open(path, flags, 0o644)


def _create_own(path: str) -> tuple[str, int]:
    """Our own new file at path, or beside it under a unique suffix where another user planted
    a file at that name (for a pid to come): squatting the name does not turn watch() off."""
    try:
        return path, _create(path)
    except FileExistsError:
        base = path[: -len(".hook")]
        for _ in range(8):
            other = f"{base}.{secrets.token_hex(4)}.hook"
            try:
                return other, _create(other)
            except FileExistsError:
                continue
        raise


class _Publisher:
    """Writes one loader's file with pwrite() on a descriptor, never through a mapping: a
    file truncated under the job (a cleanup script, an epilog) is then written again or
    fails as an OSError, where a store into a mapping past the end kills the job (SIGBUS)."""

    def __init__(self, name: str, config: dict, directory: str) -> None:
        self.path = hook_path(os.getpid(), name, directory)
        config = {**config, "name": name}  # the file's name may carry a suffix (_create_own)
        self.config = config
        self.fd: int | None = None
        self.config_len = 0
        self.wait_ns = 0
        self.batches = 0
        self.first = 0.0
        self.last = 0.0
        self.batch_bytes = 0
        self.started = self.checked = time.time()
        self.tuner: Any = None  # the in-place tuner of this name (watch(..., tune=True)), kept across re-watching
        try:
            self.path, fd = _create_own(self.path)
            try:
                os.fchmod(fd, 0o644)  # readable by a monitor running as another user
                # Real pages, not a sparse file: a full /dev/shm is an OSError here, not an
                # error on the first batch.
                os.posix_fallocate(fd, 0, SIZE)
                if os.fstat(fd).st_uid != os.geteuid():
                    raise OSError(f"{self.path} is not ours")
                self.started = time.time()
                self._write_page(fd)
            except BaseException:
                os.close(fd)
                _unlink(self.path)
                raise
            self.fd = fd
            atexit.register(self.close)
        except (OSError, ValueError) as e:
            self.fd = None
            _warn(f"loadertop.watch disabled: cannot write {self.path} ({e})")

    def _write_page(self, fd: int) -> None:
        """The whole page: header, counters and settings (at creation, and again where the
        file was truncated under the job)."""
        blob = json.dumps(self.config, default=str).encode()
        if len(blob) > SIZE - CONFIG_AT:
            blob = b"{}"
        self.config_len = len(blob)
        os.pwrite(fd, HEADER.pack(MAGIC, os.getpid(), self.started, self.last or self.started, self.wait_ns,
                                  self.batches, self.first, self.last, self.batch_bytes, len(blob), 0.0), 0)
        os.pwrite(fd, blob, CONFIG_AT)

    def _check(self, now: float) -> None:
        """Once a second: a file truncated under the job (its own user's cleanup) is written
        whole again, so the monitor reads it from the next tick on."""
        self.checked = now
        if self.fd is None:
            return
        try:
            if os.fstat(self.fd).st_size < SIZE:
                os.posix_fallocate(self.fd, 0, SIZE)
                self._write_page(self.fd)
        except Exception:  # the hook must never break training: it stops publishing
            self._stop()

    def _write(self, data: bytes, offset: int) -> None:
        if self.fd is None:
            return
        try:
            os.pwrite(self.fd, data, offset)
        except Exception:  # the hook must never break training: it stops publishing
            self._stop()

    def _stop(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def writing(self) -> bool:
        return self.fd is not None

    def publish_workers(self, pids: list[int]) -> None:
        """A new iterator started its workers: say which processes they are."""
        if pids != self.config.get("worker_pids"):
            self.publish_config({**self.config, "worker_pids": pids})

    def publish_tune(self, state: dict) -> None:
        """The tuner's state and its latest decisions: as many as fit the page."""
        decisions = state.get("decisions", [])
        for keep in (len(decisions), 8, 4, 2, 1, 0):
            tune = {**state, "decisions": decisions[len(decisions) - keep:] if keep else []}
            if self.publish_config({**self.config, "tune": tune}):
                return

    def publish_config(self, config: dict) -> bool:
        """False when the settings do not fit the page (they are not written)."""
        if self.fd is None:
            return False
        try:
            blob = json.dumps(config, default=str).encode()
        except (TypeError, ValueError):
            return False
        if len(blob) > SIZE - CONFIG_AT:
            return False  # too many to list: the monitor falls back to the workers it finds
        self.config = config
        # The bytes first, then their length: a reader never sees a length past them.
        self._write(blob, CONFIG_AT)
        self.config_len = len(blob)
        self._write(struct.pack("<I", len(blob)), CONFIG_LEN_AT)
        return self.fd is not None

    def entering(self) -> None:
        if self.fd is not None:
            self._write(struct.pack("<d", time.time()), IN_NEXT_AT)

    def idle(self) -> None:
        """Not waiting for a batch any more, and none came (the loop does something else)."""
        if self.fd is not None:
            self._write(struct.pack("<d", 0.0), IN_NEXT_AT)

    def record(self, waited_ns: int, batch, delivered: bool = True) -> None:
        if self.fd is None:
            return
        try:
            now = time.time()
            self.wait_ns += waited_ns
            self.batches += delivered
            if delivered and self.batches == 1:
                self.first = now
                self.batch_bytes = _batch_bytes(batch)
            self.last = now
            # The counters, the batch size, the settings' length and "not in next()": one write.
            data = TAIL.pack(now, self.wait_ns, self.batches, self.first, self.last, self.batch_bytes,
                             self.config_len, 0.0)
        except Exception:  # the hook must never break training
            self._stop()
            return
        self._write(data, COUNTERS_AT)
        if now - self.checked >= 1.0:
            self._check(now)

    def close(self) -> None:
        if self.fd is not None:
            self._stop()
            _unlink(self.path)
        if _live.get(self.path) is self:
            del _live[self.path]


# This process's publishers by path: a loader watched again under its name (re-created each
# epoch, resumed from a state_dict, rebuilt by a framework) goes on with the same figures.
_live: dict[str, _Publisher] = {}


def publisher(name: str, config: dict, directory: str = DIRECTORY) -> _Publisher:
    path = hook_path(os.getpid(), name, directory)
    pub = _live.get(path)
    if pub is not None and pub.writing:
        kept = {k: pub.config[k] for k in ("worker_pids", "tune", "name") if k in pub.config}
        pub.publish_config({**config, "worker_pids": [], **kept})
        return pub
    pub = _Publisher(name, config, directory)
    if pub.writing:
        _live[path] = pub
    return pub


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Iterator:
    __slots__ = ("_it", "_pub")

    def __init__(self, it, pub: _Publisher) -> None:
        self._it = it
        self._pub = pub

    def __iter__(self):
        return self

    def __next__(self):
        self._pub.entering()
        t0 = time.perf_counter_ns()
        try:
            batch = next(self._it)  # StopIteration and errors pass through untouched
        except BaseException:
            self._pub.record(time.perf_counter_ns() - t0, None, delivered=False)
            raise
        self._pub.record(time.perf_counter_ns() - t0, batch)
        return batch

    def __getattr__(self, name):
        return getattr(self._it, name)


class _TunedIterator(_Iterator):
    """An epoch under the in-place tuner: each batch's timing goes to it as well, and a
    StatefulDataLoader may go on with another iterator mid-epoch."""

    __slots__ = ("_tuner", "_loader")

    def __init__(self, it, pub: _Publisher, tuner, loader) -> None:
        super().__init__(it, pub)
        self._tuner = tuner
        self._loader = loader

    def __next__(self):
        self._pub.entering()
        t0 = time.perf_counter_ns()
        try:
            batch = next(self._it)
        except StopIteration:
            self._pub.record(time.perf_counter_ns() - t0, None, delivered=False)
            self._tuner.end()
            raise
        except BaseException:
            self._pub.record(time.perf_counter_ns() - t0, None, delivered=False)
            raise
        now = time.perf_counter_ns()
        self._pub.record(now - t0, batch)
        if self._tuner.delivered(now, now - t0):
            self._it = self._tuner.switch(self._loader)
        return batch


class WatchedLoader:
    """Iterates exactly like the wrapped loader; every other attribute is the loader's."""

    def __init__(self, loader, name: str | None = None, directory: str = DIRECTORY, tune: bool = False,
                 shards_by_worker: bool = False, tune_threads: bool = True) -> None:
        self._loader = loader
        self._name = name or f"loader{next(_names)}"
        self._directory = directory
        self._shards_by_worker = shards_by_worker
        self._tune_threads = tune_threads
        self._pub = publisher(self._name, _config(loader), directory)
        self._tuner = tuner_of(self._pub, self._name, shards_by_worker, tune_threads) if tune else None

    def __reduce__(self):
        # A copy (copy.copy, a framework re-instantiating its loaders, a pickle to another
        # process) is the loader watched again under the same name: in this process it goes
        # on with the same figures and tuner, elsewhere it starts its own file.
        return (WatchedLoader, (self._loader, self._name, self._directory, self._tuner is not None,
                                self._shards_by_worker, self._tune_threads))

    def __iter__(self):
        tuner = self._tuner
        if tuner is None:
            it = iter(self._loader)
            self._pub.publish_workers(worker_pids(it))
            return _Iterator(it, self._pub)
        tuner.boundary(self._loader)
        try:
            with tuner.building():
                it = iter(self._loader)
        except Exception as e:
            it = tuner.rebuild(self._loader, e)  # at the setting that ran, or the loop's own error
        self._pub.publish_workers(worker_pids(it))
        tuner.begin(self._loader, it)
        return _TunedIterator(it, self._pub, tuner, self._loader)

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        if name in _OWN or name.startswith("__"):  # not set yet (a copy being built): never recurse
            raise AttributeError(name)
        return getattr(self._loader, name)


_OWN = frozenset({"_loader", "_name", "_directory", "_pub", "_tuner", "_shards_by_worker", "_tune_threads"})


def tuner_of(pub: _Publisher, name: str, shards_by_worker: bool = False, threads: bool = True):
    """The publisher's tuner (one per watched name: a loader watched again goes on with it)."""
    if pub.tuner is None:
        try:
            from ..autotune.tuner import Tuner  # only with tune=True: nothing else pays for it

            pub.tuner = Tuner(name, pub.publish_tune, lambda: {**pub.config, "batch_bytes": pub.batch_bytes or None},
                              shards_by_worker=shards_by_worker, workers_of=worker_pids, threads=threads)
        except Exception as e:  # the hook must never break training: watched, not tuned
            _warn(f"loadertop tune {name}: off ({type(e).__name__}: {e})")
            return None
    return pub.tuner
