"""What a rank's launcher told it: the job it belongs to, the same on every node of that job.

torchrun sets `TORCHELASTIC_RUN_ID` (`none` unless the launch gave `--rdzv-id`) and
`MASTER_ADDR`/`MASTER_PORT` (the same on every node of one job); Slurm sets `SLURM_JOB_ID`.
These are read only to make the job's name: they are not whitelisted into reports (the
redact module's ENV_WHITELIST is what leaves the process).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os

JOB_KEYS = frozenset({"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT"})
# A process in a Kubernetes pod: every container gets KUBERNETES_SERVICE_HOST, its HOSTNAME is
# the pod's name unless the pod sets another; POD_NAME / POD_NAMESPACE are the downward API's
# usual names where the pod spec passes them.
POD_KEYS = frozenset({"KUBERNETES_SERVICE_HOST", "HOSTNAME", "POD_NAME", "POD_NAMESPACE"})
# The namespace file of the pod's service account, seen through the process's own root.
NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
MAX_NAME = 253  # a Kubernetes object name's limit


def kubernetes_pod(env: dict[str, str], pid: int, proc: str = "/proc") -> tuple[str | None, str | None]:
    """(namespace, pod) of a process that runs in a Kubernetes pod, else (None, None). Either
    may be None where the pod does not tell it (no service account mounted, no downward API)."""
    if "KUBERNETES_SERVICE_HOST" not in env and "POD_NAME" not in env:
        return None, None
    pod = (env.get("POD_NAME") or env.get("HOSTNAME") or "")[:MAX_NAME] or None
    namespace = env.get("POD_NAMESPACE", "")[:MAX_NAME]
    if not namespace:
        try:
            with open(os.path.join(proc, str(pid), "root", NAMESPACE_FILE), "rb") as f:
                namespace = f.read(MAX_NAME + 1).decode("utf-8", "replace").strip()[:MAX_NAME]
        except OSError:
            namespace = ""
    return namespace or None, pod


def _loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def job_id(env: dict[str, str], hostname: str, job_pid: int, uid: int | None = None,
           namespace: str | None = None) -> str:
    """The job's name, stable on every node: the launcher's run id where it set one, else the
    Slurm job, else the rendezvous address, else this host's job pid (a job of one process).
    A loopback rendezvous names a single-node job only with its host (every node of a fleet
    has its own 127.0.0.1:29500); a multi-node job on loopback is a test on one machine.

    A launcher's name is only what the environment says, and anyone can copy another job's
    (TORCHELASTIC_RUN_ID and RANK were enough to join a victim's series and turn its verdict):
    it names a job with its owner, the process's uid (which the kernel vouches for) and, in a
    pod, its namespace: `run:exp7@uid1000`, `run:exp7@research/uid0`. A job pid is this host's
    and needs none."""
    name = _launcher_name(env, hostname)
    if name is None:
        return f"{hostname}/{job_pid}"[:120]
    if uid is None:
        return name[:120]
    owner = f"{namespace}/uid{uid}" if namespace else f"uid{uid}"
    return f"{name[:120]}@{owner[:130]}"


def masked(job: str) -> str:
    """A job's name as users other than its owner may see it: where it comes from another
    user's environment (readable only to that user and root), its kind and a digest of it.
    The digest is the same on every node, so a fleet still joins the job's ranks; its owner
    stays as is. `run:exp7@uid1000` -> `run:#e15c586d090f@uid1000`."""
    name, at, owner = job.partition("@")
    if not at:
        return job  # a job pid's name (`host/pid`) holds nothing of its environment
    kind = name.split(":", 1)[0] if name.startswith(("run:", "slurm:")) else "addr"
    return f"{kind}:#{hashlib.sha256(name.encode()).hexdigest()[:12]}@{owner}"


def _launcher_name(env: dict[str, str], hostname: str) -> str | None:
    run = env.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return f"run:{run}"
    slurm = env.get("SLURM_JOB_ID", "")
    if slurm:
        return f"slurm:{slurm}"
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if addr and port:
        world, local = env.get("WORLD_SIZE", ""), env.get("LOCAL_WORLD_SIZE", "")
        one_node = not world or world == local
        if _loopback(addr) and one_node:
            return f"{hostname}:{port}"
        return f"{addr}:{port}"
    return None
