"""The hook file's format, defined once: `loadertop.watch()` writes it inside the trainer
(loadertop/inside/hook.py), the monitor reads it from outside (loadertop/probes/hook_files.py).

One 4 KiB page in /dev/shm per watched loader, named `loadertop-<pid>-<name>.hook` (with a
random suffix before `.hook` where another user squatted the name): a fixed header of
counters, then the loader's settings as JSON at CONFIG_AT. Standard library only: the
training script imports this module.
"""

from __future__ import annotations

import os
import struct

DIRECTORY = "/dev/shm"
PREFIX = "loadertop-"
SUFFIX = ".hook"
MAGIC = b"LTHOOK1\0"
SIZE = 4096
# magic, pid, started, heartbeat, wait_ns, batches, first_batch_at, last_batch_at, batch_bytes,
# config length, in_next_since (0 when not inside next(): a wait in progress is visible).
HEADER = struct.Struct("<8sqddQQddQId")
COUNTERS = struct.Struct("<dQQdd")  # heartbeat, wait_ns, batches, first_batch_at, last_batch_at
TAIL = struct.Struct("<dQQddQId")  # the counters, batch_bytes, config length, in_next_since: one write
COUNTERS_AT = 24  # after magic, pid, started
BYTES_AT = 64
CONFIG_LEN_AT = 72
IN_NEXT_AT = 76
CONFIG_AT = 128


def hook_path(pid: int, name: str, directory: str = DIRECTORY) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    return os.path.join(directory, f"{PREFIX}{pid}-{safe}{SUFFIX}")


def prefix_of(pid: int) -> str:
    """What every hook file of the process pid starts with."""
    return f"{PREFIX}{pid}-"
