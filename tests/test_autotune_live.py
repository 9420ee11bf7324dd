"""`watch(loader, tune=True)` on real DataLoaders with real workers (tests/support/tune_job.py): the
tuner changes the worker count, and the seeded loop sees exactly the batches it sees without
it, across an epoch boundary (persistent workers or not) and, for torchdata's
StatefulDataLoader, mid-epoch; the workers it replaces are gone and leave nothing in
/dev/shm; a full /dev/shm or an unreadable /proc turns it off with one warning while the loop
goes on."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from support.jobs import REPO

from loadertop.started import can_unshare_shm

# Real training jobs tuned in place.
pytestmark = pytest.mark.live

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
FAST = ("--tune", "--stretch-s", "0.5")  # short stretches: a test of minutes, not of the defaults' pace


def start(*args: str, wrapper: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([*wrapper, sys.executable, str(REPO / "tests" / "support" / "tune_job.py"), *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def result(proc: subprocess.Popen, timeout: float = 180.0) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def side_by_side(*args: str) -> tuple[dict, dict]:
    """The same seeded loop without and with the tuner, at once (their items sleep: the CPUs
    are not what they share)."""
    plain, tuned = start(*args), start(*args, *FAST)
    try:
        return result(plain), result(tuned)
    finally:
        for p in (plain, tuned):
            if p.poll() is None:
                os.killpg(p.pid, 9)


def torch_files() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("torch_")}


@pytest.mark.parametrize("persistent", [False, True], ids=["workers-each-epoch", "persistent-workers"])
def test_a_seeded_loop_sees_the_same_batches_across_a_change_at_an_epoch_boundary(persistent):
    before = torch_files()
    plain, tuned = side_by_side("--epochs", "8", *(["--persistent"] if persistent else []))
    assert len(set(tuned["workers"])) > 1, tuned["tune"]  # the tuner did change the count
    assert tuned["warnings"] == []
    assert [d["action"] for d in tuned["tune"]["decisions"]][:2] == ["try", "keep"], tuned["tune"]
    assert tuned["batches"] == plain["batches"]  # the same samples in the same order, every epoch
    if persistent:
        # The persistent workers it replaced were shut down: none is left, orphaned or not.
        assert tuned["old_workers"] >= 1 and tuned["old_workers_left"] == []
    # Nothing of the replaced workers stays mapped or in /dev/shm: at most the batches in flight.
    assert tuned["torch_segments"] <= 2 * max(tuned["workers"]) + 2
    assert torch_files() - before == set()


def test_a_stateful_dataloader_changes_its_workers_mid_epoch_with_the_same_batches():
    if importlib.util.find_spec("torchdata") is None:
        pytest.skip("needs torchdata (the test extras)")
    plain, tuned = side_by_side("--stateful", "--epochs", "1", "--items", "1200")
    assert len(plain["batches"]) == 300
    assert len(set(tuned["workers"])) > 1, tuned["tune"]  # one epoch: the change came mid-epoch
    assert tuned["tune"]["decisions"][0]["epoch"] == 1
    assert tuned["batches"] == plain["batches"]
    assert tuned["old_workers"] >= 1 and tuned["old_workers_left"] == []


# A container's /dev/shm of 8 MB already 92% full (other users filled it); a sandbox that hides
# /proc (an empty tmpfs over it).
FULL_SHM = 'mount -t tmpfs -o size=8m tmpfs /dev/shm && head -c 7700000 /dev/zero > /dev/shm/fill && exec "$0" "$@"'
NO_PROC = 'mount -t tmpfs none /proc && exec "$0" "$@"'


@pytest.mark.parametrize(("setup", "why"), [(FULL_SHM, "/dev/shm is 9"), (NO_PROC, "cannot read this process's threads")],
                         ids=["full-dev-shm", "unreadable-proc"])
def test_a_full_dev_shm_or_an_unreadable_proc_turns_the_tuner_off_with_one_warning(setup, why):
    if not can_unshare_shm():
        pytest.skip("needs root and unshare for a mount namespace of its own")
    proc = start("--epochs", "4", *FAST, wrapper=("unshare", "-m", "--propagation", "private", "sh", "-c", setup))
    out = result(proc)
    assert len(out["warnings"]) == 1 and why in out["warnings"][0], out["warnings"]
    assert "keeps num_workers=1" in out["warnings"][0]
    assert out["tune"]["state"] == "off" and set(out["workers"]) == {1}
    assert len(out["batches"]) == 4 * 40  # the loop went on to its end


KINDS = {  # the loaders the tuner touches, each over a map-style and a sharded iterable dataset
    "map": (), "sharded-iterable": ("--iterable",),
    "stateful-map": ("--stateful",), "stateful-sharded-iterable": ("--stateful", "--iterable"),
    # webdataset's idiom (issue 45): the dataset yields batches, the loader has batch_size=None
    "self-batching-iterable": ("--iterable", "--self-batching"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_item_of_every_epoch_once_across_a_change_and_across_a_change_that_fails(kind):
    """Persistent workers or not, a change that starts and one whose start fails (the loop goes
    on at the setting that ran, from the same place): each epoch yields every item exactly
    once, and a map-style loader the very batches of the untuned loop."""
    if "--stateful" in KINDS[kind] and importlib.util.find_spec("torchdata") is None:
        pytest.skip("needs torchdata (the test extras)")
    common = (*KINDS[kind], "--epochs", "4", "--items", "240")
    # The untuned loops, persistent or not (a persistent loader draws no seed for its workers
    # at each epoch, so its shuffles differ); an iterable's order follows the worker count, so
    # its tuned runs are held to every item once, not to the untuned order.
    runs = {} if "--iterable" in KINDS[kind] else {False: start(*common), True: start(*common, "--persistent")}
    for persistent in (False, True):
        for fails in (False, True):
            extra = (*(["--persistent"] if persistent else []), *(["--fail-change"] if fails else []))
            runs[(persistent, fails)] = start(*common, *extra, *FAST)
    try:
        out = {name: result(proc) for name, proc in runs.items()}
    finally:
        for p in runs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
    for name, o in out.items():
        assert len(o["epochs"]) == 4, name
        for epoch in o["epochs"]:
            assert sorted(epoch) == list(range(240)), (name, len(epoch), len(set(epoch)))
        if not isinstance(name, tuple):
            continue
        persistent, fails = name
        if "--iterable" not in KINDS[kind]:
            assert o["batches"] == out[persistent]["batches"], name
        if fails:
            assert len(o["warnings"]) == 1 and "could not start" in o["warnings"][0], o["warnings"]
            assert "No space left" in o["warnings"][0] and "the loader keeps num_workers=1" in o["warnings"][0]
            assert set(o["workers"]) == {1}, o["tune"]
        else:
            assert o["warnings"] == [] and len(set(o["workers"])) > 1, o["tune"]
        if "--iterable" in KINDS[kind]:  # its workers hold places in their streams: only between epochs
            assert all(len(counts) == 1 for counts in o["epoch_workers"]), (name, o["epoch_workers"])
