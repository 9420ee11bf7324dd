"""`loadertop snapshot` end to end on real training jobs: exact worker sets against /proc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
from support.jobs import PYTHON, REPO, comm, descendants, loadertop, python_sleeper, wait_for, worker_pids
from support.reports import SCHEMA, only_trainer, snapshot

from loadertop.sampler import Sampler
from loadertop.started import stop_job


def test_workers_found_for_each_start_method(job):
    # One job per start method, started together and read in one snapshot.
    contexts = ("fork", "spawn", "forkserver")
    jobs = {c: job("--workers", "3", "--context", c, "--item-ms", "2", "--persistent") for c in contexts}
    truths = {}
    for c, j in jobs.items():
        j.wait_ready()
        truths[c] = j.wait_workers(3)
    report = snapshot(*(j.pid for j in jobs.values()))
    by_pid = {t["pid"]: t for t in report["trainers"]}
    assert set(by_pid) == {j.pid for j in jobs.values()}
    for context, j in jobs.items():
        trainer = by_pid[j.pid]
        assert {w["pid"] for w in trainer["workers"]} == truths[context], context
        if context != "fork":
            # spawn and forkserver start a resource tracker: a child, but never a worker
            helpers = [p for p in descendants(j.pid) if comm(p) != "pt_data_worker"]
            assert helpers, f"expected multiprocessing helpers under the {context} trainer"
            assert not set(helpers) & {w["pid"] for w in trainer["workers"]}
        for w in trainer["workers"]:
            assert w["rss_bytes"] > 0 and w["threads"] >= 1
            assert w["cpu_percent"] is not None and w["uss_bytes"] is not None
            # read every tick (each worker's main thread), not only on the slow cadence
            assert w["runqueue_wait_s_per_s"] is not None


def test_iterable_dataset_and_validation_loader_both_counted(job):
    j = job("--workers", "2", "--iterable", "--epoch-items", "64", "--val-workers", "1",
            "--persistent", "--item-ms", "1")
    j.wait_ready()
    # The train loader keeps 2 workers; the validation loader adds 1 at each epoch's end.
    seen = wait_for(lambda: w if len(w := worker_pids(j.pid)) == 3 else None, 60, what="3 workers")
    sampler = Sampler([j.pid], gpu=_no_gpu())
    found = wait_for(lambda: _worker_set(sampler) if len(_worker_set(sampler)) == 3 else None, 60,
                     what="loadertop to see 3 workers")
    assert len(found) == 3 and found & seen


def _worker_set(sampler) -> set[int]:
    snap = sampler.tick()
    return {w.pid for t in snap.trainers for w in t.workers}


def _no_gpu():
    from loadertop.probes.gpu import GpuProbe

    class Missing:
        def nvmlInit(self):
            raise ImportError

    return GpuProbe(lib=Missing())


def test_short_epochs_without_persistent_workers_count_respawns(job):
    j = job("--workers", "2", "--epoch-items", "32", "--batch-size", "8", "--step-ms", "20")
    j.wait_ready()
    # Epochs of ~0.1 s plus the workers' start: every tick sees a new set, which replaces the
    # last one on the same tick (counted as respawns all the same).
    trainer = only_trainer(snapshot(j.pid, duration=4))
    assert trainer["worker_respawns"] >= 2
    r = snapshot(j.pid, duration=2)
    assert any(e["kind"] == "worker_exited" for e in r["events"])


def test_late_loader_is_a_trainer_with_zero_workers_until_it_starts(job):
    j = job("--workers", "2", "--late-start", "4", "--persistent")
    wait_for(lambda: Path(f"/proc/{j.pid}").exists(), 10)
    sampler = Sampler([j.pid], gpu=_no_gpu())
    first = sampler.tick()
    assert [t.pid for t in first.trainers] == [j.pid]
    assert first.trainers[0].workers == ()
    assert any(n.id == "no_workers" for n in first.notices)
    wait_for(lambda: len(sampler.tick().trainers[0].workers) == 2, 60, what="workers to appear")
    last = sampler.tick()
    assert {w.pid for w in last.trainers[0].workers} == worker_pids(j.pid)
    assert last.trainers[0].worker_respawns == 0
    assert not any(n.id == "no_workers" for n in last.notices)


def test_job_that_exits_mid_snapshot_is_reported_as_exited(job):
    j = job("--workers", "2", "--duration", "3", "--persistent")
    j.wait_ready()
    workers = worker_pids(j.pid)
    trainer = only_trainer(snapshot(j.pid, duration=8))
    assert trainer["status"] == "exited"
    assert {w["pid"] for w in trainer["workers"]} == workers
    assert all(w["status"] == "exited" for w in trainer["workers"])


def two_ranks(launcher: int, workers: int) -> dict[int, set[int]]:
    """The two ranks under a torchrun launcher and their workers, straight from /proc, polled
    until both are there with all their workers."""
    def read():
        ranks = {p: worker_pids(p) for p in descendants(launcher) if comm(p) != "pt_data_worker"}
        ranks = {p: w for p, w in ranks.items() if w}
        return ranks if len(ranks) == 2 and all(len(w) == workers for w in ranks.values()) else None

    return wait_for(read, 30, what="two ranks with their workers")


def test_torchrun_ranks_are_two_trainers_and_a_rank_pid_is_taken_directly(job):
    torchrun = shutil.which("torchrun") or str(Path(PYTHON).parent / "torchrun")
    j = job("--workers", "2", "--dist", "--persistent", "--duration", "600",
            cmd=[torchrun, "--standalone", "--nproc_per_node=2"], env={"OMP_NUM_THREADS": "1"})
    j.wait_ready(suffix=".0", timeout=90)
    j.wait_ready(suffix=".1", timeout=90)
    truth = two_ranks(j.pid, workers=2)
    report = snapshot(j.pid)
    trainers = sorted(report["trainers"], key=lambda t: t["rank"])
    assert [t["rank"] for t in trainers] == [0, 1]
    assert [t["local_rank"] for t in trainers] == [0, 1]
    for t in trainers:
        assert t["job_pid"] == j.pid
        assert t["env"]["WORLD_SIZE"] == "2"
        assert {w["pid"] for w in t["workers"]} == truth[t["pid"]]
        assert len(t["workers"]) == 2
    # A rank's own pid, given in place of the launcher's: that rank alone.
    rank = sorted(truth)[1]
    trainer = only_trainer(snapshot(rank))
    assert trainer["pid"] == rank and trainer["rank"] in (0, 1)
    assert {w["pid"] for w in trainer["workers"]} == truth[rank]


def test_secrets_in_argv_and_environment_never_reach_the_report(job):
    j = job("--workers", "1", "--persistent",
            env={"WANDB_API_KEY": "wandb-secret-1234", "OMP_NUM_THREADS": "3",
                 "AWS_SECRET_ACCESS_KEY": "aws-secret-5678"})
    j.wait_ready()
    # Secrets on the command line: a wrapper shell passes them as arguments to the job.
    w = python_sleeper("--api-key", "k-secret-9", "--token=t-secret-8", "PASSWORD=p-secret-7",
                       "https://user:url-secret-6@host/data", seconds=30, start_new_session=True)
    try:
        report = snapshot(j.pid, w.pid)
    finally:
        w.kill()
        w.wait()
    text = json.dumps(report)
    for secret in ("wandb-secret-1234", "aws-secret-5678", "k-secret-9", "t-secret-8",
                   "p-secret-7", "url-secret-6", "WANDB_API_KEY", "AWS_SECRET"):
        assert secret not in text
    trainer = next(t for t in report["trainers"] if t["pid"] == j.pid)
    assert trainer["env"] == {"OMP_NUM_THREADS": "3"}


def test_a_wrapper_that_starts_python_is_watched_through_it():
    # A shell (srun, a container's init) in front of the script: the Python under it is the trainer.
    p = subprocess.Popen(["sh", "-c", f"{PYTHON} -c 'import time; time.sleep(30)'; :"])
    try:
        wait_for(lambda: len(descendants(p.pid)) >= 1, 10, what="the Python under the shell")
        report = snapshot(p.pid, duration=1)
    finally:
        stop_job(p)
    trainer = only_trainer(report)
    assert trainer["pid"] != p.pid and trainer["workers"] == []
    assert "no_workers" in {n["id"] for n in report["notices"]}


def test_no_such_pid_is_one_line_and_exit_2():
    r = loadertop("snapshot", "999999999", "--duration", "1")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "999999999" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", [["abc"], ["123", "--duration", "-1"], ["123", "--duration", "x"]])
def test_bad_arguments_are_one_line(bad):
    r = loadertop("snapshot", *bad)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_unwritable_output_path(tmp_path):
    p = python_sleeper(seconds=30)
    try:
        r = loadertop("snapshot", str(p.pid), "--duration", "1", "-o", "/nonexistent/dir/r.json")
        assert r.returncode == 2 and "/nonexistent/dir" in r.stderr and "Traceback" not in r.stderr
        target = tmp_path / "r.json"
        r = loadertop("snapshot", str(p.pid), "--duration", "0.5", "--no-stacks", "-o", str(target))
        assert r.returncode == 0, r.stderr
        jsonschema.validate(json.loads(target.read_text()), SCHEMA)
    finally:
        p.kill()
        p.wait()


def test_crashed_trainer_is_reported_with_how_it_died_and_its_last_data(job):
    j = job("--workers", "2", "--persistent", "--item-ms", "5")
    j.wait_ready()
    workers = j.wait_workers(2)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([PYTHON, "-m", "loadertop", "snapshot", str(j.pid), "--duration", "5", "--interval",
                             "0.5", "--json", "--no-stacks"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        # A few ticks of data first: once the snapshot reads the workers (it keeps their /proc
        # files open), two more ticks. A fixed 2 s was less than its start-up beside a CPU hog.
        wait_for(lambda: _reads(proc.pid, workers), 60, what="the snapshot to read the workers")
        time.sleep(1.0)
        os.kill(j.pid, signal.SIGKILL)
        time.sleep(0.3)
        j.proc.wait()  # reaped at once, as a shell would
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads(out)
    trainer = only_trainer(report)
    assert trainer["status"] == "exited"
    assert {w["pid"] for w in trainer["workers"]} == workers  # the last data is kept
    crash = [n for n in report["notices"] if n["id"] == "trainer_crashed"]
    assert crash and "killed by SIGKILL" in crash[0]["message"] and "OOM" in crash[0]["fix"], report["notices"]


def _reads(pid: int, targets: set[int]) -> bool:
    """The process holds /proc files of every target open (loadertop keeps what it reads each tick)."""
    try:
        links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    return all(any(link.startswith(f"/proc/{t}/") for link in links) for t in targets)


def test_memory_readings_are_shared_fairly_between_jobs(job):
    """One slow-cadence budget for every watched job, stalest first: with a budget far below
    what one job's smaps cost, the second and third jobs still get USS/PSS (they used to wait
    forever behind the first)."""
    from loadertop.probes.processes import ProcessSampler

    jobs = [job("--workers", "2", "--persistent", "--sleep-ms", "500") for _ in range(3)]
    for j in jobs:
        j.wait_ready()
        j.wait_workers(2)
    sampler = Sampler([j.pid for j in jobs], interval_s=0.1,
                      processes=ProcessSampler(slow_interval_s=1.0, slow_budget_s=0.0005))
    try:
        def everyone_read():
            snap = sampler.tick()
            procs = [p for t in snap.trainers for p in (t.main, *t.workers)]
            return len(procs) == 9 and all(p.uss_bytes is not None for p in procs)

        # 0.5 ms of reading a tick, and each process's smaps costs several on a busy host:
        # the deadline is the budget's pace there, not a quiet host's.
        wait_for(everyone_read, 90, interval=0.1, what="USS of every process of all three jobs")
    finally:
        sampler.close()
