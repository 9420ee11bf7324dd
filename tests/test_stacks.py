"""Data wait and worker frames from py-spy: parsing of captured outputs, then live jobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.jobs import loadertop
from support.reports import SCHEMA, only_trainer
from support.users import SYSTEM_PYTHON, nobody_can_run_system_python

from loadertop.probes import pyspy, stacks
from loadertop.probes.pyspy import MAIN, WAIT, classify_main, parse_dump, parse_raw
from loadertop.probes.stacks import error_notice
from loadertop.vocabulary import LOOP_NAMES

DATA = Path(__file__).parent / "data"
# The PIDs the captured outputs were taken from: trainer with 2 workers, trainer with
# num_workers=0, and worker 1 of the first.
STARVED_PID, NO_WORKERS_PID, WORKER_PID = (int(p) for p in (DATA / "pids.txt").read_text().split())

NEXT = "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)"
ROOT = ["<module> (train.py:10)", "main (train.py:40)"]


def test_captured_record_of_a_starved_trainer():
    counts = parse_raw((DATA / "record-starved-2-workers.txt").read_text(), STARVED_PID)
    total = sum(counts.values())
    assert total > 100
    assert counts[WAIT] / total > 0.3  # blocked on workers most of the time
    assert counts.get(MAIN, 0) < counts[WAIT]
    assert {"forward", "backward", "optimizer"} <= set(counts)


def test_captured_record_with_num_workers_0_is_main_process_work():
    counts = parse_raw((DATA / "record-num-workers-0.txt").read_text(), NO_WORKERS_PID)
    assert counts[MAIN] > 5 * counts.get(WAIT, 0)


def test_other_threads_are_not_the_main_thread():
    text = (DATA / "record-starved-2-workers.txt").read_text()
    assert parse_raw(text, STARVED_PID + 999) == {}


@pytest.mark.parametrize(
    "tail,expected",
    [
        # waiting on the worker result queue
        (["_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291)",
          "Queue.get (multiprocessing/queues.py:113)",
          "Connection.poll (multiprocessing/connection.py:257)"], WAIT),
        # pin_memory=True: waiting on the pin thread's queue.Queue
        (["_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291)",
          "Queue.get (queue.py:180)", "Condition.wait (threading.py:331)"], WAIT),
        # the fd hand-shake with the worker's resource sharer: blocked on the worker
        (["Queue.get (multiprocessing/queues.py:122)",
          "rebuild_storage_fd (torch/multiprocessing/reductions.py:538)",
          "Connection._recv_bytes (multiprocessing/connection.py:430)"], WAIT),
        # unpickling a large batch: work in the main process
        (["Queue.get (multiprocessing/queues.py:122)",
          "rebuild_storage_fd (torch/multiprocessing/reductions.py:540)"], MAIN),
        # num_workers=0: the dataset runs in the main process
        (["_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:785)",
          "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:54)",
          "Data.__getitem__ (data.py:9)"], MAIN),
    ],
)
def test_data_wait_split(tail, expected):
    assert classify_main([*ROOT, NEXT, *tail]) == expected


@pytest.mark.parametrize(
    "frames,expected",
    [
        (["Tensor.backward (torch/_tensor.py:623)", "backward (torch/autograd/__init__.py:395)"], "backward"),
        (["SGD.step (torch/optim/sgd.py:127)"], "optimizer"),
        (["Module._wrapped_call_impl (torch/nn/modules/module.py:1778)",
          "Net.forward (model.py:5)"], "forward"),
        (["synchronize (torch/cuda/__init__.py:1040)"], "device_sync"),
        (["log (train.py:80)"], "other"),
    ],
)
def test_rest_of_the_step(frames, expected):
    assert classify_main([*ROOT, *frames]) == expected


DISPATCH = "DataLoaderDispatcher.__iter__ (accelerate/data_loader.py:868)"


def test_a_rank_waiting_for_accelerates_dispatch_is_data_wait_told_apart():
    # Accelerate's DataLoaderDispatcher: rank 0 loads (torch's __next__ inside) and
    # broadcasts; the other ranks wait in the broadcast, inside the same generator.
    rank1 = [*ROOT, DISPATCH, "DataLoaderDispatcher._fetch_batches (accelerate/data_loader.py:812)",
             "broadcast_object_list (accelerate/utils/operations.py:560)",
             "broadcast_object_list (torch/distributed/distributed_c10d.py:3478)"]
    rank0 = [*ROOT, DISPATCH, "DataLoaderDispatcher._fetch_batches (accelerate/data_loader.py:790)", NEXT,
             "_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291)",
             "Queue.get (multiprocessing/queues.py:113)", "Connection.poll (multiprocessing/connection.py:257)"]
    compute = [*ROOT, "Module._wrapped_call_impl (torch/nn/modules/module.py:1778)"]
    assert classify_main(rank1) == WAIT and classify_main(rank0) == WAIT

    def raw(stacks):
        return "".join(f"thread (7): MainThread;{';'.join(frames)} {n}\n" for frames, n in stacks)

    waiting = parse_raw(raw([(rank1, 60), (compute, 40)]), 7)
    assert waiting == {WAIT: 60, pyspy.DISPATCHED: 60, "forward": 40, "loop accelerate": 60}
    dw = pyspy.data_wait_from_counts(waiting, 10.0, 0.0)
    assert dw.fraction == pytest.approx(0.6) and dw.dispatched_fraction == pytest.approx(0.6)
    assert dw.loop == "accelerate"
    loading = pyspy.data_wait_from_counts(parse_raw(raw([(rank0, 60), (compute, 40)]), 7), 10.0, 0.0)
    assert loading.fraction == pytest.approx(0.6) and loading.dispatched_fraction is None


HF_TRAINER = ["Trainer.train (transformers/trainer.py:2245)",
              "Trainer._inner_training_loop (transformers/trainer.py:2556)"]
LIGHTNING_FIT = ["_FitLoop.run (lightning/pytorch/loops/fit_loop.py:216)",
                 "_PrefetchDataFetcher.__next__ (lightning/pytorch/loops/fetchers.py:134)"]
SHARD = ["DataLoaderShard.__iter__ (accelerate/data_loader.py:577)"]


@pytest.mark.parametrize("outer,loop", [
    ([], None),  # a loop and a loader of the script's own
    (SHARD, "accelerate"),  # the script's own loop over a loader Accelerate prepared
    ([*HF_TRAINER, *SHARD], "huggingface"),  # it fetches through Accelerate: the outer loop counts
    (LIGHTNING_FIT, "lightning"),
])
def test_the_loop_a_loader_runs_in_is_read_from_its_frames(outer, loop):
    # A sample in compute shows only the frames outside the fetch.
    fetch = [*ROOT, *outer, NEXT, "Queue.get (multiprocessing/queues.py:113)"]
    compute = [*ROOT, *(f for f in outer if f not in SHARD), "Module._wrapped_call_impl (torch/nn/modules/module.py:1778)"]
    raw = f"thread (7): MainThread;{';'.join(fetch)} 30\nthread (7): MainThread;{';'.join(compute)} 70\n"
    dw = pyspy.data_wait_from_counts(parse_raw(raw, 7), 10.0, 0.0)
    assert dw.fraction == pytest.approx(0.3)  # the loops' own counts are not samples of a category
    assert dw.loop == loop
    assert [name for name, _ in pyspy.LOOPS] == list(LOOP_NAMES)


def test_captured_dump_gives_worker_arguments():
    info = parse_dump((DATA / "dump-worker-locals.json").read_text(), WORKER_PID)
    assert (info.worker_id, info.num_workers, info.persistent_workers) == (1, 2, True)
    assert info.dataset_class == "MapData"
    assert info.doing == "waiting for indices"


def _frame(name, filename, line=1):
    return {"name": name, "filename": filename, "short_filename": os.path.basename(filename), "line": line}


def test_worker_doing_names_the_dataset_and_the_innermost_user_frame():
    lib = "/usr/lib/python3.11/site-packages/torch/utils/data/_utils"
    frames = [  # leaf first, as py-spy dumps them
        _frame("Image.decode", "/usr/lib/python3.11/site-packages/PIL/Image.py"),
        _frame("load_image", "/home/me/project/aug.py", 51),
        _frame("Faces.__getitem__", "/home/me/project/data.py", 42),
        _frame("_MapDatasetFetcher.fetch", f"{lib}/fetch.py"),
        _frame("_worker_loop", f"{lib}/worker.py"),
    ]
    assert pyspy.worker_doing(frames) == "Faces.__getitem__ > load_image (aug.py:51)"
    assert pyspy.worker_doing(frames[2:]) == "Faces.__getitem__ (data.py:42)"
    collating = [_frame("default_collate", f"{lib}/collate.py"), *frames[3:]]
    assert pyspy.worker_doing(collating) == "collating"


def test_permission_error_says_how_to_fix():
    n = error_notice("Error: Permission Denied: Try running again with elevated permissions", os.getpid())
    assert n.id == "data_wait_ptrace" and n.trainer_pid == os.getpid()
    assert "SYS_PTRACE" in n.fix or "root" in n.fix


# --- live -------------------------------------------------------------------------


def _truth_fraction(truth: dict, seconds: float) -> float:
    log = truth["log"]
    end = log[-1]
    start = next((e for e in log if e[0] >= end[0] - seconds), log[0])
    return (end[1] - start[1]) / (end[2] - start[2])


def _report(pid: int, duration: int = 8) -> dict:
    import jsonschema

    r = loadertop("snapshot", str(pid), "--duration", str(duration), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    jsonschema.validate(report, SCHEMA)
    return report


@pytest.mark.live
def test_worker_ids_match_the_dataloader(job):
    j = job("--workers", "3", "--persistent", "--item-ms", "5", "--iterable")
    j.wait_ready()
    trainer = only_trainer(_report(j.pid, duration=5))
    assert sorted(w["worker_id"] for w in trainer["workers"]) == [0, 1, 2]
    assert trainer["loaders"][0]["num_workers"] == 3
    assert trainer["loaders"][0]["dataset_class"] == "StreamData"


@pytest.mark.live
def test_num_workers_0_is_main_process_bound(job):
    j = job("--workers", "0", "--item-ms", "6", "--batch-size", "8", "--step-ms", "5")
    j.wait_ready()
    dw = only_trainer(_report(j.pid, duration=5))["data_wait"]
    # ~90% on an idle machine; a busy CI machine slows the step as much as the loading.
    assert dw["main_process_fraction"] > 0.3 and dw["main_process_fraction"] > 5 * dw["worker_wait_fraction"]


@pytest.mark.live
def test_target_that_exits_mid_window_keeps_its_samples(job):
    j = job("--workers", "1", "--persistent", "--item-ms", "12", "--duration", "5")
    j.wait_ready()
    trainer = only_trainer(_report(j.pid, duration=10))
    assert trainer["status"] == "exited"
    assert trainer["data_wait"] is not None and trainer["data_wait"]["samples"] > 5


@pytest.mark.live
@pytest.mark.skipif(not nobody_can_run_system_python(), reason="needs root, runuser and /usr/bin/python3")
def test_unprivileged_run_gives_null_and_the_fix(job, world_readable_loadertop):  # noqa: F811
    pyspy = stacks.find_pyspy()
    assert pyspy, "py-spy is a dependency"
    shutil.copy(pyspy, Path(world_readable_loadertop) / "py-spy")
    os.chmod(Path(world_readable_loadertop) / "py-spy", 0o755)
    j = job("--workers", "1", "--persistent", "--item-ms", "5")
    j.wait_ready()
    env = {"PYTHONPATH": world_readable_loadertop, "PATH": f"{world_readable_loadertop}:/usr/bin:/bin"}
    r = subprocess.run(
        [shutil.which("runuser"), "-u", "nobody", "--", SYSTEM_PYTHON, "-m", "loadertop", "snapshot",
         str(j.pid), "--duration", "2", "--json"],
        capture_output=True, text=True, timeout=60, env=env, cwd="/",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    trainer = only_trainer(report)
    assert trainer["data_wait_fraction"] is None
    assert trainer["workers"][0]["cpu_percent"] is not None  # everything else still works
    notice = next(n for n in report["notices"] if n["id"] == "data_wait_ptrace")
    assert "another user" in notice["message"] and "root" in notice["fix"]


@pytest.mark.live
def test_duty_cycle_dumps_new_workers_at_once_and_counts_a_stall_across_gaps(job):
    """The live view's py-spy settings: a window every few seconds and rare dumps. Workers
    found on attach still get their arguments within seconds, and a loop that waited all
    through consecutive windows is counted as stalled in the gaps between them too."""
    import signal
    import time

    from support.jobs import wait_for, worker_pids

    from loadertop.probes.stacks import StackSampler

    j = job("--workers", "3", "--persistent", "--item-ms", "5")
    j.wait_ready()
    workers = j.wait_workers(3)
    sampler = StackSampler(window_s=2, gap_s=3.0, rolling_s=10.0, dump_interval_s=600.0, dump_burst=3)
    try:
        sampler.watch({j.pid: tuple(sorted(workers))})
        # One dump every 600 s, but three saved up: each worker is dumped a second apart.
        infos = wait_for(lambda: i if all(i := [sampler.worker(w) for w in workers]) else None, 20,
                         what="a dump of every worker")
        assert sorted(i.worker_id for i in infos) == [0, 1, 2]
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        time.sleep(1)  # the prefetched batches drain; from here the loop only waits

        def stalled_windows():
            runs = [(start, end) for start, end, dw in sampler.windows(j.pid)
                    if dw.samples and dw.fraction >= 0.95]
            return runs if len(runs) >= 2 else None

        runs = wait_for(stalled_windows, 30, what="two stalled windows")
        dw = sampler.data_wait(j.pid)
        in_windows = sum(end - start for start, end in runs)
        # Two 2 s windows with a 3 s gap: ~7 s stalled, not the 4 s the windows cover.
        assert dw.stalled_for_s >= in_windows + 2.0, (dw.stalled_for_s, runs)
    finally:
        for w in worker_pids(j.pid):
            os.kill(w, signal.SIGCONT)
        sampler.close()


# --- a py-spy that misbehaves, a pid that is reused --------------------------------------------


@pytest.mark.parametrize("text", ["null", "{}", "[1]", '[{"frames": 3}]', '[{"frames": [{"locals": [7]}]}]',
                                  "[" * 1500 + "]" * 1500, "not json"])
def test_a_dump_of_any_other_shape_is_nothing_not_an_exception(text):
    assert parse_dump(text, 1234) is None


def test_a_py_spy_that_cannot_run_is_a_notice_and_the_thread_goes_on(tmp_path):
    import threading

    from support.jobs import wait_for

    broken = tmp_path / "py-spy"
    broken.write_bytes(b"\x7fELF not really")  # ENOEXEC: a binary for some other machine
    broken.chmod(0o755)
    sampler = stacks.StackSampler(window_s=1, pyspy=str(broken))
    try:
        sampler.watch({os.getpid(): ()})
        notices = wait_for(lambda: sampler.notices() or None, 10, what="a notice")
        assert any("cannot run" in n.message and "pip install" in (n.fix or "") for n in notices)
        time.sleep(0.3)
        assert sampler._thread.is_alive() and threading.active_count() >= 2
    finally:
        sampler.close()


@pytest.mark.live
def test_py_spy_is_never_pointed_at_a_pid_whose_process_changed(job):
    """The start time given for a pid is checked before py-spy reads it: a pid reused by
    another process (here: an identity that does not match) is never sampled, and what was
    read of an earlier process with the pid is dropped."""
    from support.jobs import wait_for

    from loadertop.probes.procfs import read_stat

    j = job("--workers", "1", "--persistent", "--item-ms", "5")
    j.wait_ready()
    started = read_stat(j.pid).started_at
    sampler = stacks.StackSampler(window_s=1)
    try:
        sampler.watch({j.pid: ()}, {j.pid: started - 100.0})  # "the process we meant started earlier"
        time.sleep(3)
        assert sampler.data_wait(j.pid) is None and not sampler._recordings
        sampler.watch({j.pid: ()}, {j.pid: started})  # now the right one: sampled
        wait_for(lambda: sampler.data_wait(j.pid), 20, what="a window of the real process")
        sampler.watch({j.pid: ()}, {j.pid: started + 100.0})  # the pid is someone else now
        assert sampler.data_wait(j.pid) is None
    finally:
        sampler.close()


def _dump_of(pid: int, frames: list[tuple[str, str]]) -> str:
    """A py-spy dump of one main thread, frames leaf first as py-spy gives them."""
    return json.dumps([{"os_thread_id": pid, "thread_name": "MainThread", "frames": [
        {"name": name, "filename": f"/usr/lib/python3/site-packages/{file}", "short_filename": file, "line": 1,
         "locals": [{"name": "worker_id", "repr": "0"}, {"name": "num_workers", "repr": "1"}]}
        for name, file in frames]}])


def test_a_dump_tells_a_loader_worker_that_keeps_the_trainers_name_from_another_child():
    # torchdata's StatefulDataLoader runs its own worker loop, which does not rename the
    # process: only its stack shows it is a worker.
    torchdata = parse_dump(_dump_of(7, [("get", "queue.py"), ("_worker_loop", "torchdata/stateful_dataloader/worker.py"),
                                        ("run", "multiprocessing/process.py")]), 7)
    assert torchdata.worker_loop == "torchdata/stateful_dataloader/worker.py"
    assert torchdata.worker_id == 0 and torchdata.num_workers == 1
    other = parse_dump(_dump_of(8, [("wait", "threading.py"), ("serve", "wandb/service.py")]), 8)
    assert other.worker_loop is None


def test_a_stateful_loader_in_the_main_process_is_loading_not_waiting():
    frames = ["<module> (train.py:9)",
              "_StatefulBaseDataLoaderIter.__next__ (torchdata/stateful_dataloader/stateful_dataloader.py:449)",
              "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:741)",
              "_StatefulSingleProcessDataLoaderIter._next_data (torchdata/stateful_dataloader/stateful_dataloader.py:490)",
              "Slow.__getitem__ (train.py:30)"]
    assert pyspy.classify_main(frames) == pyspy.MAIN


def test_a_worker_id_no_dataloader_could_have_is_not_taken():
    # A process may show any locals: an id of 10**20 would reach the recording as a figure
    # its own reader refuses. Ids and counts past 65535 are no torch worker's.
    text = (DATA / "dump-worker-locals.json").read_text()
    forged = text.replace('"name": "worker_id",\n            "addr": 140684435974312,\n            "arg": true,\n'
                          '            "repr": "1"', '"name": "worker_id",\n            "addr": 140684435974312,\n'
                          '            "arg": true,\n            "repr": "100000000000000000000"')
    assert forged != text
    info = parse_dump(forged, WORKER_PID)
    assert info.worker_id is None and info.num_workers == 2


@pytest.mark.parametrize("path", ["/srv/jail/usr/lib/python3/site-packages/torch/utils/data/", ""])
def test_the_loader_is_recognised_with_full_or_bare_file_names(path):
    # The fourth review (15): a job chrooted into another root without a mount namespace of its
    # own gave bare names (py-spy could not shorten them), and the starved job read HEALTHY
    # with data wait 0.0. loadertop now asks py-spy for full names, and knows torch's iterator
    # by its class where a name comes bare anyway.
    text = (DATA / "record-starved-2-workers.txt").read_text().replace("torch/utils/data/", path)
    counts = parse_raw(text, STARVED_PID)
    total = sum(counts.values())
    assert counts.get(WAIT, 0) + counts.get(MAIN, 0) > 0.3 * total, counts


def test_a_dump_that_runs_out_of_time_is_tried_again_on_the_same_credit(tmp_path, monkeypatch):
    # Beside a CPU hog a worker's first dump ran out of time, spent the one dump saved up, and
    # the worker stayed unread for the whole interval (600 s): its id and arguments unknown.
    import subprocess
    import sys

    from support.jobs import wait_for

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    first = tmp_path / "first-done"
    fake = tmp_path / "py-spy"
    fake.write_text(f"""#!{sys.executable}
import os, sys, time
if sys.argv[1] != "dump":
    time.sleep(0.5)
    sys.exit(0)
if not os.path.exists({str(first)!r}):
    open({str(first)!r}, "w").close()
    time.sleep(3)  # past the timeout
print({_dump_of(worker.pid, [("_worker_loop", "torch/utils/data/_utils/worker.py")])!r})
""")
    fake.chmod(0o755)
    monkeypatch.setattr(stacks, "DUMP_TIMEOUT_S", 0.5)
    sampler = stacks.StackSampler(window_s=1, dump_interval_s=600.0, dump_burst=1, pyspy=str(fake))
    try:
        sampler.watch({os.getpid(): (worker.pid,)})
        info = wait_for(lambda: sampler.worker(worker.pid), 10, what="the worker read after its dump timed out")
        assert info.worker_id == 0 and first.exists()
    finally:
        sampler.close()
        worker.kill()
        worker.wait()
