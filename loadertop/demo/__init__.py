"""`loadertop demo`: start the built-in training job in a scenario and watch it.

The job runs as our child in its own session, with the kernel told to kill it if loadertop
dies (PR_SET_PDEATHSIG); quitting kills its whole process group, workers included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile

from ..started import can_unshare_shm, shm_wrapper, stop_job

__all__ = ["SCENARIOS", "start_job", "stop_job"]

SCENARIOS = {
    "starved": ("one worker for an expensive __getitem__: input-bound",
                ["--workers", "1", "--item-ms", "25", "--batch-size", "8", "--step-ms", "10", "--persistent"]),
    "healthy": ("cheap items, the loop computes: no findings",
                ["--workers", "2", "--batch-size", "8", "--step-ms", "150", "--persistent"]),
    "threads": ("workers run torch thread pools: oversubscribed",
                ["--workers", "2", "--worker-threads", "8", "--matmuls", "6", "--batch-size", "2", "--persistent"]),
    "churn": ("short epochs without persistent_workers: workers re-created",
              ["--workers", "2", "--epoch-items", "32", "--batch-size", "8", "--step-ms", "20"]),
    "shm": ("large batches in a 64 MB /dev/shm (Docker's default): shm pressure",
            ["--workers", "2", "--tensor-kb", "1024", "--batch-size", "8", "--step-ms", "300", "--persistent"]),
    # Under torchrun: two ranks of a DDP model in lockstep; rank 1 reads a slow shard.
    "ranks": ("two DDP ranks under torchrun, rank 1 reading a slow shard: rank 0 waits for it",
              ["--dist", "--ddp", "--workers", "1", "--sleep-ms", "0.5", "--slow-rank", "1", "--slow-sleep-ms", "10",
               "--batch-size", "8", "--step-ms", "5", "--persistent"]),
    "memory": ("workers read millions of Python objects: copy-on-read growth",
               ["--workers", "2", "--objects", "3000000", "--objects-per-item", "150", "--item-ms", "10",
                "--batch-size", "4", "--step-ms", "5", "--persistent"]),
}
SHM_SIZE = 64 * 2**20


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _small_shm_wrapper() -> list[str] | None:
    """unshare + a 64 MB tmpfs on /dev/shm, as in a default Docker container (root only)."""
    return shm_wrapper(SHM_SIZE) if can_unshare_shm() else None


# With --tune: epochs of about 4 s at the starting setting, so that the tuner's changes, made
# between epochs, show within a minute.
TUNE_EPOCH_ITEMS = 160


def start_job(scenario: str, duration_s: float = 24 * 3600, argv0: str | None = None,
              tune: bool = False) -> tuple[subprocess.Popen, str | None]:
    """argv0: what the job's command line shows for the interpreter (screenshots show
    `python3`, not the path of the machine they were made on). tune: the job watches its
    loader with tune=True."""
    _, flags = SCENARIOS[scenario]
    if tune:
        flags = [*flags, "--tune", "--epoch-items", str(TUNE_EPOCH_ITEMS)]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if scenario == "ranks" else []
    cmd = [argv0 or sys.executable, *launcher, "-m", "loadertop.demo.job", *flags, "--duration", str(duration_s)]
    env = None
    if argv0:
        # The interpreter finds its own prefix (and torch) from argv[0] on PATH.
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    note = None
    if scenario == "shm":
        wrapper = _small_shm_wrapper()
        if wrapper:
            cmd = wrapper + cmd
        else:
            note = "not root: the shm scenario runs with this machine's /dev/shm and may not fill it"
    log = tempfile.NamedTemporaryFile(prefix="loadertop-demo-", suffix=".log", delete=False)  # noqa: SIM115
    executable = sys.executable if argv0 and cmd[0] == argv0 else None  # a wrapper runs argv0 through PATH
    proc = subprocess.Popen(cmd, executable=executable, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent, env=env)
    log.close()
    return proc, note
