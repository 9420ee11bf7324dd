"""A rank takes nothing on faith from its peers' board (docs/SECURITY.md, the fourth review,
1): the job's TCPStore is unauthenticated and listens on every interface, so any local user
can write an entry under a rank's key. Each entry is admitted only where this rank could have
written it itself, and on one node only when signed with this user's secret."""

from __future__ import annotations

import json
import os
import time

import pytest

from loadertop.autotune import rank_roles, ranks_board
from loadertop.model import Knobs

NOW = 1_700_000_000.0
BOUNDS = ranks_board.Bounds(world=2, most_workers=8, most_threads=2)  # 2 CPUs: the plan's cap is 4 per CPU
HOSTILE = {"rank": -1, "epoch": 3, "wait": 0.9, "at": 1e300,
           "setting": {"num_workers": 16, "prefetch_factor": 1000000, "main_threads": 64, "worker_threads": 64},
           "plan_from": None, "plan": None}


def entry(**change) -> dict:
    d = {"rank": 1, "epoch": 3, "wait": 0.5, "at": NOW,
         "setting": {"num_workers": 2, "prefetch_factor": 2, "main_threads": None, "worker_threads": None},
         "plan_from": None, "plan": None}
    d.update(change)
    return d


def admitted(d: dict, key: int = 1) -> bool:
    e = ranks_board.Entry.from_json(json.dumps(d))
    return e is not None and BOUNDS.admits(key, e, NOW)


def test_an_entry_the_rank_could_have_written_is_admitted():
    assert admitted(entry())
    assert admitted(entry(plan_from=4, plan={"num_workers": 4, "prefetch_factor": 2}))
    assert admitted(entry(wait=None))


@pytest.mark.parametrize("change", [
    {"rank": -1}, {"rank": 2}, {"rank": 0},  # not a rank of this job, or not the key's
    {"at": 1e300}, {"at": NOW + 3600}, {"at": NOW - 3600},  # from the future, or stale
    {"wait": 1.5}, {"wait": -0.1}, {"wait": "0.5"}, {"rank": True}, {"epoch": 1.5},
    {"setting": {"num_workers": 65, "prefetch_factor": 2}},  # past the tuner's bounds
    {"setting": {"num_workers": 2, "prefetch_factor": 1000000}},
    {"setting": {"num_workers": 2, "prefetch_factor": 0}},
    {"setting": {"num_workers": 2, "prefetch_factor": 2, "main_threads": 100000}},
    {"setting": {"num_workers": -1}},
    {"plan_from": 4, "plan": {"num_workers": 200, "prefetch_factor": 2}},
    {"plan_from": None, "plan": {"num_workers": 2, "prefetch_factor": 2}},  # a plan with no epoch
])
def test_an_entry_outside_the_ranks_own_bounds_is_refused(change):
    assert not admitted(entry(**change)), change


def test_non_finite_numbers_are_refused():
    for text in ('{"rank": 1, "epoch": 3, "wait": NaN, "at": 1, "setting": {"num_workers": 1}}',
                 '{"rank": 1, "epoch": 3, "wait": 0.5, "at": Infinity, "setting": {"num_workers": 1}}',
                 "[" * 100_000, '"x"', "null"):
        assert ranks_board.Entry.from_json(text) is None


def test_a_follower_applies_only_what_its_own_plan_could_give():
    assert BOUNDS.allows(Knobs(8, 2, main_threads=2, worker_threads=1))
    for k in (Knobs(16, 2), Knobs(2, 2, main_threads=64), Knobs(2, 2, worker_threads=64), Knobs(2, 1000)):
        assert not BOUNDS.allows(k), k


def test_the_reviews_entry_is_never_followed(tmp_path):
    # The review's entry, under r1 of a 2-rank job: both ranks had logged "follows rank -1".
    board = ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path))
    with open(os.path.join(board.folder, f"{board.prefix}1.json"), "w") as f:
        json.dump(HOSTILE, f)
    me = ranks_board.Peers(board, 0, BOUNDS)
    assert me.others(now=time.time()) == []
    assert rank_roles.role_of(0, 0.5, 3, me.others()).role == "alone"


def test_bounds_follow_this_ranks_cpus_and_what_it_started_with():
    b = ranks_board.Bounds.here(2)
    assert b.most_threads >= 1 and b.most_workers >= 4
    started = ranks_board.Bounds.here(2, Knobs(48, 2, main_threads=96))  # the user's own setting is always admitted
    assert started.allows(Knobs(48, 2, main_threads=96))


