import os
import re
import signal
import time

import pytest
from support.jobs import Job, worker_pids
from support.users import world_readable_loadertop  # noqa: F401 (a fixture, for every test)

from loadertop.rules import RAISE_RULE_ERRORS

# A rule that raises fails the test that fed it (in use it is a notice naming the rule);
# set here so that the CLI and TUI the tests start inherit it.
os.environ[RAISE_RULE_ERRORS] = "1"

# A suite started in the background by a non-interactive shell (`pytest &`, a CI step) has
# SIGINT ignored, and every process it starts inherits that: the tests that press Ctrl-C on
# `loadertop export` or `tune` would wait forever. Ctrl-C means Ctrl-C in what the tests start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    """Tiers by what a test needs (docs/TESTING.md):
    - `live`: it starts a real training job (the `job` fixture, or a module or test marked
      live: torchrun, a framework's fit, tune's trials, py-spy on a live job), a browser or
      tmux. Run serially: its readings are the host's.
    - `replay`: it reads the recorded scenarios (tests/data/scenarios, support/scenarios.py).
    - `unit`: everything else: synthetic snapshots, the rules, the Pilot and screen snapshots,
      recordings written by the test, the CLI on bad input.
    unit and replay run in parallel (`pytest -m "not live" -n 2`), live after them alone."""
    for item in items:
        if {"job", "watched_job"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.live)
        if item.get_closest_marker("live") is None and item.get_closest_marker("replay") is None:
            item.add_marker(pytest.mark.unit)


@pytest.fixture
def job(tmp_path):
    """Start real training jobs; every one is killed when the test ends, pass or fail."""
    started = []

    def start(*args, **kw):
        j = Job(*args, tmp=tmp_path, **kw)
        started.append(j)
        return j

    yield start
    for j in started:
        j.kill()


class _Watched:
    """The one job of the session that tests only watch (started at its first use)."""

    job: Job | None = None


@pytest.fixture(scope="session")
def _watched(tmp_path_factory):
    holder = _Watched()
    yield holder
    if holder.job is not None:
        holder.job.kill()


@pytest.fixture
def watched_job(_watched, tmp_path_factory) -> Job:
    """A generic job (2 persistent workers, 5 ms items) shared by the tests that only watch it:
    one start-up for all of them. Started again where an earlier test left it dead; a test that
    stops, kills or changes its job starts its own (`job`)."""
    j = _watched.job
    if j is None or j.proc.poll() is not None or len(worker_pids(j.pid)) < 2:
        if j is not None:
            j.kill()
        j = _watched.job = Job("--workers", "2", "--persistent", "--item-ms", "5", "--duration", "3600",
                               tmp=tmp_path_factory.mktemp("watched"))
        j.wait_ready()
    j.wait_workers(2)
    return j


LEFTOVERS = ("sem.mp-", "torch_", "loadertop-")


@pytest.fixture(scope="session", autouse=True)
def dev_shm_left_as_found():
    """SIGKILLed jobs leave their multiprocessing semaphores (and maybe tensors) in /dev/shm:
    at the end, remove what appeared during this session that no live process still maps or
    holds open (another session running beside this one, an xdist worker's or a person's, has
    its jobs' hook files open and their semaphores mapped: they are left alone)."""
    started = time.time()
    yield
    in_use = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                in_use.update(re.findall(r"/dev/shm/(\S+)", f.read()))
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("/dev/shm/"):
                in_use.add(target[len("/dev/shm/"):])
    try:
        entries = list(os.scandir("/dev/shm"))
    except OSError:
        return
    for e in entries:
        try:
            if e.name.startswith(LEFTOVERS) and e.name not in in_use and e.stat().st_mtime >= started:
                os.unlink(e.path)
        except OSError:
            continue
