"""The loops people train with: torchdata's StatefulDataLoader, Lightning's fit, an
Accelerate-prepared loader and the Hugging Face Trainer, each run twice: with no code
change, and with the framework's loadertop form (tests/support/framework_job.py), all side by side. Workers are found, data wait matches
the loop's own figure, the starved loop is flagged, and nothing is left when the job ends."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys

import pytest
from support.jobs import REPO, loadertop, wait_for

# Real Lightning, Accelerate and Hugging Face fits.
pytestmark = pytest.mark.live

# Each item sleeps 20 ms (a slow disk), a batch of 4 on one worker takes ~80 ms against a
# 20 ms step: the loop waits ~75%, and the CPUs stay free enough for all the jobs at once.
FLAGS = ("--workers", "1", "--sleep-ms", "20", "--batch-size", "4", "--step-ms", "20", "--duration", "300")
ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
PACKAGES = {"stateful": "torchdata.stateful_dataloader", "lightning": "lightning", "accelerate": "accelerate",
            "huggingface": "transformers"}
# How the single worker is recognised: torchdata's workers do not carry torch's thread name.
FOUND_BY = {"stateful": ({"stack"}, {"hook", "stack"}), "lightning": ({"name"}, {"name"}),
            "accelerate": ({"name"}, {"name"}), "huggingface": ({"name"}, {"name"})}  # (without, with the hook)
# The loop each runs in, as its frames or its loadertop form say, and where its change is written.
LOOP = {"stateful": "torchdata", "lightning": "lightning", "accelerate": "accelerate", "huggingface": "huggingface"}
SECTION = {"stateful": "DataLoader", "lightning": "DataLoader", "accelerate": "DataLoader",
           "huggingface": "TrainingArguments"}


def _truth_over(truth: dict, window_s: float) -> float:
    log = truth["log"]
    end = log[-1]
    start = next(e for e in log if e[0] >= end[0] - window_s)
    return (end[1] - start[1]) / (end[2] - start[2])


@pytest.mark.parametrize("frameworks", [("stateful", "huggingface"), ("lightning", "accelerate")],
                         ids=["stateful+huggingface", "lightning+accelerate"])
def test_each_framework_loop_is_found_measured_and_flagged(job, tmp_path, frameworks):
    # Four jobs at once, in one snapshot: their workers sleep, so they hardly share a CPU
    # (eight at once, with py-spy on each, kept the 2 CPUs busy enough to blur the advice).
    # Found, not imported: the packages load in the jobs, never in the test process.
    missing = [PACKAGES[f] for f in frameworks if importlib.util.find_spec(PACKAGES[f].split(".")[0]) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the test extras)")
    stop = tmp_path / "stop"
    jobs = {(framework, hook): job("--framework", framework, *(["--hook"] if hook else []), *FLAGS,
                                   "--stop", str(stop), module="support.framework_job", env=ENV)
            for framework in frameworks for hook in (False, True)}
    for j in jobs.values():
        j.wait_ready(timeout=120)
    # 12 s at 50 Hz: ~600 samples a trainer, so py-spy's sampling error (1.8 points) stays
    # well inside the ±5 asked, and every worker is told apart by its stack in time.
    r = loadertop("snapshot", *(str(j.pid) for j in jobs.values()), "--duration", "12", "--interval", "0.5",
                  "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    truths = {j.pid: j.truth() for j in jobs.values()}
    by_pid = {t["pid"]: t for t in report["trainers"]}
    flagged = {f["trainer_pid"]: f for f in report["findings"] if f["id"] == "input_bound"}
    for (framework, hook), j in jobs.items():
        what = f"{framework}{' with the hook' if hook else ''}"
        t = by_pid[j.pid]
        assert len(t["workers"]) == 1, (what, t["workers"])
        assert t["workers"][0].get("found_by") in FOUND_BY[framework][hook], (what, t["workers"][0])
        dw = t["data_wait"]
        assert dw["source"] == ("hook" if hook else "py-spy"), (what, dw)
        expected = _truth_over(truths[j.pid], dw["window_s"])
        assert abs(dw["fraction"] - expected) <= 0.05, (what, dw["fraction"], expected)
        assert j.pid in flagged, (what, t["verdict"], [f for f in report["findings"] if f["trainer_pid"] == j.pid])
        assert dw["loop"] == LOOP[framework], (what, dw)
        change = flagged[j.pid]["change"] or {}
        assert set(change) - {"dataset"} == {SECTION[framework]}, (what, flagged[j.pid])
    # The machine-wide count (what CPU sharing between jobs is judged by) has every watched
    # worker, torchdata's unnamed ones too.
    assert report["host"]["dataloader_workers"] >= len(jobs), report["host"]
    # The jobs end as finished ones do: their workers go with them, and so do the hook files.
    stop.touch()
    for (framework, hook), j in jobs.items():
        assert j.proc.wait(timeout=60) == 0, (framework, hook, j.output()[-2000:])
    workers = [w["pid"] for t in report["trainers"] for w in t["workers"]]
    wait_for(lambda: not any(os.path.exists(f"/proc/{w}") for w in workers), 10, what="workers to exit")
    assert [p for j in jobs.values() for p in glob.glob(f"/dev/shm/loadertop-{j.pid}-*")] == []


def test_a_rank_waiting_for_accelerates_dispatch_is_sent_to_rank_0(job):
    # dispatch_batches: rank 0 loads every rank's batch (two a step, 80 ms each on its one
    # worker) and broadcasts it; rank 1 waits in the broadcast. Rank 1's own loader is not
    # what it waits on: its finding sends the change to rank 0, and proposes none of its own.
    # Rank 1 watches its loader (before prepare(), which must keep it watched), rank 0 does not:
    # the hook and py-spy each have to see the dispatch.
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("needs accelerate (the test extras)")
    j = job("--framework", "accelerate", "--dispatch", "--hook-rank", "1", *FLAGS, module="support.framework_job", env=ENV,
            cmd=[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"])
    j.wait_ready(timeout=120, suffix=".0")
    j.wait_ready(timeout=60, suffix=".1")
    r = loadertop("snapshot", str(j.pid), "--duration", "10", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    ranks = {t["rank"]: t for t in report["trainers"]}
    assert set(ranks) == {0, 1}, [(t["pid"], t["rank"]) for t in report["trainers"]]
    waiting = ranks[1]
    assert (waiting["data_wait"]["source"], ranks[0]["data_wait"]["source"]) == ("hook", "py-spy")
    assert waiting["data_wait"]["dispatched_fraction"] >= 0.5 * waiting["data_wait_fraction"], waiting["data_wait"]
    assert waiting["plan"]["cause"] == "dispatched", waiting["plan"]
    (finding,) = [f for f in report["findings"] if f["trainer_pid"] == waiting["pid"] and f["id"] == "input_bound"]
    assert "dispatch_batches=False" in finding["suggestion"] and not finding["change"], finding
    loading = [f for f in report["findings"] if f["trainer_pid"] == ranks[0]["pid"] and f["id"] == "input_bound"]
    assert loading and loading[0]["change"]["DataLoader"]["num_workers"] > 1, loading



def test_each_framework_tunes_its_loader_in_place_and_ends_on_the_faster_setting(job, tmp_path):
    # Lightning's callback, Accelerate's prepare() of a watched loader and the Hugging Face
    # Trainer's callback, each with tune=True, from one worker on items that sleep 20 ms: more
    # workers are faster on any machine. Each settles on more workers, measured faster, as
    # the monitor reads the trainer's hook file.
    frameworks = ("lightning", "accelerate", "huggingface")
    missing = [PACKAGES[f] for f in frameworks if importlib.util.find_spec(PACKAGES[f].split(".")[0]) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the test extras)")
    from loadertop.hookfile import hook_path
    from loadertop.probes.hook_files import read_hook

    stop = tmp_path / "stop"
    jobs = {f: job("--framework", f, "--hook", "--tune", "--workers", "1", "--sleep-ms", "20", "--batch-size", "4",
                   "--step-ms", "10", "--epoch-items", "200", "--duration", "300", "--stop", str(stop),
                   module="support.framework_job", env=ENV) for f in frameworks}

    def settled(j):
        try:
            tune = read_hook(hook_path(j.pid, "train"))["config"]["tune"]
        except (TypeError, KeyError):  # not written yet; a torn read is read again by read_hook
            return None
        return tune if tune is not None and tune.state in ("settled", "off") else None

    for j in jobs.values():
        j.wait_ready(timeout=120)
    for framework, j in jobs.items():
        tune = wait_for(lambda j=j: settled(j), timeout=240, what=f"{framework}'s tuner to settle")
        assert tune.state == "settled", (framework, tune)
        assert tune.started_with.num_workers == 1 and tune.setting.num_workers > 1, (framework, tune)
        kept = [d for d in tune.decisions if d.action == "keep"]
        assert kept and kept[0].gain > 0.3, (framework, tune.decisions)
    stop.touch()
    for framework, j in jobs.items():
        assert j.proc.wait(timeout=60) == 0, (framework, j.output()[-2000:])
