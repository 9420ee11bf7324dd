"""What loadertop sees across isolation boundaries: a container-like /dev/shm of its own,
and an unprivileged user looking at root's job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import jsonschema
import pytest
from support.jobs import PYTHON, worker_pids
from support.reports import SCHEMA, only_trainer, snapshot
from support.users import SYSTEM_PYTHON, nobody_can_run_system_python

from loadertop.started import can_unshare_shm, shm_wrapper

# Real jobs watched by another user.
pytestmark = pytest.mark.live





@pytest.mark.skipif(not can_unshare_shm(), reason="unshare of a mount namespace is not permitted here")
def test_trainer_with_its_own_small_dev_shm(job):
    size = 48 * 1024 * 1024
    j = job("--workers", "2", "--persistent", "--tensor-kb", "64", cmd=[*shm_wrapper(size), PYTHON])
    j.wait_ready()
    shm = only_trainer(snapshot(j.pid))["shm"]
    assert shm["total_bytes"] == size, "the trainer's /dev/shm, not the host's"
    assert shm["total_bytes"] != os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    assert shm["peak_used_bytes"] >= shm["used_bytes"] >= 0


@pytest.mark.skipif(not nobody_can_run_system_python(), reason="needs root, runuser and /usr/bin/python3")
def test_unprivileged_user_sees_workers_and_is_told_what_is_missing(watched_job, world_readable_loadertop):
    j = watched_job
    truth = j.wait_workers(2)
    env = {"PYTHONPATH": world_readable_loadertop, "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [shutil.which("runuser"), "-u", "nobody", "--", SYSTEM_PYTHON, "-m", "loadertop", "snapshot",
         str(j.pid), "--duration", "2", "--interval", "0.5", "--json", "--no-stacks"],
        capture_output=True, text=True, timeout=60, env=env, cwd="/",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    jsonschema.validate(report, SCHEMA)
    trainer = only_trainer(report)
    assert {w["pid"] for w in trainer["workers"]} == truth == worker_pids(j.pid)
    for w in trainer["workers"]:
        assert w["cpu_percent"] is not None and w["rss_bytes"] > 0  # /proc stat stays readable
        assert w["uss_bytes"] is None and w["pss_bytes"] is None  # smaps does not
    notices = {n["id"]: n for n in report["notices"]}
    assert "memory_permission" in notices and "root" in notices["memory_permission"]["fix"]
    assert "env_permission" in notices
    assert trainer["env"] == {}
    # Same mount namespace: /dev/shm is still measured, through our own view of that mount.
    assert trainer["shm"] is not None and trainer["shm"]["total_bytes"] > 0
