"""Reads the files `loadertop.watch()` publishes in a trainer's /dev/shm: exact data wait
without ptrace. Keeps recent readings per loader to give the wait over a rolling window.

/dev/shm is shared by every user of the host, so a hook file is untrusted input: it is
opened without following links or blocking (a FIFO), must be a regular file of the hook's
size owned by the trainer's user, and every field is checked; a file that fails is a notice,
never an exception in the tick. Files whose process is long gone are removed.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

from .. import notices as N
from ..hookfile import CONFIG_AT, HEADER, MAGIC, PREFIX, SIZE, SUFFIX, prefix_of
from ..model import DataWait, Decision, Knobs, LoaderConfig, Notice, TuneState
from ..numbers import LARGEST
from ..vocabulary import LOOP_NAMES, TUNE_ACTIONS, TUNE_PHASES, Loop
from . import procfs

# Listing /dev/shm is not for every tick: with torch's file_system sharing strategy it holds
# a file per shared tensor (thousands), and killed jobs leave their semaphores there.
HOOK_RESCAN_S = 5.0
# Files of processes gone this long are removed (a process in another pid namespace that
# shares our /dev/shm looks gone to us: its heartbeat keeps its file).
STALE_SWEEP_S = 60.0
STALE_AFTER_S = 3600.0
MAX_WORKER_PIDS = 4096
MAX_PID = 2**31 - 1  # a pid is a positive int32
# Files read per trainer and tick: a loop has a few loaders; thousands planted under its
# names must not make a tick expensive.
MAX_HOOK_FILES = 32
# Reads again of a file whose contents did not parse (a write in progress), a moment apart: at
# most MAX_HOOK_FILES x 1.5 ms a tick where every file is damaged.
TORN_READS = 2
TORN_WAIT_S = 0.0005


class HookError(ValueError):
    """A file under a hook's name that is not a valid hook of the trainer."""


def _int(value: object, name: str, low: int = 0, high: int = 2**31) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HookError(f"{name} is not a count")
    return value


