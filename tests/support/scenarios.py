"""The live scenarios of the replay tier (issue 42): each real job the advice, diagnosis and
threads tests once started and watched with a `loadertop snapshot`, recorded once into
tests/data/scenarios/ with its ground truth, and read back by the replay tests in-process.

A scenario is the job (the demo job's flags, loadertop/demo/job.py), the host it runs on (a 1-CPU cgroup quota, a small
/dev/shm, CPU hogs beside it, its workers stopped, torchrun ranks) and the snapshot taken of it
(its duration, tick and whether py-spy reads stacks). `record` starts the job as the live test
did, samples it exactly as `loadertop snapshot` does (cli.sample_for_snapshot), judges every
tick as `loadertop record` does, and writes:

- NAME.ltrec (NAME-K.ltrec for the K-th of several consecutive snapshots): the snapshots, each
  with the live view's judgement stored beside it;
- NAME.json: the scenario, the host (CPUs, load), the commit, and the job's own measure of its
  data wait over each snapshot's window (the truth the rules are compared with).

Re-record (when a probe changes what it reads): `python3 tests/record_scenarios.py [NAME ...]`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from support.jobs import PYTHON, REPO, Job, wait_for, worker_pids

HERE = REPO / "tests" / "data" / "scenarios"
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
BUSY_LOOP = "while True: pass"
# Another process that takes one CPU 1 s of every 3 s: a load that comes and goes.
DUTY_LOOP = ("import time\nwhile True:\n    t = time.time()\n"
             "    while time.time() - t < 1.0: pass\n    time.sleep(2.0)\n")


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]  # the demo job's flags
    claim: str  # what its replay test asserts (the live test it replaces)
    host: str = ""  # "", "quota", "shm:BYTES", "hogs:N", "duty", "stopped", "torchrun:N", "two_jobs"
    duration: float = 10.0
    interval: float = 0.5
    stacks: bool = True
    snapshots: int = 1  # consecutive snapshots, each a process of its own as a person takes them
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 60.0
    # "snapshot": sampled as `loadertop snapshot` samples; "record": as `loadertop record` does
    # (the live view's cadence), for the views of a recording (`diff`, the summary, `replay`).
    sampled_as: str = "snapshot"


JOB_2W = ("--workers", "2", "--persistent", "--item-ms", "6", "--batch-size", "8", "--step-ms", "10")
# Two ranks of torchrun, gloo and a real DDP model (tests/test_ranks_live.py has the live ones).
RANKS = ("--dist", "--ddp", "--workers", "1", "--persistent", "--batch-size", "8", "--duration", "300")
SLOW_STEP = ("--item-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "1", "--slow-rank", "1", "--slow-step-cpu-ms", "25")
BALANCED = ("--sleep-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "5")
SLOW_SHARD = ("--sleep-ms", "0.5", "--slow-rank", "1", "--slow-sleep-ms", "10", "--step-ms", "5")
# Items of 10 ms of CPU work and 15 ms of waiting (a read), batches of 4, a 10 ms step: one
# worker starves the loop, two feed it about twice as fast and leave a CPU of the 2 free.
DIFF_JOB = ("--item-ms", "10", "--sleep-ms", "15", "--batch-size", "4", "--step-ms", "10", "--persistent", "--watch",
            "--duration", "120")
THREADS_JOB = ("--workers", "2", "--persistent", "--item-ms", "5", "--batch-size", "4", "--step-ms", "0")

SCENARIOS = {s.name: s for s in (
    # --- the advice (was tests/test_advice_live.py) ---------------------------------------
    Scenario("one_worker_light_main", ("--workers", "1", "--persistent", "--item-ms", "6", "--batch-size", "8",
                                       "--step-ms", "10", "--step-cpu-ms", "3"),
             "1 worker at ~95 % CPU beside a light loop on 2 CPUs gets a second worker"),
    Scenario("quota", ("--workers", "3", "--persistent", "--item-ms", "4", "--batch-size", "8", "--step-ms", "10"),
             "3 CPU-bound workers in a 1-CPU quota: THROTTLED, fewer workers, never I/O", host="quota"),
    Scenario("busy_host", JOB_2W, "2 workers beside 2 busy loops: BUSY HOST, no more workers", host="hogs:2"),
    Scenario("stopped", ("--workers", "2", "--persistent", "--item-ms", "5"),
             "SIGSTOPped workers: STALLED within a 10 s snapshot, no change", host="stopped"),
    Scenario("pinned_ranks", ("--workers", "2", "--dist", "--persistent", "--rank-cpus", "1", "--item-ms", "4",
                              "--batch-size", "8", "--step-ms", "10", "--duration", "600"),
             "2 ranks pinned to 1 CPU each: not divided again, 1 worker each", host="torchrun:2",
             env={"OMP_NUM_THREADS": "1"}, ready_timeout=90.0),
    Scenario("small_shm_advice", ("--workers", "1", "--persistent", "--item-ms", "3", "--tensor-kb", "1024",
                                  "--batch-size", "6", "--step-ms", "10"),
             "a 32 MiB /dev/shm caps the workers and prefetch proposed", host=f"shm:{32 * 2**20}"),
    Scenario("duty_load", JOB_2W, "3 consecutive snapshots beside a load 1 s in 3: one verdict",
             host="duty", duration=8.0, snapshots=3),
    # --- the diagnosis (was tests/test_diagnosis_live.py) ---------------------------------
    Scenario("healthy", ("--workers", "2", "--persistent", "--batch-size", "8", "--step-ms", "150"),
             "a healthy job: no findings, data wait under 15 %"),
    Scenario("small_tensors", ("--workers", "2", "--persistent", "--batch-size", "8", "--step-ms", "30",
                               "--tensors-per-item", "32", "--tensor-kb", "64"),
             "batches of many small tensors: slow to receive (main_process_bound), not to load", duration=12.0),
    Scenario("worker_threads", ("--workers", "2", "--persistent", "--worker-threads", "8", "--matmuls", "6",
                                "--batch-size", "2"),
             "workers running 8-thread pools: worker_threads, OMP_NUM_THREADS=1", stacks=False),
    Scenario("respawn", ("--workers", "2", "--epoch-items", "32", "--batch-size", "8", "--step-ms", "20"),
             "workers recreated every epoch: worker_respawn, persistent_workers=True"),
    Scenario("copy_on_read", ("--workers", "2", "--persistent", "--objects", "3000000", "--objects-per-item", "150",
                              "--item-ms", "10", "--batch-size", "4", "--step-ms", "5"),
             "workers reading a list of Python objects: worker_memory_growth, numpy", duration=30.0, interval=1.0,
             stacks=False, ready_timeout=120.0),
    Scenario("small_shm_fills", ("--workers", "2", "--persistent", "--prefetch", "4", "--tensor-kb", "128",
                                 "--batch-size", "8", "--step-ms", "150"),
             "8 batches of 1 MiB in a 9.5 MiB /dev/shm: shm_pressure, --shm-size", host=f"shm:{19 * 2**19}",
             duration=8.0, stacks=False),
    Scenario("two_jobs", ("--workers", "2", "--persistent", "--item-ms", "20"),
             "two jobs of 2 workers sharing 2 CPUs: each told fewer workers", host="two_jobs", duration=12.0,
             stacks=False),
    # --- the training loop's threads (was tests/test_threads_live.py) -----------------------
    Scenario("main_threads_default", (*THREADS_JOB, "--main-threads", "0"),
             "the loop at torch's default threads: OVERSUBSCRIBED, OMP_NUM_THREADS=1, no more workers"),
    Scenario("main_threads_one", (*THREADS_JOB, "--main-threads", "1"),
             "the loop on one thread: no thread advice"),
    # --- jobs of two ranks (was tests/test_ranks_live.py; tuned on every rank: live there) ---
    *(Scenario(f"ranks_{kind}_{probe}", (*RANKS, *flags, *(("--watch",) if probe == "hook" else ())), claim,
               host="torchrun:2", duration=12.0, env={"OMP_NUM_THREADS": "1"}, ready_timeout=90.0)
      for kind, flags, claim in (
          ("slow_step", SLOW_STEP, "rank 1's step is slower: SLOWEST RANK, rank 0 waits for it, no loader change"),
          ("balanced", BALANCED, "alike ranks wait for no one"),
          ("slow_shard", SLOW_SHARD, "rank 1 reads a slow shard: rank 0 waits for it, rank 1 gets more workers"))
      for probe in ("py-spy", "hook")),
    # --- before and after (was tests/test_diff.py's live test) -------------------------------
    Scenario("diff_one_worker", ("--workers", "1", *DIFF_JOB), "1 worker starves the loop: diff's before",
             stacks=False, sampled_as="record"),
    Scenario("diff_two_workers", ("--workers", "2", *DIFF_JOB), "2 workers feed it: diff's after",
             stacks=False, sampled_as="record"),
)}


# --- reading (the replay tests) --------------------------------------------------------------


def path_of(name: str, k: int = 0) -> Path:
    s = SCENARIOS[name]
    return HERE / (f"{name}.ltrec" if s.snapshots == 1 else f"{name}-{k}.ltrec")


@cache
def recording(name: str, k: int = 0):
    """The K-th snapshot's recording of a scenario (outputs.record.Recording), read once."""
    from loadertop.outputs.record import read

    return read(str(path_of(name, k)))


