"""The board the ranks of one job tune together on (`tune=True` on every rank): what a rank
tells its peers at each epoch boundary (Entry), where (the job's store, else files of this
user's on the node), and what it takes on faith from them (nothing: Bounds). The roles they
take from it: autotune/rank_roles.py.

The board: torch.distributed's store where the job has one (every node; `set`, `check` and
`get` of keys that exist: no collective, nothing that waits for another rank), else files in
a folder of this user's on the node (`/dev/shm/loadertop-tune-UID/`, or its runtime folder
where another user made that name first; for local ranks, one launch's files apart from a
killed launch's). Any
error turns coordination off with one warning: each rank then tunes alone.

The store is unauthenticated and listens on every interface: any local user can write a key.
So a peer's entry is taken only when it is one this rank could have written itself (Bounds:
a rank of this job under its own key, fresh, a wait in [0, 1], a setting within this rank's own
caps), and where every rank runs on this node, only when signed with a secret of this user's
(a 0600 file in the private folder). Across nodes no such secret can be shared without a
collective, which a rank that does not tune would never enter (the job would hang): there the
bounds alone hold.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import math
import os
import stat
import sys
import time
from dataclasses import dataclass
from typing import TypeGuard

from ..files import own_folder
from ..model import Knobs
from ..probes.host import usable_cpus
from ..rules import thresholds as T

FRESH_S = 600.0  # a peer's entry older than this is gone (the rank ended, or stopped tuning)
LAG_EPOCHS = 2  # ...and one this many epochs behind this rank's
CLOCK_SKEW_S = 60.0  # a peer on another node may write a time this far ahead of this node's clock
SECRET_BYTES = 32
MAX_STORE_RANKS = 64  # past this many ranks the store is not read key by key: the node's files are


@dataclass(frozen=True)
class Entry:
    """What one rank's tuner tells its peers at an epoch boundary."""

    rank: int
    epoch: int
    wait: float | None  # its loop's data wait over its latest stretch
    setting: Knobs  # what its loader runs now
    plan_from: int | None = None  # a leader's change: the epoch it starts at...
    plan: Knobs | None = None  # ...and the setting
    at: float = 0.0
    # Its loader is not like its peers' (it was the job's straggler): it tunes on its own, and
    # no rank follows it.
    own: bool = False

    def as_json(self) -> str:
        return json.dumps({"rank": self.rank, "epoch": self.epoch, "wait": self.wait,
                           "setting": self.setting.as_dict(), "plan_from": self.plan_from,
                           "plan": self.plan.as_dict() if self.plan else None, "at": self.at, "own": self.own})

    @staticmethod
    def from_json(text: str | bytes) -> Entry | None:
        """The entry, or None for anything that is not one exactly (types included: a wait of
        "0.5", a rank of true or 1.5, a plan without its epoch)."""
        try:
            d = json.loads(text)
        except (ValueError, TypeError, RecursionError):
            return None
        if not isinstance(d, dict):
            return None
        rank, epoch, wait, at, own = d.get("rank"), d.get("epoch"), d.get("wait"), d.get("at", 0.0), d.get("own", False)
        plan_from, plan = d.get("plan_from"), d.get("plan")
        setting = _knobs(d.get("setting"))
        if not (_int(rank) and _int(epoch)) or setting is None:
            return None
        if not ((wait is None or _real(wait)) and _real(at)) or not isinstance(own, bool):
            return None
        if (plan is None) != (plan_from is None) or not (plan_from is None or _int(plan_from)):
            return None
        knobs = None if plan is None else _knobs(plan)
        if plan is not None and knobs is None:
            return None
        return Entry(rank, epoch, None if wait is None else float(wait), setting, plan_from, knobs, float(at), own)


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _knobs(d) -> Knobs | None:
    if not isinstance(d, dict) or not _int(d.get("num_workers")):
        return None
    n, p = d["num_workers"], d.get("prefetch_factor")
    main, pools = d.get("main_threads"), d.get("worker_threads")
    if not all(v is None or _int(v) for v in (p, main, pools)):
        return None
    return Knobs(n, p if n else None, main_threads=main, worker_threads=pools)


# The most threads an entry may name at all (a setting to apply is capped by this rank's CPUs).
MAX_THREADS = 1024


def _sane(k: Knobs) -> bool:
    """A setting the tuner could give anywhere: workers and prefetch within its bounds."""
    return (0 <= k.num_workers <= T.MAX_WORKERS
            and (k.prefetch_factor is None or 1 <= k.prefetch_factor <= T.MAX_PREFETCH)
            and all(t is None or 1 <= t <= MAX_THREADS for t in (k.main_threads, k.worker_threads)))