def _bool(value: object, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise HookError(f"{name} is not true/false")
    return value


def _str(value: object, name: str, longest: int = 200) -> str | None:
    if value is not None and (not isinstance(value, str) or len(value) > longest):
        raise HookError(f"{name} is not a short text")
    return valid_utf8(value) if value is not None else None


def valid_utf8(text: str) -> str:
    """Text that encodes as UTF-8: JSON's `\ud800` escapes decode to lone surrogates, which
    every later encode (a scrape, a report) would fail on; they become U+FFFD here."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _loop(value: object) -> Loop | None:
    return None if value is None else _choice(value, "loop", LOOP_NAMES)


MAX_DECISIONS = 64
Word = TypeVar("Word", bound=str)


def _number(value: object, name: str, low: float = 0.0, high: float = 1e15) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise HookError(f"{name} is not a number in range")
    return float(value)


def _knobs(value: object, name: str) -> Knobs | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise HookError(f"{name} is not a setting")
    workers = _int(value.get("num_workers"), f"{name}.num_workers", high=MAX_WORKER_PIDS)
    if workers is None:
        raise HookError(f"{name} has no num_workers")
    return Knobs(workers, _int(value.get("prefetch_factor"), f"{name}.prefetch_factor", high=1 << 16),
                 main_threads=_int(value.get("main_threads"), f"{name}.main_threads", high=1 << 16),
                 worker_threads=_int(value.get("worker_threads"), f"{name}.worker_threads", high=1 << 16))


def _choice(value: object, name: str, allowed: tuple[Word, ...]) -> Word:
    for word in allowed:
        if value == word:
            return word
    raise HookError(f"{name} is {str(value)[:20]!r}, not one of {', '.join(allowed)}")


def parse_tune(raw: object) -> TuneState | None:
    """The tuner's state as `watch(..., tune=True)` publishes it, every field checked."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise HookError("tune is not an object")
    decisions = raw.get("decisions") or []
    if not isinstance(decisions, list) or len(decisions) > MAX_DECISIONS:
        raise HookError("tune.decisions is not a short list")
    parsed = []
    for d in decisions:
        if not isinstance(d, dict):
            raise HookError("a tune decision is not an object")
        parsed.append(Decision(
            _choice(d.get("action"), "a tune decision's action", TUNE_ACTIONS), _knobs(d.get("from"), "from"),
            _knobs(d.get("to"), "to"), _number(d.get("measured_gain"), "measured_gain", -1.0, 1e6),
            _number(d.get("noise"), "noise", 0.0, 1e6), _str(d.get("reason"), "reason", 500) or "",
            epoch=_int(d.get("epoch"), "epoch") or 0, batch=_int(d.get("batch"), "batch", high=int(LARGEST)) or 0,
            at=_number(d.get("at"), "at") or 0.0,
            predicted=_number(d.get("predicted_gain"), "predicted_gain", -1.0, 1e6)))
    return TuneState(state=_choice(raw.get("state"), "tune.state", TUNE_PHASES),
                     setting=_knobs(raw.get("setting"), "tune.setting"),
                     started_with=_knobs(raw.get("started_with"), "tune.started_with"),
                     epoch=_int(raw.get("epoch"), "tune.epoch") or 0,
                     steps_per_s=_number(raw.get("steps_per_s"), "tune.steps_per_s"),
                     cost_s=_number(raw.get("cost_s"), "tune.cost_s"),
                     reason=_str(raw.get("reason"), "tune.reason", 500) or "", decisions=tuple(parsed))


def parse_config(blob: bytes) -> dict:
    """The hook's loader settings, every field checked; unknown fields dropped."""
    if not blob:
        return {}
    try:
        raw = json.loads(blob)
    except (ValueError, RecursionError) as e:
        raise HookError(f"its settings are not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise HookError("its settings are not an object")
    pids = raw.get("worker_pids") or []
    if not isinstance(pids, list) or len(pids) > MAX_WORKER_PIDS:
        raise HookError("worker_pids is not a list of pids")
    return {
        "batch_size": _int(raw.get("batch_size"), "batch_size"),
        "num_workers": _int(raw.get("num_workers"), "num_workers", high=MAX_WORKER_PIDS),
        "prefetch_factor": _int(raw.get("prefetch_factor"), "prefetch_factor", high=1 << 16),
        "pin_memory": _bool(raw.get("pin_memory"), "pin_memory"),
        "persistent_workers": _bool(raw.get("persistent_workers"), "persistent_workers"),
        "dataset_class": _str(raw.get("dataset_class"), "dataset_class"),
        "iterable": _bool(raw.get("iterable"), "iterable"),
        "dispatched": _bool(raw.get("dispatched"), "dispatched"),
        "loop": _loop(raw.get("loop")),
        "multiprocessing_context": _str(raw.get("multiprocessing_context"), "multiprocessing_context", 64),
        "worker_pids": [_int(p, "a worker pid", low=1) for p in pids],
        "tune": parse_tune(raw.get("tune")),
        "name": _str(raw.get("name"), "name", 64),
    }


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) and v >= 0 for v in values)


def read_hook(path: str, owner: int | None = None) -> dict | None:
    """One hook file: None if it is gone; HookError if it is not a valid hook (of `owner`'s,
    when given).

    The trainer rewrites its file in place with plain writes, so a read can land in the middle
    of one (half of an 8-byte time, new settings beside the old ones' length): contents that do
    not parse are read again, a moment later, before the file is called damaged (a trainer
    descheduled mid-write on a busy host tore two reads in a row). A damaged file stays so."""
    for attempt in range(TORN_READS + 1):
        raw = _read_bytes(path, owner)
        if raw is None:
            return None
        try:
            return _parsed(raw, path)
        except HookError:
            if attempt == TORN_READS:
                raise
            time.sleep(TORN_WAIT_S * (attempt + 1))
    raise AssertionError("unreachable")


