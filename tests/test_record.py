"""Recordings: round trips, a recorder killed mid-write, truncated and corrupt files."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.synth import gpu, host, snapshot, story, trainer, worker_exit

from loadertop.numbers import LARGEST
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


def test_every_figure_the_hook_reader_takes_reads_back_from_a_recording(tmp_path):
    # A tuner decision at batch 2**62 passed the hook's reader and made the recording
    # unreadable from that snapshot on: the reader applies the recording's ranges.
    from dataclasses import replace

    from loadertop.probes.hook_files import HookError, parse_tune

    knobs = {"num_workers": 2, "prefetch_factor": 2}
    largest = {"action": "try", "from": knobs, "to": knobs, "batch": int(LARGEST), "epoch": 2**31,
               "at": LARGEST, "measured_gain": 1e6, "noise": 1e6, "reason": "r" * 500}
    with pytest.raises(HookError, match="batch"):
        parse_tune({"state": "trying", "decisions": [{**largest, "batch": 2**62}]})
    tune = parse_tune({"state": "trying", "setting": knobs, "epoch": 2**31, "steps_per_s": 1e15,
                       "decisions": [largest]})
    tr = trainer()
    snaps = [replace(s, trainers=(replace(tr, loaders=(replace(tr.loaders[0], tune=tune),)),))
             for s in sample_story(3)]
    path = tmp_path / "big.rec"
    write(path, snaps)
    assert record.read(str(path)).snapshots == snaps


def test_a_recording_that_repeats_a_pid_reads_back_with_one_process_a_pid(tmp_path):
    # 4,096 workers on one pid in 16 snapshots made the report quadratic (74 s of CPU from 403 KiB).
    from dataclasses import replace

    from loadertop.outputs.report import build_report

    tr = trainer(workers=2)
    same = replace(tr, workers=tr.workers + tuple(tr.workers[0] for _ in range(4000)))
    snaps = [replace(s, trainers=(same, same)) for s in sample_story(16)]
    path = tmp_path / "dup.rec"
    write(path, snaps)
    back = record.read(str(path)).snapshots
    assert len(back) == 16 and all(len(s.trainers) == 1 and len(s.trainers[0].workers) == 2 for s in back)
    assert len(build_report(back)["trainers"][0]["workers"]) == 2


def test_a_line_that_inflates_to_other_words_than_were_written_is_damage(tmp_path):
    # Fuzzing found a cut and 5 bytes of junk that inflated to a snapshot whose events were not
    # the ones written: each line carries its checksum, and one that does not match ends the read.
    import zlib

    lines = [record.with_checksum(json.dumps(record.encode(s), separators=(",", ":")).encode())
             for s in sample_story(4)]
    lines[2] = lines[2].replace(b'"interval_s":1.0', b'"interval_s":2.0')  # changed after its checksum
    path = tmp_path / "r.ltrec"
    z = zlib.compressobj()
    path.write_bytes(record.MAGIC + z.compress(b"\n".join(lines) + b"\n") + z.flush())
    got = record.read(str(path))
    assert got.snapshots == sample_story(4)[:2] and "checksum" in got.problem
    # A line without one after lines with one is damage too; a file of lines without any
    # (written before lines had one) reads as it always did.
    lines = [record.with_checksum(json.dumps(record.encode(s), separators=(",", ":")).encode())
             for s in sample_story(2)] + [json.dumps(record.encode(sample_story(3)[2])).encode()]
    z = zlib.compressobj()
    path.write_bytes(record.MAGIC + z.compress(b"\n".join(lines) + b"\n") + z.flush())
    assert len(record.read(str(path)).snapshots) == 2
    plain = [json.dumps(record.encode(s)).encode() for s in sample_story(3)]
    z = zlib.compressobj()
    path.write_bytes(record.MAGIC + z.compress(b"\n".join(plain) + b"\n") + z.flush())
    assert record.read(str(path)).snapshots == sample_story(3)
