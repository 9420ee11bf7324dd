"""Files loadertop writes: reports and recordings. They hold command lines, so they are
private to the user (0600); they are UTF-8 whatever the locale; they are never written
through a symbolic link or into a FIFO or device planted at the path; and a report appears
whole or not at all (written beside, then renamed)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile

MODE = 0o600


def check_target(path: str) -> None:
    """OSError if path is a symbolic link, or exists and is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symbolic link, and reports are never written through one", path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "it is not a regular file (a FIFO, a device or a folder)", path)


def write_atomic(path: str, text: str) -> None:
    """Write text to path: a temporary file in the same folder, renamed over it."""
    check_target(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, MODE)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_private(path: str) -> int:
    """A descriptor to write path from the start (a recording streams into it)."""
    check_target(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in after the check
            raise OSError(errno.EINVAL, "it is not a regular file", path)
        os.fchmod(fd, MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
