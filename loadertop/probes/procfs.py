"""Raw readers of /proc: one small function per file, no policy.

Every reader returns None when the process is gone and raises PermissionError when the
kernel refuses; callers decide what that means. Plain file reads, not psutil: the tick's
cost must stay near the floor of reading stat + status (docs/BENCHMARKS.md §1), and the
headless path (snapshot, record, export) imports nothing outside the standard library, so
that another user can run it under a bare system Python.
"""

from __future__ import annotations

import errno
import os
import resource
from dataclasses import dataclass
from typing import NamedTuple

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROC = "/proc"


def _boot_time() -> float:
    """When the machine booted (epoch seconds); 0.0 where /proc cannot be read (a sandbox that
    hides it): importing this module must not fail, as the in-place tuner imports it inside
    the training job."""
    try:
        with open(f"{PROC}/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0.0


BOOT_TIME = _boot_time()


class Stat(NamedTuple):
    """The fields of /proc/<pid>/stat (or a thread's) that loadertop uses.

    A NamedTuple rather than a frozen dataclass: it is built once per process per tick,
    and construction cost shows at 128 workers."""

    pid: int
    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime
    num_threads: int
    start_ticks: int  # since boot: with pid, identifies a process across PID reuse
    rss_bytes: int
    exit_code: int | None  # only meaningful for a zombie

    @property
    def started_at(self) -> float:
        return BOOT_TIME + self.start_ticks / CLK_TCK


# Shorter than this, a read of /proc is the whole file: a seq_file stops a read only at a
# record's end near a page (4 KiB), and its records (maps lines) are far shorter than 2 KiB.
SMALL_READ = 2048


def _read_bytes(path: str) -> bytes | None:
    # os.open/os.read: half the cost of open().read() on /proc, which dominates a tick.
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as e:
        # A process exiting shows up as ESRCH on some kernels, and as EINVAL opening its
        # mountinfo (a trial of `tune` ended while its /dev/shm was read: a traceback).
        if e.errno in (errno.ESRCH, errno.EINVAL):
            return None
        raise
    try:
        data = os.read(fd, 65536)
        if len(data) < SMALL_READ:
            return data  # a small file (stat, status, schedstat) comes whole in one read
        # A seq_file (maps, /proc/stat on many CPUs) hands over about a page a read, whatever
        # was asked: read to the end.
        chunks = [data]
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except PermissionError:
        raise
    except OSError:
        return None  # the process went away half-way through the read
    finally:
        os.close(fd)


class ProcFiles:
    """The /proc files a tick reads of every process (stat, status), kept open between
    ticks and re-read with pread.

    Opening a /proc file costs about as much as reading it (a path lookup and a new
    seq_file), so keeping them open halves what a tick pays per worker. An open file refers
    to its process, not to its pid: once that process is gone the read fails (ESRCH) and the
    path is read afresh, so a reused pid is read as the new process it is. Files not read
    between two sweeps are closed, and at most `limit` are open at once (beyond it, files
    are read the plain way), so a huge process table never uses up our descriptors.
    """

    BUFFER = 65536

    def __init__(self, limit: int | None = None) -> None:
        if limit is None:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            # A quarter of what we may open: the TUI, py-spy's pipes and the exporter need the rest.
            limit = 4096 if soft == resource.RLIM_INFINITY else min(soft // 4, 4096)
        self.limit = limit
        self._fds: dict[str, int] = {}
        self._used: set[str] = set()

    def read(self, path: str) -> bytes | None:
        """What _read_bytes(path) would return (None when the process is gone)."""
        self._used.add(path)
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= self.limit:
                return _read_bytes(path)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return _read_bytes(path)  # gone or refused: the plain reader says which
            self._fds[path] = fd
        try:
            data = os.pread(fd, self.BUFFER, 0)
        except OSError:
            data = b""
        if 0 < len(data) < self.BUFFER:
            return data
        # Its process is gone (or the file outgrew one read): close, and read by path.
        self._close(path)
        return _read_bytes(path)

    def sweep(self) -> None:
        """Close the files not read since the last sweep (call once a tick)."""
        for path in [p for p in self._fds if p not in self._used]:
            self._close(path)
        self._used = set()

    def open_count(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError):
            pass  # interpreter shutdown


def _read_with(files: ProcFiles | None, path: str) -> bytes | None:
    return files.read(path) if files is not None else _read_bytes(path)


def _read(path: str) -> str | None:
    raw = _read_bytes(path)
    return raw.decode(errors="replace") if raw is not None else None


def parse_stat(raw: bytes) -> Stat:
    # comm may contain spaces and parentheses: it ends at the last ')'.
    lpar = raw.index(b"(")
    rpar = raw.rindex(b")")
    # f[0] is field 3 (state); field n is f[n - 3]. Only a zombie's exit code (field 52) is
    # read past rss (field 24): splitting the fields after it would cost every process, every
    # tick (docs/BENCHMARKS.md §1).
    state = raw[rpar + 2 : rpar + 3].decode()
    f = raw[rpar + 2 :].split(None, 22 if state != "Z" else -1)
    return Stat(
        int(raw[:lpar]),
        raw[lpar + 1 : rpar].decode(errors="replace"),
        state,
        int(f[1]),
        int(f[11]) + int(f[12]),
        int(f[17]),
        int(f[19]),
        int(f[21]) * PAGE_SIZE,
        int(f[49]) if state == "Z" and len(f) > 49 else None,
    )


def read_cpu_ticks_with_children(pid: int) -> int | None:
    """utime + stime + cutime + cstime: the process's CPU and its reaped children's."""
    raw = _read_bytes(f"{PROC}/{pid}/stat")
    if not raw:
        return None
    try:
        f = raw[raw.rindex(b")") + 2 :].split()
        return int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    except (ValueError, IndexError):
        return None


def read_stat(pid: int, tid: int | None = None, files: ProcFiles | None = None) -> Stat | None:
    """None when the process is gone, or hidden from us (/proc mounted with hidepid): either
    way there is nothing of it to watch. `visible()` tells the two apart for a message."""
    path = f"{PROC}/{pid}/stat" if tid is None else f"{PROC}/{pid}/task/{tid}/stat"
    try:
        raw = _read_with(files, path)
    except PermissionError:
        return None
    if not raw:
        return None
    try:
        return parse_stat(raw)
    except (ValueError, IndexError):
        return None  # a half-written read of a vanishing process


def _field(raw: bytes, name: bytes) -> bytes | None:
    i = raw.find(b"\n" + name + b":")
    if i < 0:
        return None
    start = i + len(name) + 2
    end = raw.find(b"\n", start)
    return raw[start : end if end >= 0 else None]


def read_ctx_switches(pid: int, files: ProcFiles | None = None) -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches, from /proc/<pid>/status."""
    raw = _read_with(files, f"{PROC}/{pid}/status")
    if not raw:
        return None
    # The two lines are adjacent at the end of the file: one find, no full parse.
    i = raw.find(b"\nvoluntary_ctxt_switches:")
    if i < 0:
        return None
    parts = raw[i:].split()
    try:
        return int(parts[1]), int(parts[3])
    except (IndexError, ValueError):
        return None


def read_nspid(pid: int) -> tuple[int, ...]:
    """The pid in each nested pid namespace, outermost first (NVML in a container uses the inner)."""
    raw = _read_bytes(f"{PROC}/{pid}/status")
    value = _field(raw, b"NSpid") if raw else None
    try:
        return tuple(int(v) for v in value.split()) if value else (pid,)
    except ValueError:
        return (pid,)


def task_ids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"{PROC}/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


HAVE_CHILDREN_FILE = os.path.exists(f"{PROC}/self/task/{os.getpid()}/children")


def owner_uid(pid: int) -> int | None:
    """The user a process runs as (its /proc entry's owner); None when it is gone."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None


def hidden(pid: int) -> bool:
    """pid exists but /proc will not show it to us (hidepid, or another user's process)."""
    return os.path.exists(f"{PROC}/{pid}") and read_stat(pid) is None


def children(pid: int, tids: list[int] | None = None) -> list[int]:
    """Direct children of pid, from every thread's children file; none where /proc refuses
    them to us."""
    out: list[int] = []
    for tid in tids if tids is not None else task_ids(pid):
        try:
            text = _read(f"{PROC}/{pid}/task/{tid}/children")
        except PermissionError:
            continue
        if text:
            out.extend(int(c) for c in text.split() if c.isdigit())
    return out


def descendants(pid: int) -> list[int]:
    """Every process below pid, through the children files (gone ones are skipped)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        kids = children(stack.pop())
        out.extend(kids)
        stack.extend(kids)
    return out


def all_parents() -> dict[int, int]:
    """pid -> ppid for the whole table: the fallback when the children file is missing."""
    out: dict[int, int] = {}
    for name in os.listdir(PROC):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[st.pid] = st.ppid
    return out


def cmdline(pid: int) -> list[str] | None:
    raw = _read_bytes(f"{PROC}/{pid}/cmdline")
    if raw is None:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


def environ_subset(pid: int, keys: frozenset[str]) -> dict[str, str] | None:
    """Only the whitelisted variables: other values are never decoded or kept."""
    raw = _read_bytes(f"{PROC}/{pid}/environ")
    if raw is None:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name.decode(errors="replace") in keys:
            out[name.decode()] = value.decode(errors="replace")
    return out


@dataclass(frozen=True)
class Memory:
    rss_bytes: int
    pss_bytes: int
    uss_bytes: int


def read_smaps_rollup(pid: int) -> Memory | None:
    text = _read(f"{PROC}/{pid}/smaps_rollup")
    if not text:
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    if "Rss" not in fields or "Pss" not in fields:
        return None  # a read cut short: no figure rather than a made-up one
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    uss += fields.get("Private_Hugetlb", 0)
    return Memory(rss_bytes=fields.get("Rss", 0), pss_bytes=fields.get("Pss", 0), uss_bytes=uss)


# Libraries that run compute thread pools, by a part of their file name, and the pool's name.
POOL_LIBRARIES = (
    ("libgomp", "OpenMP"),
    ("libiomp", "OpenMP"),
    ("libmkl", "MKL"),
    ("openblas", "OpenBLAS"),
    ("opencv", "OpenCV"),
    ("/cv2/", "OpenCV"),
    ("libtbb", "TBB"),
)


def thread_pools(maps: str) -> tuple[str, ...]:
    """The compute pools whose libraries a process maps, from its maps text."""
    found = []
    for part, name in POOL_LIBRARIES:
        if part in maps and name not in found:
            found.append(name)
    return tuple(found)


def read_maps(pid: int) -> str | None:
    return _read(f"{PROC}/{pid}/maps")


def read_io_chars(pid: int) -> int | None:
    """Bytes the process has read so far through any file, socket or pipe (rchar)."""
    raw = _read_bytes(f"{PROC}/{pid}/io")
    value = _field(b"\n" + raw, b"rchar") if raw else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def torch_shm_segments(pid: int, text: str | None = None) -> dict[tuple[str, int], int] | None:
    """(device, inode) -> mapped bytes of the /dev/shm/torch_* segments pid maps (`text`:
    its maps, when already read)."""
    if text is None:
        text = read_maps(pid)
    if text is None:
        return None
    out: dict[tuple[str, int], int] = {}
    for line in text.splitlines():
        if "/torch_" not in line:
            continue
        parts = line.split(None, 5)
        if len(parts) < 6 or "/dev/shm/torch_" not in parts[5]:
            continue
        start, _, end = parts[0].partition("-")
        try:
            key = (parts[3], int(parts[4]))
            out[key] = max(out.get(key, 0), int(end, 16) - int(start, 16))
        except ValueError:
            continue  # a line cut short
    return out


@dataclass(frozen=True)
class ThreadSample:
    tid: int
    comm: str
    cpu_ticks: int
    runqueue_wait_ns: int | None


def read_main_thread_times(pid: int, files: ProcFiles | None = None) -> tuple[int, int] | None:
    """The main thread's time on a CPU and time queued for one, in ns (its schedstat): read
    every tick for a trainer, where the slow cadence's thread readings come too seldom to
    compare ranks. None where unreadable (no schedstat, gone, or not ours)."""
    try:
        raw = _read_with(files, f"{PROC}/{pid}/task/{pid}/schedstat")
    except PermissionError:
        return None
    parts = (raw or b"").split()
    try:
        return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None
    except ValueError:
        return None


def read_threads(pid: int) -> list[ThreadSample] | None:
    tids = task_ids(pid)
    if not tids:
        return None
    out = []
    for tid in tids:
        st = read_stat(pid, tid)
        if st is None:
            continue
        sched = _read(f"{PROC}/{pid}/task/{tid}/schedstat")
        try:
            wait = int(sched.split()[1]) if sched and len(sched.split()) > 1 else None
        except ValueError:
            wait = None
        out.append(ThreadSample(tid=tid, comm=st.comm, cpu_ticks=st.cpu_ticks, runqueue_wait_ns=wait))
    return out


def read_loadavg(files: ProcFiles | None = None) -> tuple[float, float, float] | None:
    text = (_read_with(files, f"{PROC}/loadavg") or b"").decode(errors="replace")
    try:
        a, b, c = (float(x) for x in (text or "").split()[:3])
    except ValueError:
        return None
    return (a, b, c)


def read_meminfo(files: ProcFiles | None = None) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (looked up directly: the file has ~50 lines)."""
    raw = b"\n" + (_read_with(files, f"{PROC}/meminfo") or b"")
    out = {}
    for key in (b"MemTotal", b"MemAvailable"):
        value = _field(raw, key)
        try:
            out[key.decode()] = int((value or b"").split()[0]) * 1024
        except (IndexError, ValueError):
            pass  # unreadable: left out, shown as n/a
    return out


def read_cpu_times(files: ProcFiles | None = None) -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole host from the first line of /proc/stat."""
    raw = _read_with(files, f"{PROC}/stat") or b""
    try:
        values = [int(v) for v in raw.split(b"\n", 1)[0].split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
    except (ValueError, IndexError):
        return None
    total = sum(values[:8])
    return total - idle, total


def read_per_cpu_times() -> dict[int, tuple[int, int]]:
    """CPU number -> (busy, total) jiffies, from the cpuN lines of /proc/stat."""
    raw = _read_bytes(f"{PROC}/stat") or b""
    out = {}
    for line in raw.split(b"\n")[1:]:
        if not line.startswith(b"cpu"):
            break  # the cpuN lines come first, together
        parts = line.split()
        try:
            values = [int(v) for v in parts[1:9]]
            cpu = int(parts[0][3:])
        except (ValueError, IndexError):
            continue
        if len(values) < 4:
            continue  # a line cut short (a racing read, a faulty /proc): no idle figure to read
        total = sum(values)
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        out[cpu] = (total - idle, total)
    return out


def mountinfo_line(pid: int | str, mount_point: str) -> str | None:
    text = _read(f"{PROC}/{pid}/mountinfo")
    if not text:
        return None
    found = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[4] == mount_point:
            found = line  # the last mount on a point is the visible one
    return found


def same_mount_as_ours(pid: int, mount_point: str) -> bool:
    """pid sees the very mount we see at mount_point (same mount ID): then our own path
    reaches its files, even when its /proc/<pid>/root is closed to us."""
    theirs = mountinfo_line(pid, mount_point)
    ours = mountinfo_line("self", mount_point)
    if not theirs or not ours:
        return False
    return theirs.split()[0] == ours.split()[0]
