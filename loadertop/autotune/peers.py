"""The ranks of one job tuning together (`tune=True` on every rank).

In lockstep each rank's steps/s is the job's: a rank that changes its loader alone measures
nothing while another rank holds the job back, and balanced ranks that each try a change in
turn revert each other's gains. So at each epoch boundary a rank reads its peers' latest data
wait from a board the job already has, and takes a role (docs/RULES.md, "tune on every rank"):

- waiting: a peer's data wait stands RANK_GAP above its own, and its own is at most
  STRAGGLER_SHARE of that (it waits for that rank in the gradient sync): it does not explore;
  its setting stays;
- straggler: its own data wait stands so above every peer's: it explores alone, as long as
  that lasts;
- leader (balanced ranks, the lowest rank): it explores, and a change it decides at epoch e is
  published for epoch e+1 and made then, on every rank at once;
- follower (balanced ranks, the others): it runs the leader's setting, from the epoch the
  leader named.

The board: torch.distributed's store where the job has one (every node; `set`, `check` and
`get` of keys that exist: no collective, nothing that waits for another rank), else files in
a folder of this user's on the node (`/dev/shm/loadertop-tune-UID/`, for local ranks). Any
error turns coordination off with one warning: each rank then tunes alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Literal

from ..files import own_folder
from ..model import Knobs
from ..rules.thresholds import RANK_GAP  # data waits this far apart are not noise: the monitor's

# A straggler's peers wait for data at most this share of what it does. In lockstep the ranks'
# waits split: balanced ranks on one slow-ish worker each read 0.70 and 0.55 for epochs on end
# (the one whose worker is a little behind shows the job's wait, the other part of it as sync
# wait), a gap of 15 points; a rank that waits for a slow shard reads near 0 beside its 0.8.
STRAGGLER_SHARE = 0.5
FRESH_S = 600.0  # a peer's entry older than this is gone (the rank ended, or stopped tuning)
MAX_STORE_RANKS = 64  # past this many ranks the store is not read key by key: the node's files are

Role = Literal["alone", "waiting", "straggler", "leader", "follower"]


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

    def as_json(self) -> str:
        return json.dumps({"rank": self.rank, "epoch": self.epoch, "wait": self.wait,
                           "setting": self.setting.as_dict(), "plan_from": self.plan_from,
                           "plan": self.plan.as_dict() if self.plan else None, "at": self.at})

    @staticmethod
    def from_json(text: str | bytes) -> Entry | None:
        try:
            d = json.loads(text)
            setting = _knobs(d["setting"])
            if setting is None:
                return None
            return Entry(int(d["rank"]), int(d["epoch"]), None if d["wait"] is None else float(d["wait"]), setting,
                         None if d.get("plan_from") is None else int(d["plan_from"]), _knobs(d.get("plan")),
                         float(d.get("at") or 0.0))
        except (ValueError, KeyError, TypeError):
            return None


def _knobs(d) -> Knobs | None:
    if not isinstance(d, dict) or not isinstance(d.get("num_workers"), int):
        return None
    n = d["num_workers"]
    p = d.get("prefetch_factor")
    if not 0 <= n <= 256:
        return None
    return Knobs(n, int(p) if n and isinstance(p, int) else None, main_threads=_threads(d.get("main_threads")),
                 worker_threads=_threads(d.get("worker_threads")))


def _threads(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096 else None


@dataclass(frozen=True)
class Decision:
    role: Role
    peer: int | None = None  # the rank it waits for, or follows
    follow: Knobs | None = None  # a follower's setting for this epoch


def waits_for(mine: float, theirs: float, gap: float = RANK_GAP, share: float = STRAGGLER_SHARE) -> bool:
    """A rank whose data wait is `mine` waits for one whose wait is `theirs` (in the sync):
    theirs stands `gap` above, and mine is at most `share` of it."""
    return theirs - mine >= gap and mine <= share * theirs


def role_of(me: int, wait: float | None, epoch: int, peers: list[Entry], gap: float = RANK_GAP,
            share: float = STRAGGLER_SHARE) -> Decision:
    """This rank's role from its peers' entries (pure); `gap`: the data waits apart that
    make a straggler, `share`: the most of its wait the others may show (the tuner holds a
    role with hysteresis: Roles)."""
    if not peers:
        return Decision("alone")
    waits = [p for p in peers if p.wait is not None]
    if wait is not None and waits:
        slowest = max(waits, key=lambda p: p.wait or 0.0)
        most = slowest.wait or 0.0
        if waits_for(wait, most, gap, share):
            return Decision("waiting", slowest.rank)
        if waits_for(most, wait, gap, share):
            return Decision("straggler")
    leader = min(peers, key=lambda p: p.rank)
    if me < leader.rank:
        return Decision("leader")
    follow = leader.plan if leader.plan is not None and leader.plan_from is not None \
        and epoch >= leader.plan_from else leader.setting
    return Decision("follower", leader.rank, follow)


class Roles:
    """A rank's role with hysteresis: waiting or straggler once the gap (and the share)
    held at two boundaries in a row, and given up once it fell below half the gap. One epoch's
    data wait is noisy; a role that flips would start trials no one judges."""

    def __init__(self) -> None:
        self.role = Decision("alone")
        self.pending: Role | None = None

    def next(self, me: int, wait: float | None, epoch: int, peers: list[Entry]) -> Decision:
        raw = role_of(me, wait, epoch, peers)
        held = self.role.role in ("waiting", "straggler")
        if raw.role in ("waiting", "straggler"):
            if raw.role == self.role.role or raw.role == self.pending:
                self.pending, self.role = None, raw
            else:
                self.pending = raw.role
                self.role = self.role if held else role_of(me, wait, epoch, peers, gap=float("inf"))
            return self.role
        self.pending = None
        if held:
            kept = role_of(me, wait, epoch, peers, gap=RANK_GAP / 2, share=1.0)
            if kept.role == self.role.role:
                self.role = kept
                return kept
        self.role = raw
        return raw


class FileBoard:
    """Entries as files in a folder of this user's on the node: the job's local ranks."""

    def __init__(self, job: str, name: str, root: str = "/dev/shm") -> None:
        folder = os.path.join(root, f"loadertop-tune-{os.geteuid()}")
        if not own_folder(folder, 0o077):
            raise OSError(f"{folder} is not a private folder of this user's")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{job}-{name}")[:120]
        self.folder = folder
        self.prefix = f"{safe}-r"

    def write(self, entry: Entry) -> None:
        path = os.path.join(self.folder, f"{self.prefix}{entry.rank}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(entry.as_json())
        os.replace(tmp, path)

    def read(self) -> list[Entry]:
        out = []
        for name in os.listdir(self.folder):
            if not (name.startswith(self.prefix) and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.folder, name), "rb") as f:
                    entry = Entry.from_json(f.read(4096))
            except OSError:
                continue
            if entry is not None:
                out.append(entry)
        return out

    def close(self, rank: int) -> None:
        try:
            os.unlink(os.path.join(self.folder, f"{self.prefix}{rank}.json"))
        except OSError:
            pass


class StoreBoard:
    """Entries as keys of torch.distributed's store: every node of the job."""

    def __init__(self, store, name: str, world: int) -> None:
        self.store = store
        self.key = f"loadertop/tune/{name}/r"
        self.world = world

    def write(self, entry: Entry) -> None:
        self.store.set(f"{self.key}{entry.rank}", entry.as_json())

    def read(self) -> list[Entry]:
        out = []
        for r in range(self.world):
            key = f"{self.key}{r}"
            if self.store.check([key]):  # only keys that exist: a get never waits
                entry = Entry.from_json(self.store.get(key))
                if entry is not None:
                    out.append(entry)
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
        return StoreBoard(c10d._get_default_store(), name, world)
    job = env.get("TORCHELASTIC_RUN_ID") or ""
    if not job or job == "none":
        job = env.get("SLURM_JOB_ID") or f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return FileBoard(job, name)


class Peers:
    """This rank's view of its peers through the board."""

    def __init__(self, board, rank: int) -> None:
        self.board = board
        self.rank = rank

    def tell(self, entry: Entry) -> None:
        self.board.write(entry)

    def others(self, now: float | None = None) -> list[Entry]:
        now = time.time() if now is None else now
        return [e for e in self.board.read() if e.rank != self.rank and now - e.at <= FRESH_S]

    def close(self) -> None:
        self.board.close(self.rank)
