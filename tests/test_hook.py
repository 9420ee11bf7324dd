"""loadertop.watch(): exact data wait published from inside the training script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
from support.jobs import REPO, loadertop
from support.reports import only_trainer
from support.users import SYSTEM_PYTHON, nobody_can_run_system_python

import loadertop as lt
from loadertop.hookfile import hook_path
from loadertop.probes.hook_files import read_hook
from loadertop.started import shm_wrapper


class Loader:
    """A stand-in with a DataLoader's attributes."""

    batch_size, num_workers, prefetch_factor, pin_memory, persistent_workers = 4, 2, 2, False, True
    dataset = object()

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


def test_iteration_is_unchanged_and_counted(tmp_path):
    loader = lt.watch(Loader([1, 2, 3]), name="unit", directory=str(tmp_path))
    assert len(loader) == 3 and loader.batch_size == 4
    for _ in range(2):  # re-iteration per epoch
        assert list(loader) == [1, 2, 3]
    h = read_hook(hook_path(__import__("os").getpid(), "unit", str(tmp_path)))
    assert h["batches"] == 6 and h["in_next_since"] is None
    assert h["config"]["num_workers"] == 2 and h["config"]["persistent_workers"] is True


def _torn(raw: bytes) -> bytes:
    """The file as a read in the middle of the trainer's write of its wait in progress sees it:
    the low half of a new time beside the high half of none."""
    import struct

    from loadertop.hookfile import HEADER

    at = HEADER.size - 8
    half = struct.pack("<d", time.time())[:4] + b"\0\0\0\0"
    return raw[:at] + half + raw[at + 8 :]


@pytest.mark.parametrize("torn_reads, whole", [(1, True), (2, True), (3, False)],
                         ids=["once", "twice", "every time"])
def test_a_read_torn_by_the_trainers_write_is_read_again(tmp_path, monkeypatch, torn_reads, whole):
    # A read that lands in the middle of the trainer's rewrite saw "its wait in progress began
    # before the process" (a torn 8-byte time): one more read gets the whole file; a file that
    # is damaged on every read is still called damaged.
    import os

    from loadertop.probes import hook_files

    lt.watch(Loader([1, 2]), name="torn", directory=str(tmp_path))
    path = hook_path(os.getpid(), "torn", str(tmp_path))
    reads = []
    real = hook_files._read_bytes

    def read(p, owner):
        raw = real(p, owner)
        reads.append(p)
        return _torn(raw) if len(reads) <= torn_reads else raw

    monkeypatch.setattr(hook_files, "_read_bytes", read)
    if whole:
        assert read_hook(path)["pid"] == os.getpid() and len(reads) == torn_reads + 1
    else:
        with pytest.raises(hook_files.HookError, match="began before the process"):
            read_hook(path)


def test_a_loader_watched_again_under_its_name_goes_on_with_the_same_figures(tmp_path):
    # A loader re-created each epoch, or resumed from a state_dict, is watched again under
    # its name: one file, counters that go on, no warning.
    import os

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = lt.watch(Loader([1, 2, 3]), name="again", directory=str(tmp_path))
        assert list(first) == [1, 2, 3]
        second = lt.watch(Loader([4, 5]), name="again", directory=str(tmp_path))
        assert list(second) == [4, 5]
    h = read_hook(hook_path(os.getpid(), "again", str(tmp_path)))
    assert h["batches"] == 5
    assert [p.name for p in tmp_path.iterdir()] == [f"loadertop-{os.getpid()}-again.hook"]


def test_state_dict_and_load_state_dict_go_through_the_wrapper(tmp_path):
    class Stateful(Loader):
        def state_dict(self):
            return {"yielded": 2}

        def load_state_dict(self, state):
            self.items = self.items[state["yielded"]:]

    loader = lt.watch(Stateful([1, 2, 3]), name="stateful", directory=str(tmp_path))
    state = loader.state_dict()
    resumed = lt.watch(Stateful([1, 2, 3]), name="stateful", directory=str(tmp_path))
    resumed.load_state_dict(state)
    assert list(resumed) == [3]


