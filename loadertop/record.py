"""Recordings: snapshots appended to a compressed file that survives the recorder being
killed mid-write, and read back for replay and reports.

Layout: one plain header line (MAGIC), then one zlib stream of JSON lines, one snapshot a
line, sync-flushed after each: every snapshot written before a kill decodes; a torn tail
or corrupt bytes end the readable prefix, and the reader says where.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .model import Snapshot

MAGIC = b"LOADERTOP-RECORDING 1\n"


class NotARecording(ValueError):
    pass


# --- snapshot <-> JSON-able data ------------------------------------------------------


def encode(snapshot: Snapshot) -> dict:
    return dataclasses.asdict(snapshot)


_HINTS: dict[type, dict] = {}


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(tp, value):
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(tp)
                     if f.name in value})
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=False))
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def decode(data: dict) -> Snapshot:
    return _decode(Snapshot, data)


# --- writing ----------------------------------------------------------------------------


class Recorder:
    """Appends snapshots; each is on disk (sync-flushed) when `write` returns."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        self._fd = os.open(path, flags, 0o644)
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


def read(path: str) -> Recording:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
        if head != MAGIC:
            raise NotARecording(f"{path} is not a loadertop recording (make one with `loadertop record`)")
        data = f.read()
    out = bytearray()
    problem = None
    unzip = zlib.decompressobj()
    try:
        out += unzip.decompress(data)
        if not unzip.eof:
            problem = "the file ends mid-write (the recorder was stopped): read up to its last snapshot"
    except zlib.error as e:
        # Decode what precedes the damage: feed the stream in pieces until it breaks.
        out = bytearray()
        unzip = zlib.decompressobj()
        offset = 0
        for offset in range(0, len(data), 4096):
            try:
                out += unzip.decompress(data[offset : offset + 4096])
            except zlib.error:
                break
        problem = f"corrupt data near byte {len(MAGIC) + offset} ({e}): read the snapshots before it"
    snapshots = []
    lines = bytes(out).split(b"\n")
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            snapshots.append(decode(json.loads(line)))
        except (ValueError, TypeError, KeyError, AttributeError):
            problem = problem or f"snapshot {i + 1} is damaged: read the {len(snapshots)} before it"
            break
    return Recording(snapshots, problem)


def iter_snapshots(path: str) -> Iterator[Snapshot]:
    yield from read(path).snapshots
