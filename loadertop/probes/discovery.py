"""Discovery: which processes of a job are its trainers, their DataLoader workers and
pin-memory threads, and how each worker was recognised (its name, the hook, a stack dump).

A process is identified by (pid, start ticks) so that a reused PID is never taken for the
process that had it before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .. import notices as N
from ..model import Notice
from ..vocabulary import FoundBy
from . import procfs

WORKER_COMM = "pt_data_worker"
PIN_THREAD_COMM = "pt_data_pin"
# Children of a trainer that belong to multiprocessing, not to the DataLoader.
HELPER_MARKERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
)

def launches_ranks(st: procfs.Stat, args: list[str]) -> bool:
    """torchrun's agent (or torch.distributed.launch): by its thread name, or by the program
    its command line runs. A shell whose `-c` string holds "torchrun" is no launcher (its
    child, the agent, was counted as a rank), nor is any other program that merely quotes it."""
    if st.comm == "pt_elastic":
        return True
    if not args:
        return False
    program = os.path.basename(args[0])
    if program == "torchrun":
        return True
    if not runs_python(st, args):
        return False
    rest = args[1:]
    for i, a in enumerate(rest[:4]):
        if a == "-m" and i + 1 < len(rest) and rest[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return True
        if not a.startswith("-"):
            return os.path.basename(a) == "torchrun"  # the script python runs
    return False


def runs_loadertop(args: list[str]) -> bool:
    """loadertop itself (the monitor, an exporter, a node agent): never a job to watch. Its demo's
    training job (`-m loadertop.demo` modules) is one."""
    if not args:
        return False
    if os.path.basename(args[0]) == "loadertop":
        return True
    rest = args[1:]
    return any(a == "-m" and i + 1 < len(rest) and rest[i + 1] in ("loadertop", "loadertop.cli")
               for i, a in enumerate(rest[:3])) or (len(rest) >= 1 and os.path.basename(rest[0]) == "loadertop")


def runs_python(st: procfs.Stat, args: list[str]) -> bool:
    """A Python interpreter: by its name, or by the program its command line starts."""
    return st.comm.startswith("python") or (bool(args) and os.path.basename(args[0]).startswith("python"))


def is_fork_server(args: list[str]) -> bool:
    """multiprocessing's fork server: with that start method, workers are its children."""
    return any("multiprocessing.forkserver" in a for a in args)


Key = tuple[int, int]  # (pid, start ticks)


def key_of(st: procfs.Stat) -> Key:
    return (st.pid, st.start_ticks)


@dataclass
class Tree:
    """One walk of a job's process tree."""

    root: procfs.Stat | None
    stats: dict[int, procfs.Stat] = field(default_factory=dict)
    parent: dict[int, int] = field(default_factory=dict)
    workers: dict[int, list[int]] = field(default_factory=dict)  # owner pid -> worker pids
    others: list[int] = field(default_factory=list)  # every process of the tree that is not a worker
    pin_threads: dict[int, list[procfs.Stat]] = field(default_factory=dict)  # trainer -> pin threads
    found_by: dict[int, FoundBy] = field(default_factory=dict)  # worker pid -> FOUND_BY_*
    # Python children of a Python process that nothing names a worker yet: a dump of their
    # stack tells (torchdata's StatefulDataLoader workers keep the trainer's name).
    candidates: list[int] = field(default_factory=list)


# How a worker was recognised, as the report says it.
FOUND_BY_NAME: FoundBy = "name"  # its thread name, pt_data_worker (torch's own worker loop sets it)
FOUND_BY_HOOK: FoundBy = "hook"  # loadertop.watch() in the script published its pid
FOUND_BY_STACK: FoundBy = "stack"  # py-spy showed a DataLoader worker loop in it (torchdata's, say)