def _read_bytes(path: str, owner: int | None) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HookError(f"it cannot be opened safely ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HookError("it is not a regular file")
        if st.st_size > SIZE:
            raise HookError(f"it is larger than {SIZE} bytes")
        if owner is not None and st.st_uid != owner:
            raise HookError(f"it belongs to user {st.st_uid}, not to the trainer's user {owner}")
        return os.read(fd, SIZE)
    finally:
        os.close(fd)


def _parsed(raw: bytes, path: str) -> dict:
    if len(raw) < HEADER.size or raw[:8] != MAGIC:
        raise HookError("it is not a loadertop hook file")
    _, pid, started, beat, wait_ns, batches, first, last, nbytes, clen, in_next = HEADER.unpack_from(raw, 0)
    if pid <= 0 or pid > MAX_PID or not _finite(started, beat, first, last, in_next) or clen > SIZE - CONFIG_AT:
        raise HookError("its header is damaged")
    # A recording holds what is read here: the figures must be ones its reader accepts
    # (numbers.LARGEST), and a wait in progress cannot have begun before the process did.
    if max(started, beat, first, last, in_next, wait_ns / 1e9, batches, nbytes) > LARGEST:
        raise HookError("its figures are out of range")
    if in_next and in_next < started - 1:
        raise HookError("its wait in progress began before the process")
    config = parse_config(raw[CONFIG_AT : CONFIG_AT + clen])
    name = config.get("name") or os.path.basename(path)[len(prefix_of(pid)) : -len(SUFFIX)]
    return {"name": name, "pid": pid, "started": started, "heartbeat": beat, "wait_s": wait_ns / 1e9,
            "batches": batches, "first_batch_at": first, "last_batch_at": last, "batch_bytes": nbytes or None,
            "in_next_since": in_next or None, "config": config}


@dataclass
class Listing:
    """A trainer's hook files, and the first file under its names that another user owns."""

    files: list[str] = field(default_factory=list)
    foreign: tuple[str, int] | None = None  # (path, its owner)


def _listed(folder: str, prefixes: tuple[str, ...], owner: int | None = None) -> Listing:
    """Hook files under the prefixes; with `owner`, only that user's (a stat of the listing,
    no open), at most MAX_HOOK_FILES of them."""
    out = Listing()
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if not (e.name.startswith(prefixes) and e.name.endswith(SUFFIX)):
                    continue
                if owner is not None:
                    try:
                        uid = e.stat(follow_symlinks=False).st_uid
                    except OSError:
                        continue
                    if uid != owner:
                        out.foreign = out.foreign or (e.path, uid)
                        continue
                    if len(out.files) >= MAX_HOOK_FILES:
                        break
                out.files.append(e.path)
            return out
    except OSError:
        return out


def _pids_of(pid: int) -> tuple[int, ...]:
    """pid in every pid namespace it lives in: in a container the hook names its file with
    the container's pid, which the host does not use."""
    try:
        return procfs.read_nspid(pid)
    except (PermissionError, OSError):
        return (pid,)


def hook_files(pid: int) -> Listing:
    """The trainer's hook files: through its own root (a container's /dev/shm), or our
    /dev/shm when it is the same mount (another user's root is closed to us)."""
    prefixes = tuple(prefix_of(p) for p in _pids_of(pid))
    owner = procfs.owner_uid(pid)
    if owner is None:
        return Listing()
    listing = _listed(f"{procfs.PROC}/{pid}/root/dev/shm", prefixes, owner)
    if listing.files or listing.foreign:
        return listing
    if procfs.same_mount_as_ours(pid, "/dev/shm"):
        return _listed("/dev/shm", prefixes, owner)
    return listing


def sweep_stale(folder: str = "/dev/shm", now: float | None = None) -> int:
    """Remove hook files of processes that are gone (SIGKILLed jobs cannot remove their own)
    and have not beaten for STALE_AFTER_S. Returns how many went."""
    now = time.time() if now is None else now
    removed = 0
    for path in _listed(folder, (PREFIX,)).files:
        name = os.path.basename(path)
        pid_text = name[len(PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or os.path.exists(f"{procfs.PROC}/{pid_text}"):
            continue
        try:
            h = read_hook(path)
        except HookError:
            continue  # not ours to judge
        if h is None or now - h["heartbeat"] < STALE_AFTER_S:
            continue
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


class HookReader:
    def __init__(self, rolling_s: float = 30.0) -> None:
        self.rolling_s = rolling_s
        self._readings: dict[tuple[int, float], dict[str, deque]] = {}
        self.configs: dict[tuple[int, float], dict[str, dict]] = {}
        self._files: dict[tuple[int, float], tuple[float, Listing]] = {}  # listed at, files
        self._notices: dict[tuple[int, float], Notice] = {}
        self._swept_at = float("-inf")

    def data_wait(self, pid: int, started_at: float, now: float) -> DataWait | None:
        key = (pid, started_at)
        if now - self._swept_at >= STALE_SWEEP_S:
            self._swept_at = now
            sweep_stale(now=now)
        listed = self._files.get(key)
        if listed is None or not now - HOOK_RESCAN_S < listed[0] <= now:
            listed = self._files[key] = (now, hook_files(pid))
        owner = procfs.owner_uid(pid)
        pids = _pids_of(pid)
        hooks = []
        self._notices.pop(key, None)
        if listed[1].foreign is not None:
            path, uid = listed[1].foreign
            self._notices[key] = Notice(
                N.HOOK_INVALID, f"{path} is not a valid hook of trainer {pid}: it belongs to user {uid}, not to the "
                f"trainer's user {owner}; ignored", "remove the file; loadertop.watch() writes its own", pid)
        for path in listed[1].files:
            try:
                h = read_hook(path, owner)
            except HookError as e:
                self._notices[key] = Notice(
                    N.HOOK_INVALID, f"{path} is not a valid hook of trainer {pid}: {e}; ignored",
                    "remove the file; loadertop.watch() in the training script writes its own", pid)
                continue
            if h is None:
                # A loader's file went away (two may go in one tick): list the folder again next tick.
                self._files.pop(key, None)
                continue
            if h["pid"] in pids and h["started"] >= started_at - 1:
                hooks.append(h)
        if not hooks:
            self._readings.pop(key, None)
            return None
        per_loader = self._readings.setdefault(key, {})
        self.configs[key] = {h["name"]: {**h["config"], "batch_bytes": h["batch_bytes"]} for h in hooks}
        waited = batches = dispatched = 0.0
        span = 0.0
        stalled = 0.0
        rates = []
        totals: list[int] = []  # batches so far, each loader (the loop's loader has the most)
        waited_total = 0.0
        for h in hooks:
            # A next() in progress counts as waiting up to now.
            ongoing = max(0.0, now - h["in_next_since"]) if h["in_next_since"] else 0.0
            stalled = max(stalled, ongoing)
            readings = per_loader.setdefault(h["name"], deque())
            if readings and (h["wait_s"] < readings[-1][1] - readings[-1][3] or h["batches"] < readings[-1][2]):
                readings.clear()  # a counter went back: a new run of the file's counters, not a negative rate
            readings.append((now, h["wait_s"] + ongoing, h["batches"], ongoing))
            while readings and readings[0][0] < now - self.rolling_s:
                readings.popleft()
            first, last = readings[0], readings[-1]
            waited += last[1] - first[1]
            if h["config"].get("dispatched"):
                dispatched += last[1] - first[1]
            batches += last[2] - first[2]
            span = max(span, last[0] - first[0])
            waited_total += last[1]
            if last[0] > first[0]:
                rates.append((last[2] - first[2]) / (last[0] - first[0]))
                totals.append(int(last[2]))
        if span <= 0:
            return None
        fraction = min(1.0, max(0.0, waited / span))
        iterable = {h["config"].get("iterable") for h in hooks} - {None}
        return DataWait(fraction=fraction, worker_wait_fraction=None, main_process_fraction=None, breakdown=(),
                        samples=int(batches), window_s=span, stalled_for_s=stalled, source="hook",
                        # The training loop's steps: its busiest loader's batches.
                        steps_per_s=max(rates) if rates else None,
                        iterable=True if True in iterable else (False if iterable else None),
                        dispatched_fraction=min(1.0, dispatched / span) if dispatched else None,
                        loop=next((h["config"]["loop"] for h in hooks if h["config"].get("loop")), None),
                        batches_total=max(totals) if totals else None, waited_total_s=waited_total)

    def notices(self) -> tuple[Notice, ...]:
        return tuple(self._notices.values())

    def loaders(self, pid: int, started_at: float, worker_pids: tuple[int, ...]) -> tuple[LoaderConfig, ...]:
        """Each watched loader, with the workers it published (those seen under the trainer),
        or every worker seen when it published none."""
        configs = self.configs.get((pid, started_at), {})
        out = []
        for c in configs.values():
            published = set(c.get("worker_pids") or ())
            mine = tuple(p for p in worker_pids if p in published) if published else worker_pids
            out.append(LoaderConfig(c.get("dataset_class"), c.get("num_workers"), c.get("persistent_workers"), mine,
                                    prefetch_factor=c.get("prefetch_factor"), batch_size=c.get("batch_size"),
                                    batch_bytes=c.get("batch_bytes"), iterable=c.get("iterable"), source="hook",
                                    tune=c.get("tune"), name=c.get("name")))
        return tuple(out)

    def forget(self, live: set) -> None:
        for table in (self._readings, self.configs, self._files, self._notices):
            for key in [k for k in table if k not in live]:
                del table[key]