@dataclass(frozen=True)
class Bounds:
    """What a peer's entry may hold (`admits`: a rank of this job under its own key, fresh, a
    wait in [0, 1], settings the tuner could give), and what this rank applies of a leader's
    (`allows`: what its own plan could give: workers up to the plan's cap for its CPUs, or as
    many as it started with; threads up to its CPUs; torch's prefetch up to the tuner's most)."""

    world: int
    most_workers: int
    most_threads: int

    @staticmethod
    def here(world: int, started: Knobs | None = None) -> Bounds:
        cpus = usable_cpus() or os.cpu_count() or 1
        workers = min(T.MAX_WORKERS, math.ceil(T.IO_WORKERS_PER_CPU * cpus))
        threads = [cpus, *(t for t in (started.main_threads, started.worker_threads) if t)] if started else [cpus]
        return Bounds(world, max(workers, started.num_workers if started else 0), max(threads))

    def allows(self, k: Knobs) -> bool:
        return (_sane(k) and k.num_workers <= self.most_workers
                and all(t is None or t <= self.most_threads for t in (k.main_threads, k.worker_threads)))

    def admits(self, key: int, e: Entry, now: float) -> bool:
        """True for an entry a rank of this job could have written: under its own rank's key,
        fresh and not from the future, a wait in [0, 1], settings the tuner could give."""
        return (e.rank == key and 0 <= e.rank < self.world and e.epoch >= 0
                and now - FRESH_S <= e.at <= now + CLOCK_SKEW_S
                and (e.wait is None or 0.0 <= e.wait <= 1.0)
                and _sane(e.setting) and (e.plan is None or _sane(e.plan))
                and (e.plan_from is None or e.plan_from >= 0))


def private_folder(root: str = "/dev/shm", env: dict[str, str] | None = None) -> str:
    """This user's folder for the tuner's files on the node (0700, checked: no one else's).

    `/dev/shm/loadertop-tune-UID` where it is this user's, or can be made. Anyone can make that
    name first in /dev/shm (a world-writable folder): then this user's runtime folder
    ($XDG_RUNTIME_DIR, private to it on the node), else its home's cache. Every local rank of
    a job runs as one user with one environment, so each picks the same."""
    env = dict(os.environ) if env is None else env
    candidates = [os.path.join(root, f"loadertop-tune-{os.geteuid()}")]
    if env.get("XDG_RUNTIME_DIR", "").startswith("/"):
        candidates.append(os.path.join(env["XDG_RUNTIME_DIR"], "loadertop-tune"))
    home = env.get("HOME", "")
    if home.startswith("/"):
        candidates.append(os.path.join(home, ".cache", f"loadertop-tune-{os.geteuid()}"))
    for folder in candidates:
        try:
            if folder.startswith(home + "/") and home:
                os.makedirs(os.path.dirname(folder), 0o700, exist_ok=True)  # ~/.cache
            if own_folder(folder, 0o077):
                return folder
        except OSError:
            continue  # its parent is missing or not writable: the next
    raise OSError(f"{candidates[0]} is not a private folder of this user's, nor any of {candidates[1:]}")


