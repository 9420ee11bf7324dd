"""Shared memory as a trainer sees it: its own /dev/shm, which in a container is not ours."""

from __future__ import annotations

import os

from .. import notices as N
from ..model import Notice, ShmSnapshot
from . import procfs


def _statvfs(path: str) -> tuple[int, int]:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return total, total - st.f_bfree * st.f_frsize


def read_shm(pid: int) -> tuple[ShmSnapshot | None, Notice | None]:
    """Size and use of the /dev/shm the trainer pid sees."""
    path = f"{procfs.PROC}/{pid}/root/dev/shm"
    try:
        total, used = _statvfs(path)
        return ShmSnapshot(path=path, total_bytes=total, used_bytes=used, torch_bytes=None), None
    except PermissionError:
        pass
    except (FileNotFoundError, ProcessLookupError):
        return None, None
    except OSError as e:
        return None, Notice(
            N.SHM_UNREADABLE,
            f"cannot read /dev/shm of trainer {pid}: {e.strerror}",
            None,
            pid,
        )
    # Another user's root is closed to us, but mountinfo is not: when the trainer's
    # /dev/shm is the very mount we see, our own statvfs measures it exactly.
    if procfs.same_mount_as_ours(pid, "/dev/shm"):
        total, used = _statvfs("/dev/shm")
        return ShmSnapshot(path="/dev/shm", total_bytes=total, used_bytes=used, torch_bytes=None), None
    return None, Notice(
        N.SHM_PERMISSION,
        f"cannot read the /dev/shm of trainer {pid} (it runs as another user in another "
        "mount namespace)",
        "run loadertop as the trainer's user or as root",
        pid,
    )
