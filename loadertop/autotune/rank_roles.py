"""The ranks of one job tuning together (`tune=True` on every rank).

In lockstep each rank's steps/s is the job's: a rank that changes its loader alone measures
nothing while another rank holds the job back, and balanced ranks that each try a change in
turn revert each other's gains. So at each epoch boundary a rank reads its peers' latest data
wait from a board the job already has, and takes a role (docs/RULES.md, "tune on every rank")
by the monitor's own rule of who waits for whom (rules/ranks.py, `input_straggler`):

- waiting: a peer's data wait is critical and stands RANK_GAP above the others' median, and
  its own is at most STRAGGLER_SHARE of that (it waits for that rank in the gradient sync):
  it does not explore; its setting stays;
- straggler: its own data wait stands so above its peers': it explores alone, and from then on
  its loader is not like theirs: it tunes on its own (role alone) and no rank follows it;
- leader (balanced ranks, the lowest rank): it explores, and a change it decides at epoch e is
  published for epoch e+1 and made then, on every rank at once;
- follower (balanced ranks, the others): it runs the leader's setting, from the epoch the
  leader named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..model import Knobs
from ..rules.ranks import STRAGGLER_SHARE, input_straggler  # who waits for whom: the monitor's rule
from ..rules.thresholds import RANK_GAP  # data waits this far apart are not noise: the monitor's
from .ranks_board import Entry

Role = Literal["alone", "waiting", "straggler", "leader", "follower"]


@dataclass(frozen=True)
class RankRole:
    """The part a rank plays among its peers at an epoch boundary (not the tuner's Decision of a
    setting, model.Decision)."""

    role: Role
    peer: int | None = None  # the rank it waits for, or follows
    follow: Knobs | None = None  # a follower's setting for this epoch


def role_of(me: int, wait: float | None, epoch: int, peers: list[Entry], gap: float = RANK_GAP,
            share: float = STRAGGLER_SHARE) -> RankRole:
    """This rank's role from its peers' entries (pure); `gap`: the data waits apart that
    make a straggler, `share`: the most of its wait the others may show (the tuner holds a
    role with hysteresis: Roles)."""
    if not peers:
        return RankRole("alone")
    if wait is not None:
        # Who waits for whom, by the monitor's own rule over the ranks' data waits.
        found = input_straggler({**{p.rank: p.wait for p in peers if p.wait is not None}, me: wait}, gap, share)
        if found is not None and found[0] == me:
            return RankRole("straggler")
        if found is not None and me in found[1]:
            return RankRole("waiting", found[0])
    # Only a rank whose loader is like this one's leads it: a straggler's setting is its own.
    alike = [p for p in peers if not p.own]
    if not alike:
        return RankRole("alone")
    leader = min(alike, key=lambda p: p.rank)
    if me < leader.rank:
        return RankRole("leader")
    follow = leader.plan if leader.plan is not None and leader.plan_from is not None \
        and epoch >= leader.plan_from else leader.setting
    return RankRole("follower", leader.rank, follow)


class Roles:
    """A rank's role with hysteresis: waiting or straggler once the gap (and the share)
    held at two boundaries in a row, and given up once it fell below half the gap. One epoch's
    data wait is noisy; a role that flips would start trials no one judges."""

    def __init__(self) -> None:
        self.role = RankRole("alone")
        self.pending: Role | None = None
        self.seen_peers = False
        # Once this rank was the job's straggler its loader is not like its peers': it tunes on
        # its own from then on. Following the leader undid its faster setting in silence (a slow
        # shard's rank went 1 -> 8 workers, 3.3x the batches, and back to the leader's 1).
        self.own = False

    def next(self, me: int, wait: float | None, epoch: int, peers: list[Entry]) -> RankRole:
        if not peers and self.seen_peers:
            # Peers seen before and none now: their entries were removed (anyone who can reach
            # the store can delete a key), or they ended. Either way this rank keeps its role:
            # going alone would start trials its peers do not make.
            return self.role
        self.seen_peers = self.seen_peers or bool(peers)
        role = self._next(me, wait, epoch, peers)
        self.own = self.own or role.role == "straggler"
        if self.own and role.role in ("leader", "follower"):
            self.role = RankRole("alone")
            return self.role
        return role

    def _next(self, me: int, wait: float | None, epoch: int, peers: list[Entry]) -> RankRole:
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
