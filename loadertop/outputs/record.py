"""Recordings: snapshots appended to a compressed file that survives the recorder being
killed mid-write, and read back for replay and reports.

Layout: one plain header line (MAGIC), then one zlib stream of JSON lines, one snapshot a
line with the tick's judgement under "judged" (outputs/judgement.py), sync-flushed after
each: every snapshot written before a kill decodes; a torn tail or corrupt bytes end the
readable prefix, and the reader says where.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
import zlib
from dataclasses import dataclass

from ..files import open_private
from ..model import Snapshot
from ..numbers import LARGEST

MAGIC = b"LOADERTOP-RECORDING 1\n"


class NotARecording(ValueError):
    pass


# --- snapshot <-> JSON-able data ------------------------------------------------------


def encode(snapshot: Snapshot) -> dict:
    return dataclasses.asdict(snapshot)


_HINTS: dict[type, dict] = {}


class Damaged(ValueError):
    """A snapshot whose fields are not what loadertop writes."""


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def decode_as(tp, value):
    """value as type tp, every field checked: a recording is a file anyone may hand us."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for option in options:
            try:
                return decode_as(option, value)
            except Damaged:
                continue
        raise Damaged(f"{value!r:.40} is none of {tp}")
    if origin is typing.Literal:
        # One of a closed set of words (vocabulary.py): any other is not what loadertop writes.
        if value not in typing.get_args(tp):
            raise Damaged(f"{value!r:.40} is none of {', '.join(map(str, typing.get_args(tp)))}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise Damaged(f"{tp.__name__} is not an object")
        hints = _hints(tp)
        fields = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                fields[f.name] = decode_as(hints[f.name], value[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise Damaged(f"{tp.__name__}.{f.name} is missing")
        return tp(**fields)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise Damaged(f"{value!r:.40} is not a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode_as(args[0], v) for v in value)
        if len(value) != len(args):
            raise Damaged(f"a list of {len(value)} where {len(args)} belong")
        return tuple(decode_as(a, v) for a, v in zip(args, value, strict=True))
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or abs(value) > LARGEST:
            raise Damaged(f"{value!r:.40} is not a figure")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > LARGEST:
            raise Damaged(f"{value!r:.40} is not a whole number")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise Damaged(f"{value!r:.40} is not true/false")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise Damaged(f"{value!r:.40} is not text")
        return value
    if value is None:
        raise Damaged("a value is missing")
    return value


LATEST_TIME = 1e10  # epoch seconds in the year 2286: later is not a date loadertop wrote


def decode(data: dict) -> Snapshot:
    if not isinstance(data, dict):
        raise Damaged("a snapshot is not an object")
    trainers = data.get("trainers")
    if isinstance(trainers, list) and (len(trainers) > MAX_RECORDED_TRAINERS or any(
            isinstance(t, dict) and isinstance(t.get("workers"), list) and len(t["workers"]) > MAX_RECORDED_WORKERS
            for t in trainers)):
        raise Damaged(f"it has more than {MAX_RECORDED_TRAINERS} trainers or {MAX_RECORDED_WORKERS} workers in one")
    snap = decode_as(Snapshot, data)
    if not 0 < snap.time < LATEST_TIME:
        raise Damaged(f"its time {snap.time!r} is not a date")
    return _one_of_each(snap)


def _one_of_each(snap: Snapshot) -> Snapshot:
    """One process a pid in each trainer, one trainer a (pid, start): loadertop never writes
    two, and a file that repeats one (4,096 workers on one pid) made every report quadratic."""
    trainers = []
    seen_trainers = set()
    for t in snap.trainers:
        if (t.pid, t.started_at) in seen_trainers:
            continue
        seen_trainers.add((t.pid, t.started_at))
        pids = {t.main.pid}
        workers = []
        for w in t.workers:
            if w.pid not in pids:
                pids.add(w.pid)
                workers.append(w)
        trainers.append(t if len(workers) == len(t.workers) else dataclasses.replace(t, workers=tuple(workers)))
    if len(trainers) == len(snap.trainers) and all(a is b for a, b in zip(trainers, snap.trainers, strict=True)):
        return snap
    return dataclasses.replace(snap, trainers=tuple(trainers))


# --- writing ----------------------------------------------------------------------------

# Each line ends in a checksum of itself, as one more key (a reader that does not know it skips
# it): a damaged stream can inflate to a line that parses, and still is not what was written
# (a cut and 5 bytes of junk turned a snapshot's events into others).
_CHECKSUM = re.compile(rb',"crc":"([0-9a-f]{8})"\}$')


def with_checksum(body: bytes) -> bytes:
    """A JSON object's line, its checksum added as its last key."""
    return body[:-1] + b',"crc":"%08x"}' % zlib.crc32(body)


def checksum_of(line: bytes) -> bool | None:
    """Whether the line's checksum matches it; None for a line without one (written before
    lines had one)."""
    m = _CHECKSUM.search(line)
    return None if m is None else int(m.group(1), 16) == zlib.crc32(line[: m.start()] + b"}")


class Recorder:
    """Appends snapshots; each is on disk (sync-flushed) when `write` returns."""

    def __init__(self, path: str) -> None:
        self._fd = open_private(path)
        self._zip = zlib.compressobj(6)
        os.write(self._fd, MAGIC)
        self.written = 0

    def write(self, snapshot: Snapshot, judged: dict | None = None) -> None:
        """`judged`: the tick's Diagnosis as outputs/judgement.py encodes it, stored beside the
        snapshot (a reader that does not know the key skips it)."""
        data = encode(snapshot)
        if judged is not None:
            data["judged"] = judged
        line = with_checksum(json.dumps(data, separators=(",", ":")).encode()) + b"\n"
        os.write(self._fd, self._zip.compress(line) + self._zip.flush(zlib.Z_SYNC_FLUSH))
        self.written += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.write(self._fd, self._zip.flush(zlib.Z_FINISH))
            os.close(self._fd)
            self._fd = -1


# --- reading ----------------------------------------------------------------------------


@dataclass
class Recording:
    snapshots: list[Snapshot]
    problem: str | None  # where and why reading stopped early, None for a complete file
    # Each snapshot's judgement as stored (outputs/judgement.py decodes it), None where the
    # recorder stored none (recordings before it did).
    judged: list[dict | None] = dataclasses.field(default_factory=list)


# Decompressed, a recording may hold this much, far more than a day of 16 workers
# (docs/BENCHMARKS.md §3c): a file that inflates past it (a zlib bomb reaches 1000:1) is read
# up to it. It is inflated and read a line at a time: memory holds the snapshots decoded so
# far and one chunk, never the inflated stream (a bomb of newlines cost ~10 bytes of memory
# per inflated byte when it did).
MAX_DECOMPRESSED = 1 << 30
CHUNK = 1 << 16
# What one recording may hold: more lines (empty ones count), snapshots, trainers in a
# snapshot or processes in a trainer than this are no recording loadertop wrote.
MAX_LINES = 1_000_000
MAX_SNAPSHOTS = 400_000  # four and a half days at a tick a second
MAX_LINE_BYTES = 64 << 20
MAX_RECORDED_TRAINERS = 256
MAX_RECORDED_WORKERS = 4096


def _inflate(f, offset: int):
    """Decompressed chunks, read and inflated one at a time within MAX_DECOMPRESSED; the
    generator's return value is where and why it stopped early, if it did."""
    unzip = zlib.decompressobj()
    total = 0
    while True:
        chunk = unzip.unconsumed_tail or f.read(CHUNK)
        if not chunk:
            if not unzip.eof:
                return "the file ends mid-write (the recorder was stopped): read up to its last snapshot"
            return None
        try:
            out = unzip.decompress(chunk, min(CHUNK, MAX_DECOMPRESSED - total + 1))
        except zlib.error as e:
            return f"corrupt data near byte {offset} ({e}): read the snapshots before it"
        offset += len(chunk) - len(unzip.unconsumed_tail)
        total += len(out)
        if total > MAX_DECOMPRESSED:
            yield out[: len(out) - (total - MAX_DECOMPRESSED)]
            return f"it inflates past {MAX_DECOMPRESSED >> 20} MiB: read the snapshots up to there"
        yield out
        if unzip.eof:
            return None


def _lines(chunks):
    """Complete lines from the chunks, each with whether more may follow; the generator's
    return value is the inflater's problem, or the line cap's."""
    pending = bytearray()
    count = 0
    problem = None
    try:
        while True:
            chunk = next(chunks)
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if end < 0:
                    pending += chunk[start:]
                    if len(pending) > MAX_LINE_BYTES:
                        return f"line {count + 1} is over {MAX_LINE_BYTES >> 20} MiB: read the snapshots before it"
                    break
                pending += chunk[start:end]
                count += 1
                if count > MAX_LINES:
                    return f"it holds more than {MAX_LINES} lines: read the snapshots up to there"
                yield bytes(pending), True
                pending.clear()
                start = end + 1
    except StopIteration as stop:
        problem = stop.value
    if pending:
        yield bytes(pending), False  # the last line, maybe torn
    return problem


def read(path: str) -> Recording:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
        if head != MAGIC:
            raise NotARecording(f"{path} is not a loadertop recording (make one with `loadertop record`)")
        snapshots: list[Snapshot] = []
        judged: list[dict | None] = []
        checked = False  # a line had a checksum: from there on, every line has one
        lines = _lines(_inflate(f, len(MAGIC)))
        problem = None
        i = 0
        try:
            while True:
                line, complete = next(lines)
                i += 1
                if not line:
                    continue
                if len(snapshots) >= MAX_SNAPSHOTS:
                    problem = f"it holds more than {MAX_SNAPSHOTS} snapshots: read that many"
                    break
                try:
                    held = checksum_of(line)
                    if held is False or (held is None and checked and complete):
                        raise Damaged("its checksum does not match: the file was changed or damaged there")
                    checked = checked or held is True
                    data = json.loads(line)
                    snapshots.append(decode(data))
                    stored = data.get("judged")
                    judged.append(stored if isinstance(stored, dict) else None)
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                    if not complete:
                        break  # the torn last line of a cut-short file (its problem follows)
                    why = f" ({e})" if isinstance(e, Damaged) else ""
                    problem = f"snapshot {i} is damaged{why}: read the {len(snapshots)} before it"
                    break
        except StopIteration as stop:
            problem = problem or stop.value
        if problem is None:
            try:  # the torn line's reason, when reading stopped there
                while True:
                    next(lines)
            except StopIteration as stop:
                problem = stop.value
    return Recording(snapshots, problem, judged)
