"""The exit status of dying workers, caught between ticks."""

from __future__ import annotations

import os
import selectors
import threading
from collections.abc import Iterable

from . import procfs
from .discovery import Key


class ExitWatch:
    """Catches the exit status of dying workers between ticks.

    A killed worker is a zombie for only ~0.2 s before torch reaps it, and then the whole
    family is gone: a 1 s tick would rarely see how it died. The watch holds a pidfd per
    watched process (Linux 5.3+): it becomes readable the moment the process exits, and the
    thread then reads the zombie's exit status from /proc, at no cost while nothing dies.
    Where pidfds are unavailable it polls the processes' stat every 40 ms instead.
    """

    def __init__(self, min_interval_s: float = 0.04, per_process_s: float = 0.002) -> None:
        self.min_interval_s = min_interval_s
        self.per_process_s = per_process_s
        self._keys: frozenset[Key] = frozenset()
        self._codes: dict[Key, int | None] = {}
        self._fds: dict[Key, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._pidfds = hasattr(os, "pidfd_open") and self._pidfd_works()
        self._thread = threading.Thread(target=self._run, name="loadertop-exits", daemon=True)
        self._thread.start()

    @staticmethod
    def _pidfd_works() -> bool:
        try:
            os.close(os.pidfd_open(os.getpid()))
            return True
        except OSError:
            return False

    def watch(self, keys: Iterable[Key]) -> None:
        keys = frozenset(keys)
        with self._lock:
            # Keep the codes of processes watched until now: the next tick asks for them.
            old = self._keys
            self._codes = {k: v for k, v in self._codes.items() if k in keys or k in old}
            changed = keys != self._keys
            self._keys = keys
        if changed and self._pidfds:
            # Open the new pidfds here, before the tick returns: a worker killed right after
            # its first sight is then still caught (the thread only waits on them).
            for key in keys:
                if key not in self._fds:
                    self._open(key)
            os.write(self._wake_w, b"x")  # let the thread pick up the new set

    def _open(self, key: Key) -> None:
        try:
            fd = os.pidfd_open(key[0])
        except OSError:
            return  # already gone
        st = procfs.read_stat(key[0])
        if st is None or st.start_ticks != key[1]:
            os.close(fd)  # the pid was reused: not our process
            return
        with self._lock:
            self._fds[key] = fd

    def exit_code(self, key: Key) -> int | None:
        with self._lock:
            return self._codes.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _drop(self, selector: selectors.BaseSelector, registered: set[Key], key: Key) -> None:
        if key in registered:
            selector.unregister(self._fds[key])
            registered.discard(key)
        with self._lock:
            fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def _see(self, key: Key) -> None:
        st = procfs.read_stat(key[0])
        if st is not None and st.start_ticks == key[1] and st.state == "Z":
            with self._lock:
                self._codes[key] = st.exit_code

    def _run(self) -> None:
        if self._pidfds:
            self._run_pidfds()
            return
        while not self._stop.is_set():
            with self._lock:
                keys = self._keys
            for key in keys:
                self._see(key)
            self._stop.wait(max(self.min_interval_s, self.per_process_s * len(keys)))

    def _run_pidfds(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        registered: set[Key] = set()
        while not self._stop.is_set():
            with self._lock:
                keys, fds = self._keys, dict(self._fds)
            for key in [k for k in fds if k not in keys]:
                self._drop(selector, registered, key)
            for key, fd in fds.items():
                if key in keys and key not in registered:
                    selector.register(fd, selectors.EVENT_READ, key)
                    registered.add(key)
            for event, _ in selector.select(timeout=1.0):
                if event.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                self._see(event.data)
                self._drop(selector, registered, event.data)
        selector.close()
