"""Real jobs of two ranks: torchrun, gloo and a real DistributedDataParallel model (the
gradient all-reduce in backward() keeps the ranks in lockstep), on py-spy and on the hook:
(a) one rank's loader reads a slow shard, (b) one rank's own step is slower, (c) balanced.
Each rank's verdict, each finding, the job's verdict, and the live view through its Pilot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from jobs import PYTHON
from test_diagnosis_live import report

pytestmark = pytest.mark.slow

TORCHRUN = shutil.which("torchrun") or str(Path(PYTHON).parent / "torchrun")
COMMON = ("--dist", "--ddp", "--workers", "1", "--persistent", "--batch-size", "8", "--duration", "300")
JOBS = {
    # A slow shard: rank 1's items take 10 ms to read, rank 0's 0.5 ms.
    "slow-loader": ("--sleep-ms", "0.5", "--slow-rank", "1", "--slow-sleep-ms", "10", "--step-ms", "5"),
    # A slower device: rank 1's step does 25 ms of its own CPU work, rank 0's 1 ms; loaders fast.
    "slow-step": ("--item-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "1", "--slow-rank", "1",
                  "--slow-step-cpu-ms", "25"),
    # Alike ranks: both loaders fast, both steps alike.
    "balanced": ("--sleep-ms", "0.5", "--step-ms", "2", "--step-cpu-ms", "5"),
}


def start(job, kind: str, hook: bool):
    j = job(*COMMON, *JOBS[kind], *(["--watch"] if hook else []), cmd=[TORCHRUN, "--standalone", "--nproc_per_node=2"],
            env={"OMP_NUM_THREADS": "1"})
    j.wait_ready(suffix=".0", timeout=90)
    j.wait_ready(suffix=".1", timeout=90)
    return j


def by_rank(rep: dict) -> dict[int, dict]:
    return {t["rank"]: t for t in rep["trainers"]}


def findings_of(rep: dict, trainer: dict) -> dict[str, dict]:
    return {f["id"]: f for f in rep["findings"] if f["trainer_pid"] == trainer["pid"]}


@pytest.mark.parametrize("hook", [False, True], ids=["py-spy", "hook"])
def test_the_rank_that_waits_for_a_slow_shard_is_told_so_and_the_shard_is_named(job, hook):
    j = start(job, "slow-loader", hook)
    rep = report(j.pid, duration=12)
    ranks = by_rank(rep)
    assert set(ranks) == {0, 1}
    assert ranks[0]["verdict"] == "WAITS FOR RANK 1", (ranks[0]["verdict"], rep["findings"])
    assert ranks[1]["verdict"].startswith("INPUT-BOUND")
    waits = findings_of(rep, ranks[0])
    assert set(waits) >= {"waits_for_rank"} and waits["waits_for_rank"]["change"] is None
    assert waits["waits_for_rank"]["evidence"]["straggler_rank"] == 1
    assert waits["waits_for_rank"]["evidence"]["method"] == ("blocked" if hook else "frames")
    assert "input_bound" not in waits  # rank 0's own loader is not the problem
    slow = findings_of(rep, ranks[1])
    assert slow["input_bound"]["change"]["DataLoader"]["num_workers"] > 1
    (job_,) = rep["jobs"]
    assert job_["verdict"] == "INPUT-BOUND on rank 1 of 2" and job_["pid"] == j.pid
    assert job_["straggler"]["rank"] == 1 and job_["straggler"]["cause"] == "input"
    assert job_["straggler"]["pid"] == ranks[1]["pid"] and job_["ranks"][0]["rank"] == 1
    assert job_["job"].startswith("run:")  # torchrun --standalone names its run


@pytest.mark.parametrize("hook", [False, True], ids=["py-spy", "hook"])
def test_a_slow_step_on_one_rank_is_named_and_no_loader_is_changed(job, hook):
    j = start(job, "slow-step", hook)
    rep = report(j.pid, duration=12)
    ranks = by_rank(rep)
    assert ranks[1]["verdict"] == "SLOWEST RANK", (ranks[1]["verdict"], rep["findings"])
    assert ranks[0]["verdict"] == "WAITS FOR RANK 1"
    assert "rank_straggler" in findings_of(rep, ranks[1])
    changed = [(f["id"], f["trainer_pid"], f["change"]) for f in rep["findings"] if f["change"]]
    assert not any("DataLoader" in change for _, _, change in changed), changed
    (job_,) = rep["jobs"]
    assert job_["verdict"] == "SLOW STEP on rank 1 of 2" and job_["straggler"]["cause"] == "step"


@pytest.mark.parametrize("hook", [False, True], ids=["py-spy", "hook"])
def test_balanced_ranks_wait_for_no_one(job, hook):
    j = start(job, "balanced", hook)
    rep = report(j.pid, duration=12)
    assert not {"waits_for_rank", "rank_straggler"} & {f["id"] for f in rep["findings"]}, rep["findings"]
    (job_,) = rep["jobs"]
    assert job_["straggler"] is None and job_["ranks_seen"] == 2
    assert all(not t["verdict"].startswith("WAITS") for t in rep["trainers"])


async def test_the_live_view_shows_the_job_with_the_straggler_first(job):
    from test_tui import text_of, wait_until

    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.source import LiveSource
    from loadertop.tui.widgets.panels import OverviewPanel

    j = start(job, "slow-loader", hook=True)
    app = LoadertopApp(LiveSource([j.pid], interval_s=0.5))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: "WAITS FOR RANK 1" in text_of(app, OverviewPanel), timeout=60)
        lines = text_of(app, OverviewPanel).splitlines()
        assert "INPUT-BOUND on rank 1 of 2" in lines[0]
        assert lines[1].startswith("▶1 rank 1") and lines[2].startswith(" 2 rank 0")


def test_tune_on_every_rank_moves_only_the_straggler(job):
    # tune=True on both ranks of the slow-shard job: rank 0 waits for rank 1 and must not
    # explore; rank 1 explores while its own data wait remains, and keeps what measured faster.
    import json

    from jobs import wait_for

    j = job(*COMMON, *JOBS["slow-loader"], "--tune", "--epoch-items", "800",
            cmd=[TORCHRUN, "--standalone", "--nproc_per_node=2"], env={"OMP_NUM_THREADS": "1"})

    def tune(rank: int) -> dict | None:
        try:
            return json.loads(Path(f"{j.truth_path}.{rank}").read_text()).get("tune")
        except (OSError, ValueError):
            return None

    def settled() -> bool:
        slow = tune(1)
        return bool(slow) and any(d["action"] == "keep" for d in slow["decisions"])

    wait_for(settled, 120, what="rank 1 to keep a faster setting")
    waiting, slow = tune(0), tune(1)
    assert waiting is not None and slow is not None
    assert "try" not in [d["action"] for d in waiting["decisions"]], waiting
    assert waiting["setting"]["num_workers"] == 1 and waiting["reason"] == "waits for rank 1", waiting
    assert slow["setting"]["num_workers"] > 1
