"""Files loadertop writes: reports and recordings. They hold command lines, so they are
private to the user (0600); they are UTF-8 whatever the locale; they are never written
through a symbolic link (the file's own, or a folder's that another user planted) or into a
FIFO or device planted at the path; a report appears whole or not at all, and a recording is
a new file of our own from its first byte (both written beside, then renamed over the path:
a file another user created there, and holds open, is never written into)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile

MODE = 0o600


def check_folders(path: str) -> None:
    """OSError if a folder on the way to path is a symbolic link that another user owns (root's
    and our own are ours to follow, as the kernel's protected_symlinks has it): a link planted
    in a shared folder would send a report, written as root, wherever its owner chose."""
    me = os.geteuid()
    current = os.sep
    for part in os.path.dirname(os.path.abspath(path)).split(os.sep):
        if not part:
            continue
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            raise OSError(errno.ELOOP, f"{current} is a symbolic link of user {st.st_uid} (to "
                          f"{os.readlink(current)}): give a path without it", path)
        if stat.S_ISLNK(st.st_mode):
            current = os.path.realpath(current)


def check_target(path: str) -> None:
    """OSError if path is a symbolic link, or exists and is not a regular file, or a folder on
    the way is another user's link."""
    check_folders(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symbolic link, and reports are never written through one", path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "it is not a regular file (a FIFO, a device or a folder)", path)


def write_atomic(path: str, text: str | bytes) -> None:
    """Write text (or bytes) to path: a temporary file in the same folder, renamed over it."""
    check_target(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, MODE)
        data = text if isinstance(text, bytes) else text.encode("utf-8", errors="replace")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
    """A descriptor to write path from the start (a recording streams into it): a new file of
    our own, renamed over the path before the first byte, so that whatever was there (a file
    another user created and holds open) is never written into."""
    check_target(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, MODE)
        check_target(path)  # nothing swapped in since the first check
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd


def own_folder(folder: str, others_mask: int = 0o022) -> bool:
    """Make folder (0700) where it is missing; True when it is a real folder (not a link) of
    this user's with none of `others_mask`'s bits: no one else could plant a file or a link in it."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & others_mask