@cache
def meta(name: str) -> dict:
    return json.loads((HERE / f"{name}.json").read_text())


def snapshot_report(name: str, k: int = 0) -> dict:
    """What `loadertop snapshot` reported of the job, from what it sampled: the report of the
    recorded snapshots over the scenario's duration, judged again here."""
    from loadertop import cli

    return json.loads(json.dumps(cli.report_of_snapshots(recording(name, k).snapshots, SCENARIOS[name].duration)))


# --- recording (tests/record_scenarios.py) ---------------------------------------------------


def can_record(s: Scenario) -> str | None:
    """Why this host cannot run the scenario live (None: it can)."""
    from loadertop.started import can_unshare_shm

    kind = s.host.partition(":")[0]
    if kind == "quota" and (os.geteuid() != 0 or not os.access(CGROUP_V1_CPU, os.W_OK)):
        return "needs root and a writable cgroup v1 cpu controller"
    if kind == "shm" and not can_unshare_shm():
        return "unshare of a mount namespace is not permitted here"
    if kind == "torchrun" and not (shutil.which("torchrun") or (Path(PYTHON).parent / "torchrun").exists()):
        return "needs torchrun"
    return None


@contextlib.contextmanager
def _quota_group() -> Iterator[Path]:
    if os.geteuid() != 0 or not os.access(CGROUP_V1_CPU, os.W_OK):
        raise SystemExit("the quota scenario needs root and a writable cgroup v1 cpu controller")
    group = CGROUP_V1_CPU / f"loadertop-scenario-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text("100000")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 10, what="the group to empty")
        group.rmdir()


