"""Recordings: round trips, a recorder killed mid-write, truncated and corrupt files."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import gpu, host, snapshot, story, trainer, worker_exit

from loadertop.outputs import record


def sample_story(n: int = 20):
    return story(n, lambda t: snapshot(t, [trainer(wait=0.5, gpus=(0,))], host(cpu=30.0), gpus=[gpu()],
                                       events=[worker_exit(t, 4001, 9)] if t == 3 else []))


def write(path, snaps, close=True):
    rec = record.Recorder(str(path))
    for s in snaps:
        rec.write(s)
    if close:
        rec.close()
    return rec


def test_round_trip_is_equal(tmp_path):
    snaps = sample_story()
    write(tmp_path / "r.ltrec", snaps)
    got = record.read(str(tmp_path / "r.ltrec"))
    assert got.problem is None
    assert got.snapshots == snaps


def test_a_killed_recorder_keeps_every_flushed_snapshot(tmp_path):
    snaps = sample_story()
    rec = write(tmp_path / "r.ltrec", snaps, close=False)  # never closed: as if killed
    os.close(rec._fd)
    got = record.read(str(tmp_path / "r.ltrec"))
    assert got.snapshots == snaps
    assert "mid-write" in got.problem


def test_truncated_file_gives_its_valid_prefix(tmp_path):
    path = tmp_path / "r.ltrec"
    write(path, sample_story())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    got = record.read(str(path))
    assert 5 < len(got.snapshots) < 20
    assert got.snapshots == sample_story()[: len(got.snapshots)]
    assert got.problem


def test_not_a_recording(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    with pytest.raises(record.NotARecording):
        record.read(str(path))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000), st.integers(min_value=0, max_value=20000))
def test_fuzzed_files_never_crash_the_reader(tmp_path_factory, junk, cut):
    path = tmp_path_factory.mktemp("fuzz") / "r.ltrec"
    write(path, sample_story(5))
    data = path.read_bytes()
    path.write_bytes(data[: min(cut, len(data))] + junk)
    try:
        got = record.read(str(path))
    except record.NotARecording:
        assert cut < len(record.MAGIC)
        return
    assert got.snapshots == sample_story(5)[: len(got.snapshots)]
