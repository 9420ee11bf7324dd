"""Another user in the tests: user nobody running the system Python on a world-readable copy of loadertop."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.jobs import REPO

SYSTEM_PYTHON = "/usr/bin/python3"


def nobody_can_run_system_python() -> bool:
    if os.geteuid() != 0 or not shutil.which("runuser") or not os.path.exists(SYSTEM_PYTHON):
        return False
    r = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", "pass"], capture_output=True)
    return r.returncode == 0


@pytest.fixture
def world_readable_loadertop():
    """A copy of the package that user nobody can import (the checkout may sit under /root)."""
    folder = tempfile.mkdtemp(prefix="loadertop-nobody-")
    os.chmod(folder, 0o755)
    shutil.copytree(REPO / "loadertop", Path(folder) / "loadertop",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
