"""loadertop.watch(): exact data wait published from inside the training script."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import warnings

import pytest
from jobs import loadertop
from test_isolation import SYSTEM_PYTHON, _nobody_can_run_system_python, world_readable_loadertop  # noqa: F401
from test_snapshot_cli import only_trainer

import loadertop as lt
from loadertop.hook import hook_path, read_hook


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


def test_two_loaders_are_told_apart(job):
    j = job("--workers", "2", "--persistent", "--epoch-items", "40", "--val-workers", "1", "--watch")
    j.wait_ready()
    time.sleep(2)
    r = loadertop("snapshot", str(j.pid), "--duration", "3", "--interval", "0.5", "--json", "--no-stacks")
    loaders = only_trainer(json.loads(r.stdout))["loaders"]
    assert sorted(loader["num_workers"] for loader in loaders) == [1, 2]


@pytest.mark.skipif(not _nobody_can_run_system_python(), reason="needs root, runuser and /usr/bin/python3")
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