@contextlib.contextmanager
def _processes(code: str, n: int) -> Iterator[None]:
    """n Python processes running code beside the job, started detached: loadertop counts its
    own children's CPU as its own load, and the recorder samples in this process."""
    pids = [detached([PYTHON, "-c", code]) for _ in range(n)]
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def detached(cmd: list[str]) -> int:
    """Start cmd with no parent here (a shell starts it in the background and exits): its pid."""
    sh = subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *cmd],
                        capture_output=True, text=True, check=True)
    return int(sh.stdout.strip())


@contextlib.contextmanager
def started(s: Scenario, tmp: Path) -> Iterator[list[Job]]:
    """The scenario's job(s) on its host, ready; every process killed on the way out."""
    from loadertop.started import shm_wrapper

    with contextlib.ExitStack() as stack:
        cmd = None
        kind, _, value = s.host.partition(":")
        if kind == "quota":
            group = stack.enter_context(_quota_group())
            cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"', PYTHON]
        elif kind == "shm":
            cmd = [*shm_wrapper(int(value)), PYTHON]
        elif kind == "hogs":
            stack.enter_context(_processes(BUSY_LOOP, int(value)))
        elif kind == "duty":
            stack.enter_context(_processes(DUTY_LOOP, 1))
        elif kind == "torchrun":
            torchrun = shutil.which("torchrun") or str(Path(PYTHON).parent / "torchrun")
            cmd = [torchrun, "--standalone", f"--nproc_per_node={value}"]
        jobs = [Job(*s.args, cmd=cmd, env=s.env, tmp=tmp) for _ in range(2 if kind == "two_jobs" else 1)]
        for j in jobs:
            stack.callback(j.kill)
        for j in jobs:
            if kind == "torchrun":
                for rank in range(int(value)):
                    j.wait_ready(suffix=f".{rank}", timeout=s.ready_timeout)
            else:
                j.wait_ready(timeout=s.ready_timeout)
        if kind == "stopped":
            workers = wait_for(lambda: w if len(w := worker_pids(jobs[0].pid)) == 2 else None, 30)
            for w in workers:
                os.kill(w, signal.SIGSTOP)
            stack.callback(lambda: [os.kill(w, signal.SIGCONT) for w in workers if os.path.exists(f"/proc/{w}")])
        yield jobs


