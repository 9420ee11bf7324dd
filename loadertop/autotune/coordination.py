"""Who tunes and when: the tuner asks its coordination, never whether it has peers.

A lone process (or ranks that cannot coordinate) has `Alone`: it tunes by itself, from its own
data wait, and may change its loader mid-epoch. The ranks of one job with `tune=True` on each
have `Ranks`: at each epoch boundary a role (rank_roles.py) from the peers' entries on the job's
board (ranks_board.py), the job's data wait for a leader, and every change made at a boundary
on every rank at once. A rank's own trial is kept or reverted by its own measurement; the
coordination only says who tries and when (issue 45: a rank never takes a peer's count for a
loader unlike its own).

A coordination that fails (the board cannot be read or written) raises: the tuner then falls
back to `Alone` with one warning, and the loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..model import Knobs
from ..rules.ranks import waits_for
from .rank_roles import RankRole, Roles
from .ranks_board import Bounds, Entry, Peers

log = logging.getLogger("loadertop.tune")


class Alone:
    """A process that tunes by itself."""

    mid_epoch = True  # no peer changes with it: its loader may change where it restores its place

    def epoch_wait(self, wait: float | None, first_epochs_short: bool) -> float | None:
        return wait

    def role(self, name: str, wait: float | None, epoch: int) -> RankRole:
        return RankRole("alone")

    def starts_apart(self, stretch_epoch: int, long_enough: bool) -> bool:
        return False

    def job_wait(self, role: RankRole, own: float, epoch: int, stretch_epoch: int, long_enough: bool) -> float:
        return own

    def allows(self, knobs: Knobs) -> bool:
        return True

    def tell(self, epoch: int, wait: float | None, knobs: Knobs, plan_from: int | None, plan: Knobs | None) -> None:
        return None

    def close(self) -> None:
        return None


class Ranks:
    """A rank among the ranks of its job, through the job's board."""

    mid_epoch = False  # every rank changes at the same boundary

    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self.roles = Roles()

    def epoch_wait(self, wait: float | None, first_epochs_short: bool) -> float | None:
        """The last epoch's data wait as the ranks compare it: none over short first epochs,
        where the ranks started apart (starts_apart)."""
        return None if first_epochs_short else wait

    def role(self, name: str, wait: float | None, epoch: int) -> RankRole:
        """This rank's role at this boundary, from its last epoch's data wait (None: unread)."""
        own = self.roles.own
        role = self.roles.next(self.peers.rank, wait, epoch, self.peers.others(epoch=epoch))
        if self.roles.own and not own:
            log.info("loadertop tune %s: epoch %d: rank %d is the job's straggler: its loader is not like its "
                     "peers', it tunes on its own from now on", name, epoch, self.peers.rank)
        return role

    def starts_apart(self, stretch_epoch: int, long_enough: bool) -> bool:
        """Ranks start apart: over a short first epoch one rank waits in the sync for another's
        start, not for data (a leader read 0.20 there and 0.67 over the next epoch, its peer
        0.71 and 0.69). Measured from the second epoch on; a long one dilutes the start and is
        measured (an epoch of an hour is not waited out)."""
        return stretch_epoch < 2 and not long_enough

    def job_wait(self, role: RankRole, own: float, epoch: int, stretch_epoch: int,
                 long_enough: bool) -> float | None:
        """The data wait a leader plans with: the longest of its balanced ranks' over its
        stretch. In lockstep the rank whose loader is a little behind shows the job's wait for
        data, and the others show part of it as waiting for that rank in the gradient sync:
        one rank's own reading moved 0.54-0.70 run to run of one job, and its plan 2-4 workers
        (BENCHMARKS §10). Balanced peers: as the roles count them. None until every peer's
        wait over the stretch is on the board (a peer in lockstep writes it at the boundary
        beside this one), unless the stretch is long enough already."""
        if role.role != "leader":
            return own
        peers = self.peers.others(epoch=epoch)
        # An entry's wait is the epoch before the one it was written at.
        waits = [p.wait for p in peers if p.wait is not None and p.epoch - 1 >= stretch_epoch]
        if len(waits) < len(peers) and not long_enough:
            return None
        # Balanced peers only: not one this rank waits for by the roles' rule (its role is held
        # back a boundary by their hysteresis), whose loader is not this one's.
        return max([own, *(w for w in waits if not waits_for(own, w))])

    def allows(self, knobs: Knobs) -> bool:
        """A leader's setting this rank's own bounds could give (its CPUs, the tuner's bounds)."""
        return self.peers.bounds.allows(knobs)

    def tell(self, epoch: int, wait: float | None, knobs: Knobs, plan_from: int | None, plan: Knobs | None) -> None:
        self.peers.tell(Entry(self.peers.rank, epoch, wait, knobs, plan_from, plan, time.time(), own=self.roles.own))

    def close(self) -> None:
        self.peers.close()


Coordination = Alone | Ranks


def coordinate(board_for: Callable, name: str, started_with: Knobs | None) -> Coordination:
    """The ranks of this job where a board is found for the loader `name` (a peer's entry is
    taken only within this rank's own bounds), else alone."""
    found = board_for(name)
    if found is None:
        return Alone()
    board, rank = found
    return Ranks(Peers(board, rank, Bounds.here(board.world, started_with)))