class Discovery:
    """Walks job trees through /proc/<pid>/task/*/children; caches command lines by key."""

    def __init__(self) -> None:
        self._cmdlines: dict[Key, list[str] | None] = {}
        self._threads: dict[Key, _Threads] = {}
        self.files = procfs.ProcFiles()  # every process's stat, open between ticks
        # Workers recognised by other means than their name, told by the sampler.
        self.stack_workers: set[Key] = set()  # a dump showed a worker loop
        self.hook_workers: dict[int, set[int]] = {}  # trainer -> worker pids its hooks published

    def cmdline(self, st: procfs.Stat) -> list[str] | None:
        key = key_of(st)
        if key not in self._cmdlines:
            try:
                self._cmdlines[key] = procfs.cmdline(st.pid)
            except PermissionError:
                self._cmdlines[key] = None
        return self._cmdlines[key]

    def forget(self, live: set[Key]) -> None:
        for table in (self._cmdlines, self._threads):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.stack_workers &= live
        self.files.sweep()

    def close(self) -> None:
        self.files.close()

    def is_helper(self, st: procfs.Stat) -> bool:
        args = " ".join(self.cmdline(st) or ())
        return any(m in args for m in HELPER_MARKERS)

    def is_launcher(self, st: procfs.Stat) -> bool:
        return launches_ranks(st, self.cmdline(st) or [])

    def is_python(self, st: procfs.Stat) -> bool:
        if st.comm.startswith("python") or st.comm == WORKER_COMM:
            return True
        return runs_python(st, self.cmdline(st) or [])

    def trainers(self, tree: Tree, confirmed: Iterable[Key]) -> tuple[list[int], Notice | None]:
        """The pids of a job's trainers: processes with DataLoader workers, a launcher's ranks,
        and those confirmed before (`confirmed`: they had workers once) while they live. With
        none yet, the process that will build the loader. And a notice where there is no
        trainer to watch, or no Python one."""
        if tree.root is None:
            return [], None
        found = {pid for pid in tree.workers if not self.is_helper(tree.stats[pid])}
        for key in confirmed:
            st = tree.stats.get(key[0])
            if st is not None and key_of(st) == key and st.state != "Z":
                found.add(key[0])
        found |= {pid for pid in tree.others if self.is_rank(tree, pid) and not self.is_helper(tree.stats[pid])}
        found = {p for p in found if tree.stats[p].state != "Z"}
        if found:
            return sorted(found), None
        root = tree.root
        if self.is_launcher(root):
            return [], Notice(N.NO_TRAINER, f"launcher {root.pid} has not started its ranks yet", None, root.pid)
        if self.is_python(root) or root.state == "Z":
            return ([root.pid] if root.state != "Z" else []), None
        for pid in sorted(tree.others):
            st = tree.stats[pid]
            if pid != root.pid and self.is_python(st) and not self.is_helper(st) and st.state != "Z":
                return [pid], None
        return [root.pid], Notice(
            N.NOT_PYTHON,
            f"process {root.pid} ({root.comm}) is not Python and starts no Python process",
            "give loadertop the PID of the training script (python train.py) or its launcher",
            root.pid,
        )

    def is_rank(self, tree: Tree, pid: int) -> bool:
        parent = tree.parent.get(pid)
        return parent is not None and self.is_launcher(tree.stats[parent])

    def walk(
        self, root_pid: int, root_start: int, known_trainers: Iterable[int] = (), now: float | None = None
    ) -> Tree:
        now = time.monotonic() if now is None else now
        root = procfs.read_stat(root_pid, files=self.files)
        if root is None or root.start_ticks != root_start:
            return Tree(root=None)
        tree = Tree(root=root, others=[root.pid])
        tree.stats[root.pid] = root
        known = set(known_trainers)
        parents = None if procfs.HAVE_CHILDREN_FILE else procfs.all_parents()
        stack = [root]
        while stack:
            node = stack.pop()
            threads = self._threads.get(key_of(node))
            if threads is None or now - threads.scanned_at >= THREAD_RESCAN_S:
                threads = self._scan_threads(node, now, parents)
            kids = (
                procfs.children(node.pid, sorted(threads.child_tids))
                if parents is None
                else [p for p, pp in parents.items() if pp == node.pid]
            )
            worker_kids = []
            # Whose workers node's children would be: forkserver workers hang under the fork
            # server, which hangs under the trainer.
            owner = node.pid
            while kids and owner in tree.parent and self.is_helper(tree.stats[owner]):
                owner = tree.parent[owner]
            for pid in kids:
                st = procfs.read_stat(pid, files=self.files)
                if st is None:
                    continue
                tree.stats[pid] = st
                tree.parent[pid] = node.pid
                how = self._worker_by(st, owner)
                if how is not None:
                    worker_kids.append(pid)  # a worker's own children are not workers
                    tree.found_by[pid] = how
                else:
                    stack.append(st)
                    tree.others.append(pid)
                    if self._may_be_worker(st, node):
                        tree.candidates.append(pid)
            if worker_kids:
                tree.workers.setdefault(owner, []).extend(worker_kids)
        for pid in known | set(tree.workers):
            st = tree.stats.get(pid)
            if st is None:
                continue
            threads = self._threads.get(key_of(st))
            # A new set of workers means a new loader iterator, and maybe a new pin thread.
            n_workers = len(tree.workers.get(pid, ()))
            if threads is None or threads.pin_tids is None or threads.workers_seen != n_workers:
                threads = self._scan_threads(st, now, parents, with_names=True)
                threads.workers_seen = n_workers
            pins = [procfs.read_stat(pid, tid, self.files) for tid in threads.pin_tids or ()]
            tree.pin_threads[pid] = [t for t in pins if t is not None and t.comm == PIN_THREAD_COMM]
        return tree

    def _worker_by(self, st: procfs.Stat, owner: int) -> FoundBy | None:
        """How st, a child of owner's (through a fork server), is known to be a DataLoader
        worker, or None."""
        if st.comm == WORKER_COMM:
            return FOUND_BY_NAME  # the cheap path, and torch's own loader's
        if key_of(st) in self.stack_workers:
            return FOUND_BY_STACK
        published = self.hook_workers.get(owner)
        if published and self.is_python(st):
            try:
                # The script publishes pids as its own pid namespace numbers them.
                if published & set(procfs.read_nspid(st.pid)):
                    return FOUND_BY_HOOK
            except PermissionError:
                pass
        return None

    def _may_be_worker(self, st: procfs.Stat, parent: procfs.Stat) -> bool:
        """A Python child of a Python process, not multiprocessing's helper nor a launcher's
        rank: a worker of a loader that does not name its workers, or something else."""
        return (st.state != "Z" and self.is_python(st) and self.is_python(parent) and not self.is_launcher(parent)
                and not self.is_helper(st))

    def _scan_threads(self, st: procfs.Stat, now: float, parents: dict[int, int] | None,
                      with_names: bool = False) -> _Threads:
        """Which threads fork children (and, for a trainer, which is the pin-memory thread).

        Between scans only those threads' children files are read: a trainer may run 60+
        threads (OpenMP), and reading all of them every tick would cost more than its workers.
        """
        tids = procfs.task_ids(st.pid)
        child_tids = {st.pid}
        if parents is None:
            for tid in tids:
                if procfs.children(st.pid, [tid]):
                    child_tids.add(tid)
        pin_tids = None
        if with_names:
            pin_tids = []
            for tid in tids:
                tst = procfs.read_stat(st.pid, tid)
                if tst is not None and tst.comm == PIN_THREAD_COMM:
                    pin_tids.append(tid)
        threads = _Threads(scanned_at=now, child_tids=child_tids, pin_tids=pin_tids)
        self._threads[key_of(st)] = threads
        return threads