class Store:
    """The three calls of torch.distributed's store the board makes (a real TCPStore: below)."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def set(self, key, value):
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        return all(k in self.kv for k in keys)

    def get(self, key):
        return self.kv[key]


def test_on_one_node_the_store_admits_only_entries_signed_with_the_users_secret(tmp_path):
    secret = ranks_board.user_secret(ranks_board.private_folder(str(tmp_path)))
    assert ranks_board.user_secret(ranks_board.private_folder(str(tmp_path))) == secret  # every local rank reads the same
    assert os.stat(os.path.join(tmp_path, f"loadertop-tune-{os.geteuid()}", "secret")).st_mode & 0o077 == 0
    store = Store()
    mine = ranks_board.StoreBoard(store, "loader", 2, secret)
    honest = ranks_board.Entry(1, 3, 0.5, Knobs(2, 2), at=time.time())
    mine.write(honest)
    assert ranks_board.Peers(mine, 0, BOUNDS).others() == [honest]
    # Another user writes a bounded, fresh entry: unsigned, then signed with a guess.
    forged = ranks_board.Entry(1, 4, 0.9, Knobs(8, 2), at=time.time()).as_json()
    store.set("loadertop/tune/loader/r1", forged)
    assert ranks_board.Peers(mine, 0, BOUNDS).others() == []
    store.set("loadertop/tune/loader/r1", ranks_board.sign(b"x" * 32, forged))
    assert ranks_board.Peers(mine, 0, BOUNDS).others() == []


def test_a_secret_file_of_the_wrong_shape_is_refused(tmp_path):
    folder = ranks_board.private_folder(str(tmp_path))
    with open(os.path.join(folder, "secret"), "wb") as f:
        f.write(b"short")
    with pytest.raises(OSError):
        ranks_board.user_secret(folder)


def test_one_node_is_read_from_the_launchers_variables():
    assert ranks_board.one_node({"LOCAL_WORLD_SIZE": "2"}, 2)
    assert not ranks_board.one_node({"LOCAL_WORLD_SIZE": "1"}, 2)  # two nodes: no secret can be shared
    assert not ranks_board.one_node({}, 2)
    assert ranks_board.one_node({"SLURM_JOB_NUM_NODES": "1"}, 4)


def test_a_real_tcpstore_carries_signed_entries():
    dist = pytest.importorskip("torch.distributed")
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    secret = os.urandom(ranks_board.SECRET_BYTES)
    board = ranks_board.StoreBoard(store, "loader", 2, secret)
    e = ranks_board.Entry(1, 2, 0.25, Knobs(3, 2), plan_from=3, plan=Knobs(4, 2), at=time.time())
    board.write(e)
    assert ranks_board.Peers(board, 0, BOUNDS).others() == [e]
    store.set("loadertop/tune/loader/r1", json.dumps(HOSTILE))
    assert ranks_board.Peers(board, 0, BOUNDS).others() == []


# --- the fourth review's item 11: the board's folder, stale launches, deleted keys ------------


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder owned by another user (needs root)")
def test_a_folder_another_user_made_first_does_not_turn_coordination_off(tmp_path):
    squatted = tmp_path / f"loadertop-tune-{os.geteuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)  # nobody made it first
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path / "home")}
    folder = ranks_board.private_folder(str(tmp_path), env)
    assert folder == str(runtime / "loadertop-tune")
    assert ranks_board.private_folder(str(tmp_path), env) == folder  # every local rank picks the same
    # Without a runtime folder: the home's cache.
    assert ranks_board.private_folder(str(tmp_path), {"HOME": str(tmp_path / "home")}).startswith(str(tmp_path / "home"))


def test_a_killed_launchs_entries_are_not_this_launchs_and_are_removed(tmp_path):
    old = ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path), launch="999999999.1")  # its launcher is gone
    old.write(ranks_board.Entry(1, 3, 0.5, Knobs(2, 2), at=time.time()))
    (stale,) = os.listdir(old.folder)
    new = ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path))
    assert new.launch == ranks_board.launch_of() and new.launch != old.launch
    assert ranks_board.Peers(new, 0, BOUNDS).others() == []  # rank 1 of the killed launch is no peer
    assert stale not in os.listdir(new.folder)  # and its file is gone
    # A launch whose launcher still runs keeps its files.
    alive = ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path), launch=ranks_board.launch_of(os.getpid()))
    alive.write(ranks_board.Entry(1, 3, 0.5, Knobs(2, 2), at=time.time()))
    ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path))
    assert any(name.startswith(alive.prefix) for name in os.listdir(alive.folder))


def test_a_peer_epochs_behind_is_not_waited_for(tmp_path):
    board = ranks_board.FileBoard("job", "loader", 2, root=str(tmp_path))
    board.write(ranks_board.Entry(1, 3, 0.5, Knobs(2, 2), at=time.time()))
    me = ranks_board.Peers(board, 0, BOUNDS)
    assert len(me.others(epoch=5)) == 1
    assert me.others(epoch=6) == []  # 3 epochs behind in lockstep: it ended


def test_peers_whose_entries_vanish_leave_a_rank_in_its_role_not_alone():
    # Anyone who reaches the store can delete a key: that dropped every rank to tuning alone.
    one = Knobs(1, 2)
    roles = rank_roles.Roles()
    assert roles.next(1, 0.5, 3, [ranks_board.Entry(0, 3, 0.45, one)]).role == "follower"
    assert roles.next(1, 0.5, 4, []).role == "follower"
    # A rank that never saw a peer (the only one that tunes) is alone.
    assert rank_roles.Roles().next(1, 0.5, 3, []).role == "alone"
