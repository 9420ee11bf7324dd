"""Real jobs of two ranks: torchrun, gloo and a real DistributedDataParallel model (the
gradient all-reduce in backward() keeps the ranks in lockstep), tuned on every rank where one
rank's loader reads a slow shard. What each rank's verdict and finding is, for a slow shard,
a slower step and balanced ranks, on py-spy and on the hook, and the live view of the job, is
proven on their recordings (tests/test_scenarios.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ranks import COMMON, JOBS, TORCHRUN

pytestmark = pytest.mark.live


def test_tune_on_every_rank_moves_only_the_straggler(job):
    # tune=True on both ranks of the slow-shard job: rank 0 waits for rank 1 and must not
    # explore; rank 1 explores while its own data wait remains, and keeps what measured faster.
    import json

    from support.jobs import wait_for

    j = job(*COMMON, *JOBS["slow-loader"], "--tune", "--epoch-items", "400", module="support.fast_tune_job",
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