THREAD_RESCAN_S = 5.0


@dataclass
class _Threads:
    scanned_at: float
    child_tids: set[int]  # threads seen forking children; always the main thread
    pin_tids: list[int] | None  # None: not looked for (not a trainer)
    workers_seen: int = -1


def why_not_watchable(pid: int) -> str | None:
    """Why loadertop cannot watch this PID, in one line that says what to give instead; None
    where it can: a process that exists, is visible, and is Python or starts Python."""
    st = procfs.read_stat(pid)
    if st is None and procfs.hidden(pid):
        return (f"PID {pid} exists but /proc hides it from this user (hidepid): run loadertop as root or as the "
                "job's user")
    if st is None:
        return f"no process with PID {pid} (is the job running? `loadertop` lists them)"
    if pid == 1 and not st.comm.startswith("python"):
        # Every orphan on the host is init's child: it would take every DataLoader job.
        return (f"PID 1 is {st.comm}, the init process, parent of every job on this machine: give the training "
                "process's PID (`loadertop` lists them)")
    if not starts_python(st):
        return (f"PID {pid} is {st.comm}, not Python, and starts no Python process: give the PID of the training "
                "script (python train.py) or its launcher (`loadertop` lists them)")
    return None


def starts_python(st: procfs.Stat) -> bool:
    """The process is Python, or a wrapper (a shell, srun, a container's init) with Python
    under it; a process not readable to us counts as Python (the sampler says what it can)."""
    for pid in (st.pid, *procfs.descendants(st.pid)):
        other = procfs.read_stat(pid) if pid != st.pid else st
        if other is None:
            continue
        try:
            args = procfs.cmdline(pid) or []
        except PermissionError:
            return True
        if runs_python(other, args) or other.comm in ("pt_elastic", "pt_data_worker"):
            return True
    return False
