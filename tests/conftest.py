import os
import re
import signal
import time

import pytest
from support.jobs import Job
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
        if "job" in getattr(item, "fixturenames", ()):
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
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    in_use.add(target[len("/dev/shm/"):])
        except OSError:
            continue
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