def user_secret(folder: str) -> bytes:
    """A secret of this user's on this node (a 0600 file in the private folder, made once):
    every local rank reads the same, and no other user can."""
    path = os.path.join(folder, "secret")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        # Written whole beside it, then linked into place: a rank that loses the race reads
        # the winner's, never a half-written file.
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(SECRET_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        secret = f.read(SECRET_BYTES + 1)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or len(secret) != SECRET_BYTES:
        raise OSError(errno.EPERM, f"{path} is not a secret of this user's (0600, {SECRET_BYTES} bytes)")
    return secret


def sign(secret: bytes, body: str) -> str:
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest() + "\n" + body


def signed_body(secret: bytes, text: str | bytes) -> str | None:
    """The body of a value signed with secret, or None (unsigned, or signed otherwise)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    mac, _, body = text.partition("\n")
    good = hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()
    return body if hmac.compare_digest(mac.encode(), good.encode()) else None


def launch_of(pid: int | None = None) -> str:
    """The launch this process's ranks share on this node: its parent (torchrun's agent,
    Slurm's step daemon, mpirun's daemon, the script that spawned the ranks), by pid and start
    time. A later launch of the same job name has another: a killed launch's files are not its."""
    parent = os.getppid() if pid is None else pid
    try:
        with open(f"/proc/{parent}/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        start = "0"
    return f"{parent}.{start}"


class FileBoard:
    """Entries as files in a folder of this user's on the node: the job's local ranks (no
    other user can write there). A file's name holds the job, the launch (launch_of) and the
    rank: a killed launch's entries are never read as this one's, and are removed once their
    launcher is gone."""

    def __init__(self, job: str, name: str, world: int, root: str = "/dev/shm", launch: str | None = None) -> None:
        self.folder = private_folder(root)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{job}-{name}")[:120]
        self.launch = launch_of() if launch is None else launch
        self.prefix = f"{safe}-{self.launch}-r"
        self.world = world
        self._remove_ended(f"{safe}-")

    def _remove_ended(self, job_prefix: str) -> None:
        """Entries of this job's earlier launches whose launcher has ended."""
        for name in os.listdir(self.folder):
            if not name.startswith(job_prefix):
                continue
            launch = name[len(job_prefix):].split("-r", 1)[0]
            if launch == self.launch or "." not in launch:
                continue
            pid = launch.split(".", 1)[0]
            if pid.isdigit() and launch_of(int(pid)) != launch:
                try:
                    os.unlink(os.path.join(self.folder, name))
                except OSError:
                    pass

    def write(self, entry: Entry) -> None:
        path = os.path.join(self.folder, f"{self.prefix}{entry.rank}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(entry.as_json())
        os.replace(tmp, path)

    def read(self) -> list[tuple[int, Entry]]:
        """(the rank its name says, the entry) of each rank's file."""
        out = []
        for name in os.listdir(self.folder):
            key = name[len(self.prefix):-len(".json")]
            if not (name.startswith(self.prefix) and name.endswith(".json") and key.isdigit()):
                continue
            try:
                with open(os.path.join(self.folder, name), "rb") as f:
                    entry = Entry.from_json(f.read(4096))
            except OSError:
                continue
            if entry is not None:
                out.append((int(key), entry))
        return out

    def close(self, rank: int) -> None:
        try:
            os.unlink(os.path.join(self.folder, f"{self.prefix}{rank}.json"))
        except OSError:
            pass


class StoreBoard:
    """Entries as keys of torch.distributed's store: every node of the job. With a secret
    (every rank on this node), entries are signed, and an unsigned one is no entry."""

    def __init__(self, store, name: str, world: int, secret: bytes | None = None) -> None:
        self.store = store
        self.key = f"loadertop/tune/{name}/r"
        self.world = world
        self.secret = secret

    def write(self, entry: Entry) -> None:
        body = entry.as_json()
        self.store.set(f"{self.key}{entry.rank}", body if self.secret is None else sign(self.secret, body))

    def read(self) -> list[tuple[int, Entry]]:
        out = []
        for r in range(self.world):
            key = f"{self.key}{r}"
            if self.store.check([key]):  # only keys that exist: a get never waits
                value = self.store.get(key)
                body = value if self.secret is None else signed_body(self.secret, value)
                entry = None if body is None else Entry.from_json(body)
                if entry is not None:
                    out.append((r, entry))
        return out

    def close(self, rank: int) -> None:
        pass


def board_for(name: str, env: dict[str, str] | None = None):
    """(the board of this rank's job, its rank), or None outside a job of many ranks. Raises
    where the board cannot be made (the tuner says so once and tunes alone)."""
    env = dict(os.environ) if env is None else env
    rank, world = env.get("RANK"), env.get("WORLD_SIZE")
    if rank is None or world is None or not rank.isdigit() or not world.isdigit() or int(world) < 2:
        return None
    return _board(name, env, int(world)), int(rank)


def _board(name: str, env: dict[str, str], world: int):
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    c10d = sys.modules.get("torch.distributed.distributed_c10d")  # the job's own, loaded with it
    if dist is not None and c10d is not None and dist.is_available() and dist.is_initialized() \
            and world <= MAX_STORE_RANKS:
        secret = user_secret(private_folder()) if one_node(env, world) else None
        return StoreBoard(c10d._get_default_store(), name, world, secret)
    job = env.get("TORCHELASTIC_RUN_ID") or ""
    if not job or job == "none":
        job = env.get("SLURM_JOB_ID") or f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return FileBoard(job, name, world)


def one_node(env: dict[str, str], world: int) -> bool:
    """Every rank of the job runs on this node (torchrun's LOCAL_WORLD_SIZE, Slurm's node count)."""
    local = env.get("LOCAL_WORLD_SIZE") or ""
    return (local.isdigit() and int(local) == world) or env.get("SLURM_JOB_NUM_NODES") == "1"


class Peers:
    """This rank's view of its peers through the board: only entries its bounds admit."""

    def __init__(self, board, rank: int, bounds: Bounds | None = None) -> None:
        self.board = board
        self.rank = rank
        self.bounds = bounds or Bounds.here(board.world)

    def tell(self, entry: Entry) -> None:
        self.board.write(entry)

    def others(self, now: float | None = None, epoch: int | None = None) -> list[Entry]:
        """The peers' entries this rank admits; at `epoch`, none of a rank more than
        LAG_EPOCHS behind it (in lockstep the ranks count epochs alike: one that far behind has
        ended, and is not waited for)."""
        now = time.time() if now is None else now
        return [e for key, e in self.board.read() if e.rank != self.rank and self.bounds.admits(key, e, now)
                and (epoch is None or e.epoch >= epoch - LAG_EPOCHS)]

    def close(self) -> None:
        self.board.close(self.rank)
