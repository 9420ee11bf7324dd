"""Size of a recording per hour at 1 Hz: record a 16-worker job for a minute (py-spy on, so
data wait and worker frames are in it) and scale the bytes to an hour.

Run: python bench/record_size.py [--seconds 60] [--workers 16]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--workers", type=int, default=16)
    args = p.parse_args()
    job = subprocess.Popen([sys.executable, "-m", "loadertop.demo.job", "--workers", str(args.workers), "--persistent",
                            "--sleep-ms", "50", "--batch-size", "4", "--step-ms", "20", "--duration",
                            str(args.seconds + 90)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    out = Path(tempfile.mkdtemp()) / "job.ltrec"
    try:
        time.sleep(10)
        subprocess.run([sys.executable, "-m", "loadertop", "record", str(job.pid), "-o", str(out), "--duration",
                        str(args.seconds)], cwd=REPO, check=True, stderr=subprocess.DEVNULL)
        size = out.stat().st_size
        from loadertop.outputs import record  # noqa: E402

        n = len(record.read(str(out)).snapshots)
        per_hour = size / n * 3600
        print(f"| {args.workers} workers, 1 Hz | {n} snapshots | {size / 1024:.0f} KiB | "
              f"{size / n / 1024:.2f} KiB per snapshot | {per_hour / 2**20:.1f} MiB per hour |")
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


if __name__ == "__main__":
    main()
