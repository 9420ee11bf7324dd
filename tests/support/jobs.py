"""Real training jobs for the tests: started in their own session, polled with deadlines,
and killed (with every process they started) however the test ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from loadertop.probes.procfs import descendants
from loadertop.started import stop_job

__all__ = ["PYTHON", "REPO", "Job", "comm", "descendants", "loadertop", "state", "wait_for", "worker_pids"]

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent.parent


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def comm(pid: int, tid: int | None = None) -> str | None:
    path = f"/proc/{pid}/comm" if tid is None else f"/proc/{pid}/task/{tid}/comm"
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def worker_pids(pid: int) -> set[int]:
    """The DataLoader workers under pid, straight from /proc: the truth to compare with."""
    return {p for p in descendants(pid) if comm(p) == "pt_data_worker"}


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Job:
    """A training job; use as a context manager so it is always cleaned up."""

    def __init__(self, *args: str, cmd: list[str] | None = None, env: dict | None = None, tmp: Path,
                 module: str = "loadertop.demo.job"):
        self.tmp = tmp
        self.ready = tmp / f"ready-{time.monotonic_ns()}"
        self.truth_path = tmp / f"truth-{time.monotonic_ns()}.json"
        run = ["-m", module, "--ready", str(self.ready), "--truth", str(self.truth_path)]
        # cmd: a launcher or wrapper in front (torchrun, unshare ... python): it gets "-m ...".
        self.cmd = (cmd or [PYTHON]) + run + list(args)
        full_env = dict(os.environ)
        # The repository and tests/ (for the jobs in support/), after whatever path is set.
        paths = [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p]
        full_env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in (str(REPO), str(REPO / "tests")) if p not in paths])
        full_env.update(env or {})
        self.log = open(tmp / f"job-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 (closed in kill)
        self.proc = subprocess.Popen(
            self.cmd, env=full_env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.proc.pid

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def kill(self) -> None:
        stop_job(self.proc)  # its group and, for torchrun's setsid ranks, its tree
        self.log.close()

    def wait_ready(self, timeout: float = 60.0, suffix: str = "") -> None:
        path = Path(f"{self.ready}{suffix}")

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited early ({self.proc.returncode}): {self.output()[-2000:]}")
            return path.exists()

        wait_for(ready, timeout, what=f"job {self.pid} to deliver its first batch")

    def wait_workers(self, n: int, timeout: float = 60.0, pid: int | None = None) -> set[int]:
        return wait_for(
            lambda: w if len(w := worker_pids(pid or self.pid)) >= n else None,
            timeout,
            what=f"{n} workers",
        )

    def truth(self) -> dict:
        return json.loads(self.truth_path.read_text())

    def output(self) -> str:
        self.log.flush()
        return (Path(self.log.name)).read_text()


def loadertop(*args: str, timeout: float = 120.0, **kw) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "loadertop", *args]
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(REPO))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def python_sleeper(*args, seconds: int = 60, **popen_kw) -> subprocess.Popen:
    """A Python process that sleeps, with `args` on its command line: a target loadertop
    accepts (it refuses one that is not Python and starts none)."""
    return subprocess.Popen([PYTHON, "-c", f"import time; time.sleep({seconds})", *args], **popen_kw)