ACCELERATE_SCRIPT = """
import json, os, sys, warnings
import torch
import loadertop  # before Accelerate: nothing to teach yet
from accelerate import Accelerator
from torch.utils.data import DataLoader
from loadertop.inside.hook import WatchedLoader
from loadertop.hookfile import hook_path
from loadertop.probes.hook_files import read_hook

warnings.simplefilter("error")
folder = sys.argv[1]
accelerator = Accelerator(cpu=True)
# watch() inside the first prepare() call: the bound prepare() is Accelerate's own, untaught.
model, train = accelerator.prepare(torch.nn.Linear(1, 1), loadertop.watch(DataLoader(list(range(8)), batch_size=2),
                                                                          name="train", directory=folder))
evaluation = loadertop.watch(DataLoader(list(range(4)), batch_size=2), name="eval", directory=folder)
assert [b.tolist() for b in evaluation][0] == [0, 1]  # an epoch before prepare()
alone = accelerator.prepare(evaluation)  # one object: one back
skipped = accelerator.skip_first_batches(train, 1)
plain = accelerator.prepare(DataLoader(list(range(4))))  # no watched loader: Accelerate's own answer
print(json.dumps({
    "watched": [isinstance(x, WatchedLoader) for x in (train, alone, skipped, plain)],
    "inside": [type(x._loader).__name__ for x in (train, alone, skipped)],
    "plain": type(plain).__name__,
    "model": type(model).__name__,
    "epochs": [len(list(train)), len(list(skipped)), len(list(alone))],
    "prepared": train._loader in accelerator._dataloaders,
    "batches": {n: read_hook(hook_path(os.getpid(), n, folder))["batches"] for n in ("train", "eval")},
    "files": len(os.listdir(folder)),
}))
"""