def _truth(jobs: list[Job]) -> dict[str, dict]:
    """Each job's truth file (each rank's, under torchrun: FILE.RANK), by job and rank."""
    out = {}
    for i, j in enumerate(jobs):
        for p in j.truth_path.parent.glob(j.truth_path.name + "*"):
            rank = p.name[len(j.truth_path.name):]
            if rank.endswith(".tmp"):
                continue
            with contextlib.suppress(OSError, ValueError):
                out[f"job{i}{rank}"] = json.loads(p.read_text())
    return out


def record(name: str) -> None:
    """Start the scenario, take its snapshot(s) as `loadertop snapshot` does, write them."""
    from loadertop import cli
    from loadertop.outputs import judgement
    from loadertop.outputs.record import Recorder, read
    from loadertop.rules import Diagnoser

    s = SCENARIOS[name]
    missing = can_record(s)
    if missing:
        raise SystemExit(f"{name}: {missing}")
    HERE.mkdir(parents=True, exist_ok=True)
    windows = []
    with tempfile.TemporaryDirectory() as tmp, started(s, Path(tmp)) as jobs:
        kind, _, value = s.host.partition(":")
        files = len(jobs) * (int(value) if kind == "torchrun" else 1)
        # The job writes its truth every 0.5 s from its first batch on.
        wait_for(lambda: len(_truth(jobs)) >= files, 30, what="the jobs' truth files")
        for k in range(s.snapshots):
            before = _truth(jobs)
            path = str(path_of(name, k))
            if s.sampled_as == "record":
                _record_as_record(s, [j.pid for j in jobs], path)
                after = _truth(jobs)
                windows.append({"ticks": len(read(path).snapshots), "data_wait": _waits(before, after)})
                continue
            args = Namespace(pids=[j.pid for j in jobs], duration=s.duration, interval=s.interval,
                             no_stacks=not s.stacks)
            snaps, _ = cli.sample_for_snapshot(args)
            after = _truth(jobs)
            recorder = Recorder(path)
            diagnoser = Diagnoser()
            for snap in snaps:
                diagnoser.feed(snap)
                recorder.write(snap, judgement.encode(diagnoser.diagnosis))
            recorder.close()
            windows.append({"ticks": len(snaps), "data_wait": _waits(before, after)})
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    (HERE / f"{name}.json").write_text(json.dumps({
        "scenario": asdict(s),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git.stdout.strip(),
        "host": {"cpus": len(os.sched_getaffinity(0)), "load_avg": os.getloadavg()},
        "windows": windows,
    }, indent=1) + "\n")


def _record_as_record(s: Scenario, pids: list[int], path: str) -> None:
    """`loadertop record` itself, in this process; the summary it writes beside is not kept."""
    import signal as signals

    from loadertop import cli

    args = ["record", *map(str, pids), "-o", path, "--duration", str(s.duration), "--interval", str(s.interval)]
    try:
        assert cli.main([*args, *([] if s.stacks else ["--no-stacks"])]) == 0
    finally:
        signals.signal(signals.SIGPIPE, signals.SIG_IGN)
    Path(path).with_suffix(".summary.md").unlink(missing_ok=True)


def _waits(before: dict[str, dict], after: dict[str, dict]) -> dict[str, float]:
    """Each trainer's own data wait over the window, by its pid: waited / elapsed between the
    truth files (each job's, each rank's) read before and after it."""
    out = {}
    for key, t in after.items():
        b = before.get(key)
        if b is not None and t["elapsed_s"] > b["elapsed_s"]:
            out[str(t["pid"])] = round((t["wait_s"] - b["wait_s"]) / (t["elapsed_s"] - b["elapsed_s"]), 4)
    return out
