"""Recordings: snapshots appended to a compressed file that survives the recorder being
killed mid-write, and read back for replay and reports.

Layout: one plain header line (MAGIC), then one zlib stream of JSON lines, one snapshot a
line, sync-flushed after each: every snapshot written before a kill decodes; a torn tail
or corrupt bytes end the readable prefix, and the reader says where.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
import zlib
from dataclasses import dataclass

from .files import open_private
from .model import Snapshot

MAGIC = b"LOADERTOP-RECORDING 1\n"


class NotARecording(ValueError):
    pass


# --- snapshot <-> JSON-able data ------------------------------------------------------


def encode(snapshot: Snapshot) -> dict:
    return dataclasses.asdict(snapshot)


_HINTS: dict[type, dict] = {}
# Figures a recording may hold: finite, and small enough that arithmetic and dates on them
# stay sane (epoch seconds, byte counts, rates).
LARGEST = 1e15


class Damaged(ValueError):
    """A snapshot whose fields are not what loadertop writes."""


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(tp, value):
    """value as type tp, every field checked: a recording is a file anyone may hand us."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for option in options:
            try:
                return _decode(option, value)
            except Damaged:
                continue
        raise Damaged(f"{value!r:.40} is none of {tp}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise Damaged(f"{tp.__name__} is not an object")
        hints = _hints(tp)
        fields = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                fields[f.name] = _decode(hints[f.name], value[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise Damaged(f"{tp.__name__}.{f.name} is missing")
        return tp(**fields)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise Damaged(f"{value!r:.40} is not a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        if len(value) != len(args):
            raise Damaged(f"a list of {len(value)} where {len(args)} belong")
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
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
    snap = _decode(Snapshot, data)
    if not 0 < snap.time < LATEST_TIME:
        raise Damaged(f"its time {snap.time!r} is not a date")
    return snap


# --- writing ----------------------------------------------------------------------------


class Recorder:
    """Appends snapshots; each is on disk (sync-flushed) when `write` returns."""

    def __init__(self, path: str) -> None:
        self._fd = open_private(path)
        self._zip = zlib.compressobj(6)
        os.write(self._fd, MAGIC)
        self.written = 0

    def write(self, snapshot: Snapshot) -> None:
        line = json.dumps(encode(snapshot), separators=(",", ":")).encode() + b"\n"
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


# Decompressed, a recording may hold this much, far more than a day of 16 workers
# (docs/BENCHMARKS.md §3c): a file that inflates past it (a zlib bomb reaches 1000:1) is read
# up to it.
MAX_DECOMPRESSED = 1 << 30
CHUNK = 1 << 16


def _inflate(f, offset: int) -> tuple[bytes, str | None]:
    """The decompressed stream, read and inflated a chunk at a time within MAX_DECOMPRESSED;
    and where and why it stopped early, if it did."""
    unzip = zlib.decompressobj()
    out = bytearray()
    while True:
        chunk = unzip.unconsumed_tail or f.read(CHUNK)
        if not chunk:
            if not unzip.eof:
                return bytes(out), "the file ends mid-write (the recorder was stopped): read up to its last snapshot"
            return bytes(out), None
        try:
            out += unzip.decompress(chunk, MAX_DECOMPRESSED - len(out) + 1)
        except zlib.error as e:
            return bytes(out), f"corrupt data near byte {offset} ({e}): read the snapshots before it"
        offset += len(chunk) - len(unzip.unconsumed_tail)
        if len(out) > MAX_DECOMPRESSED:
            return bytes(out[:MAX_DECOMPRESSED]), (
                f"it inflates past {MAX_DECOMPRESSED >> 20} MiB: read the snapshots up to there")
        if unzip.eof:
            return bytes(out), None


def read(path: str) -> Recording:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
        if head != MAGIC:
            raise NotARecording(f"{path} is not a loadertop recording (make one with `loadertop record`)")
        out, problem = _inflate(f, len(MAGIC))
    snapshots = []
    lines = out.split(b"\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            snapshots.append(decode(json.loads(line)))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            if i == len(lines) - 1 and problem:
                break  # the torn last line of a cut-short file
            why = f" ({e})" if isinstance(e, Damaged) else ""
            problem = problem or f"snapshot {i + 1} is damaged{why}: read the {len(snapshots)} before it"
            break
    return Recording(snapshots, problem)
