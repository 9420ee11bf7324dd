"""Real jobs of two ranks: torchrun, gloo and a real DistributedDataParallel model (the
gradient all-reduce in backward() keeps the ranks in lockstep), on py-spy and on the hook: one
rank's loader reads a slow shard; each rank's verdict, each finding, the job's verdict; and
tuned on every rank. A slower step on one rank, balanced ranks and the live view of the job
are proven on their recordings (tests/test_scenarios.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ranks import COMMON, JOBS, TORCHRUN
from support.reports import report

pytestmark = pytest.mark.live


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


def test_tune_on_every_rank_moves_only_the_straggler(job):
    # tune=True on both ranks of the slow-shard job: rank 0 waits for rank 1 and must not
    # explore; rank 1 explores while its own data wait remains, and keeps what measured faster.
    import json

    from support.jobs import wait_for

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