def test_accelerates_prepare_shards_a_watched_loader_and_keeps_it_watched(tmp_path):
    # prepare() rebuilds the loaders it is given and used to pass a watched one (not a
    # DataLoader) through unsharded. Watched before prepare(), or inside its call: the loader
    # comes back prepared by Accelerate and still watched, its figures going on in the same file.
    pytest.importorskip("accelerate")
    r = subprocess.run([sys.executable, "-c", ACCELERATE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["watched"] == [True, True, True, False], out
    assert out["inside"] == ["DataLoaderShard"] * 3 and out["plain"] == "DataLoaderShard", out
    assert out["model"] == "Linear" and out["prepared"], out  # the model prepared beside it, as without loadertop
    assert out["epochs"] == [4, 3, 2], out  # skip_first_batches skipped one batch
    # One file a name, the figures going on through prepare() and skip_first_batches:
    # train 4 + 3 skipping one, eval 2 before prepare() and 2 after.
    assert out["files"] == 2 and out["batches"] == {"train": 7, "eval": 4}, out
    assert list(tmp_path.iterdir()) == []  # gone with the script


def test_errors_from_the_loader_pass_through(tmp_path):
    def broken():
        yield 1
        raise ValueError("bad sample")

    class Broken(Loader):
        def __iter__(self):
            return broken()

    it = iter(lt.watch(Broken([]), name="broken", directory=str(tmp_path)))
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad sample"):
        next(it)


def test_unwritable_location_disables_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = lt.watch(Loader([1, 2]), directory="/nonexistent/dir")
        assert list(loader) == [1, 2] and list(loader) == [1, 2]
    assert len(caught) == 1 and "disabled" in str(caught[0].message)


@pytest.mark.live
def test_exact_figure_equals_the_scripts_own(job):
    j = job("--workers", "1", "--persistent", "--item-ms", "6", "--batch-size", "8", "--step-ms", "10", "--watch")
    j.wait_ready()
    time.sleep(2)
    r = loadertop("snapshot", str(j.pid), "--duration", "6", "--interval", "0.5", "--json", "--no-stacks")
    report = json.loads(r.stdout)
    truth = j.truth()
    trainer = only_trainer(report)
    dw = trainer["data_wait"]
    assert dw["source"] == "hook"
    log = truth["log"]
    end = log[-1]
    start = next(e for e in log if e[0] >= end[0] - dw["window_s"])
    expected = (end[1] - start[1]) / (end[2] - start[2])
    assert abs(dw["fraction"] - expected) < 0.03, (dw, expected)
    assert "input_bound" in {f["id"] for f in report["findings"]}


@pytest.mark.live
def test_two_loaders_are_told_apart(job):
    j = job("--workers", "2", "--persistent", "--epoch-items", "40", "--val-workers", "1", "--watch")
    j.wait_ready()
    time.sleep(2)
    r = loadertop("snapshot", str(j.pid), "--duration", "3", "--interval", "0.5", "--json", "--no-stacks")
    loaders = only_trainer(json.loads(r.stdout))["loaders"]
    assert sorted(loader["num_workers"] for loader in loaders) == [1, 2]


@pytest.mark.live
@pytest.mark.skipif(not nobody_can_run_system_python(), reason="needs root, runuser and /usr/bin/python3")
def test_another_user_without_ptrace_still_gets_exact_data_wait(job, world_readable_loadertop):  # noqa: F811
    j = job("--workers", "1", "--persistent", "--item-ms", "6", "--batch-size", "8", "--step-ms", "10", "--watch")
    j.wait_ready()
    r = subprocess.run(
        [shutil.which("runuser"), "-u", "nobody", "--", SYSTEM_PYTHON, "-m", "loadertop", "snapshot", str(j.pid),
         "--duration", "3", "--interval", "0.5", "--json"],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": world_readable_loadertop,
                                                          "PATH": "/usr/bin:/bin"}, cwd="/",
    )
    assert r.returncode == 0, r.stderr
    trainer = only_trainer(json.loads(r.stdout))
    assert trainer["data_wait"]["source"] == "hook" and trainer["data_wait_fraction"] > 0.3


# --- the channel is untrusted input: /dev/shm is shared by every user -----------------------


def _forge(path, config: bytes = b"{}", pid: int | None = None, started: float | None = None,
           heartbeat: float | None = None) -> None:
    import os as _os

    from loadertop.hookfile import CONFIG_AT, HEADER, MAGIC, SIZE

    now = time.time()
    raw = bytearray(SIZE)
    HEADER.pack_into(raw, 0, MAGIC, pid or _os.getpid(), started or now, heartbeat or now, 10**9, 100, now, now, 0,
                     len(config), 0.0)
    raw[CONFIG_AT : CONFIG_AT + len(config)] = config
    with open(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("config,why", [(b"[]", "not an object"), (b"3", "not an object"),
                                        (b"[" * 1500 + b"]" * 1500, "not JSON"),
                                        (b'{"num_workers": "4"}', "num_workers"),
                                        (b'{"worker_pids": [1, "x"]}', "worker pid"),
                                        (b'{"dataset_class": ' + b'"' + b"x" * 300 + b'"}', "dataset_class"),
                                        (b'{"persistent_workers": 1}', "persistent_workers")])
def test_a_malformed_hook_is_an_error_with_a_reason_never_a_crash(tmp_path, config, why):
    from loadertop.probes.hook_files import HookError

    path = tmp_path / "loadertop-1-x.hook"
    _forge(path, config)
    with pytest.raises(HookError, match=why):
        read_hook(str(path))


def test_fifos_symlinks_and_other_users_files_are_refused_at_once(tmp_path):
    import os as _os

    from loadertop.probes.hook_files import HookError

    fifo = tmp_path / "loadertop-1-fifo.hook"
    _os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(HookError, match="regular file"):
        read_hook(str(fifo))  # used to block in open() forever
    assert time.monotonic() - started < 1
    real = tmp_path / "real"
    _forge(real)
    link = tmp_path / "loadertop-1-link.hook"
    link.symlink_to(real)
    with pytest.raises(HookError, match="opened safely"):
        read_hook(str(link))
    with pytest.raises(HookError, match="belongs to user"):
        read_hook(str(real), owner=_os.geteuid() + 1)
    assert read_hook(str(real), owner=_os.geteuid())["batches"] == 100
    assert read_hook(str(tmp_path / "gone.hook")) is None


def test_two_loaders_whose_files_go_in_one_tick_are_no_error():
    # Train and validation loaders end together: both files vanish between two readings.
    import os as _os

    from loadertop.probes.hook_files import HookReader
    from loadertop.probes.procfs import read_stat

    pid = _os.getpid()
    loaders = [lt.watch(Loader([1, 2]), name=f"gone-{i}-{time.monotonic_ns()}") for i in range(2)]
    for loader in loaders:
        list(loader)
    reader = HookReader()
    started = read_stat(pid).started_at
    now = time.time()
    reader.data_wait(pid, started, now)
    assert reader.data_wait(pid, started, now + 0.5) is not None  # both files read
    for loader in loaders:
        loader._pub.close()
    assert reader.data_wait(pid, started, now + 1.0) is None


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to plant a file as another user")
def test_a_forged_hook_of_another_user_is_ignored_with_a_notice():
    """Another user plants loadertop-<our pid>-x.hook claiming 90% data wait: it must not
    reach the figures, and a notice says why."""
    import os as _os

    from loadertop.probes.hook_files import HookReader
    from loadertop.probes.procfs import read_stat

    pid = _os.getpid()
    path = f"/dev/shm/loadertop-{pid}-forged.hook"
    _forge(path)
    _os.chown(path, 65534, 65534)
    try:
        reader = HookReader()
        started = read_stat(pid).started_at
        assert reader.data_wait(pid, started, time.time()) is None
        assert [n.id for n in reader.notices()] == ["hook_invalid"]
        assert "belongs to user 65534" in reader.notices()[0].message
    finally:
        _os.unlink(path)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to plant a file as another user")
def test_watch_never_uses_a_file_someone_else_planted_and_writes_its_own_beside_it(tmp_path):
    import os as _os

    planted = hook_path(_os.getpid(), "planted", str(tmp_path))
    with open(planted, "wb") as f:
        f.write(b"not mine to trust")  # another user's file at our name: truncatable under our mmap
    _os.chown(planted, 65534, 65534)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # squatting the name must not turn watch() off
        loader = lt.watch(Loader([1, 2]), name="planted", directory=str(tmp_path))
        assert list(loader) == [1, 2]
    with open(planted, "rb") as f:
        assert f.read() == b"not mine to trust"  # never written into
    (ours,) = [p for p in tmp_path.iterdir() if str(p) != planted]
    assert ours.name.startswith(f"loadertop-{_os.getpid()}-planted.") and ours.stat().st_uid == _os.geteuid()
    h = read_hook(str(ours))
    assert h["name"] == "planted" and h["batches"] == 2  # the monitor reads it under the loader's name


def test_watch_replaces_a_stale_file_of_an_earlier_process_with_its_pid(tmp_path):
    import os as _os

    path = hook_path(_os.getpid(), "stale", str(tmp_path))
    _forge(path, started=1_000_000.0)  # written long before this process started
    loader = lt.watch(Loader([1, 2, 3]), name="stale", directory=str(tmp_path))
    assert list(loader) == [1, 2, 3]
    assert read_hook(path)["batches"] == 3


def test_the_hook_file_goes_when_the_script_ends_and_a_killed_jobs_file_is_swept(tmp_path):
    import os as _os

    from loadertop.probes.hook_files import STALE_AFTER_S, sweep_stale

    script = ("import loadertop, sys\n"
              f"l = loadertop.watch([1, 2], name='ends', directory={str(tmp_path)!r})\n"
              "print(list(l))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={**_os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and r.stdout.strip() == "[1, 2]"
    assert list(tmp_path.iterdir()) == []
    # A SIGKILLed job cannot remove its own: the reader removes it once it has been silent long.
    dead = 2**22 + 12345  # above pid_max's default: no such process
    old = time.time() - STALE_AFTER_S - 10
    _forge(tmp_path / f"loadertop-{dead}-train.hook", pid=dead, started=old, heartbeat=old)
    _forge(tmp_path / f"loadertop-{dead}-fresh.hook", pid=dead)  # beat recently: maybe another namespace's
    assert sweep_stale(str(tmp_path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [f"loadertop-{dead}-fresh.hook"]


def test_a_full_dev_shm_disables_the_hook_instead_of_killing_the_job():
    """A full /dev/shm is what loadertop diagnoses: watch() must warn and go on, not take
    SIGBUS on its first write into a sparse file."""
    import os as _os

    if _os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare")
    script = ("import warnings, loadertop\n"
              "warnings.simplefilter('always')\n"
              "with open('/dev/shm/fill', 'wb') as f:\n"
              "    try:\n"
              "        f.write(b'x' * 2**20)\n"
              "    except OSError:\n"
              "        pass\n"
              "with warnings.catch_warnings(record=True) as w:\n"
              "    l = loadertop.watch([1, 2, 3], name='full')\n"
              "    print(sum(l), len(w), 'disabled' in str(w[0].message) if w else None)\n")
    r = subprocess.run([*shm_wrapper("64k"), sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60, env={**_os.environ, "PYTHONPATH": str(REPO)})
    if "mount" in r.stderr and r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr  # 135 would be SIGBUS
    assert r.stdout.split() == ["6", "1", "True"]


@pytest.mark.live
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_a_trainer_in_its_own_pid_namespace_is_matched_through_nspid(job):
    """In a container the hook names its file with the container's pid; the host reads the
    trainer under its host pid: the two meet through NSpid."""
    r = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("pid namespaces are not permitted here")
    from support.jobs import PYTHON

    j = job("--workers", "1", "--persistent", "--item-ms", "6", "--batch-size", "8", "--step-ms", "10", "--watch",
            cmd=["unshare", "-p", "-f", "--mount-proc", PYTHON])
    j.wait_ready()
    time.sleep(2)
    r = loadertop("snapshot", str(j.pid), "--duration", "3", "--interval", "0.5", "--json", "--no-stacks")
    assert r.returncode == 0, r.stderr
    trainer = only_trainer(json.loads(r.stdout))
    with open(f"/proc/{trainer['pid']}/status") as f:
        inner = int(f.read().split("NSpid:")[1].splitlines()[0].split()[-1])
    assert inner != trainer["pid"]
    assert trainer["data_wait"]["source"] == "hook" and trainer["data_wait_fraction"] > 0.3


def test_a_hook_file_truncated_under_the_job_never_kills_it(tmp_path):
    # A cleanup script or an epilog (the job's own user, or root) truncates the file: the
    # next batch wrote into a mapping past its end and died of SIGBUS (exit 135). It goes on.
    script = (
        "import loadertop, os, sys\n"
        f"l = loadertop.watch(list(range(1000)), name='cut', directory={str(tmp_path)!r})\n"
        "n = 0\n"
        "for i, x in enumerate(l):\n"
        "    if i == 10:\n"
        "        os.truncate(l._pub.path, 0)\n"
        "    n += 1\n"
        "print(n)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "1000"


def test_a_truncated_hook_file_is_written_whole_again_and_read_from_then_on(tmp_path):
    # Once truncated, the file stayed unreadable for the rest of the run (no header, no settings).
    loader = lt.watch(Loader(list(range(100))), name="cut-again", directory=str(tmp_path))
    path = loader._pub.path
    it = iter(loader)
    for _ in range(10):
        next(it)
    __import__("os").truncate(path, 0)
    loader._pub.checked -= 2.0  # a second has passed since the last look at the file
    for _ in range(5):
        next(it)
    h = read_hook(path)
    assert h["batches"] == 15 and h["config"]["dataset_class"] == "object"


def test_watch_never_raises_into_a_script_that_runs_with_warnings_as_errors(caplog):
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="loadertop"):
        warnings.simplefilter("error")  # `python -W error`, pytest's filterwarnings = error
        loader = lt.watch(Loader([1, 2]), directory="/nonexistent/dir")
        assert list(loader) == [1, 2]
    assert any("disabled" in r.getMessage() for r in caplog.records)


def test_a_watched_loader_can_be_copied_and_pickled(tmp_path):
    import copy
    import pickle

    loader = lt.watch(Loader([1, 2, 3]), name="copied", directory=str(tmp_path))
    for other in (copy.copy(loader), copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert list(other) == [1, 2, 3] and other.batch_size == 4
        assert type(other) is type(loader) and other._name == "copied"
    h = read_hook(hook_path(__import__("os").getpid(), "copied", str(tmp_path)))
    assert h["batches"] == 9  # the copies go on with the same figures, under the same name


@pytest.mark.parametrize("field,value,why", [
    ("batch_bytes", 2**64 - 1, "out of range"),
    ("batches", 2**63, "out of range"),
    ("in_next", 1e-300, "began before the process"),
])
def test_absurd_figures_from_the_hook_are_refused_at_the_probe(tmp_path, field, value, why):
    # What the probe takes reaches the recording, whose reader refuses figures past its range
    # (1 of 3 snapshots read back before): they are refused where they are read.
    import os as _os

    from loadertop.hookfile import HEADER, MAGIC, SIZE
    from loadertop.probes.hook_files import HookError

    now = time.time()
    values = {"batch_bytes": 0, "batches": 100, "in_next": 0.0, **{field: value}}
    raw = bytearray(SIZE)
    HEADER.pack_into(raw, 0, MAGIC, _os.getpid(), now, now, 10**9, values["batches"], now, now, values["batch_bytes"],
                     2, values["in_next"])
    raw[128:130] = b"{}"
    path = tmp_path / "absurd.hook"
    path.write_bytes(bytes(raw))
    with pytest.raises(HookError, match=why):
        read_hook(str(path))


def test_a_counter_that_goes_back_is_a_reset_not_a_negative_rate(tmp_path, monkeypatch):
    import os as _os

    from loadertop.probes import hook_files as H
    from loadertop.probes.procfs import read_stat

    path = tmp_path / f"loadertop-{_os.getpid()}-back.hook"
    monkeypatch.setattr(H, "hook_files", lambda pid: H.Listing([str(path)]))
    reader = H.HookReader()
    started = read_stat(_os.getpid()).started_at
    now = time.time()
    for i, batches in enumerate((100, 200, 50, 80)):  # the job reset its counters at the third reading
        _forge(path, config=b"{}")
        raw = bytearray(path.read_bytes())
        from loadertop.hookfile import COUNTERS, COUNTERS_AT

        COUNTERS.pack_into(raw, COUNTERS_AT, now, batches * 10**7, batches, now, now)
        path.write_bytes(bytes(raw))
        dw = reader.data_wait(_os.getpid(), started, now + i)
    assert dw is not None and dw.steps_per_s == pytest.approx(30.0) and 0 <= dw.fraction <= 1


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to plant files as another user")
def test_thousands_of_files_planted_under_a_trainers_names_are_not_opened(monkeypatch):
    # Files of other users are told apart by a stat of the listing, never opened; the
    # trainer's own user can plant at most MAX_HOOK_FILES that are read in a tick.
    import os as _os

    from loadertop.probes import hook_files as H
    from loadertop.probes.procfs import read_stat

    pid = _os.getpid()
    planted = []
    try:
        for i in range(2000):
            path = f"/dev/shm/loadertop-{pid}-p{i}.hook"
            _forge(path)
            if i >= 100:
                _os.chown(path, 65534, 65534)
            planted.append(path)
        opened = []
        real = H.read_hook
        monkeypatch.setattr(H, "read_hook", lambda path, owner=None: opened.append(path) or real(path, owner))
        reader = H.HookReader()
        reader.data_wait(pid, read_stat(pid).started_at, time.time())
        assert len([p for p in opened if f"-{pid}-" in p]) == H.MAX_HOOK_FILES
        assert any("belongs to user 65534" in n.message for n in reader.notices())
    finally:
        for path in planted:
            _os.unlink(path)
