"""CPU of the headless exporter (with its py-spy children) attached to an 8-worker job, at
its default interval, scraped every 15 s like a Prometheus server would. With --ranks N: the
node agent (`export --all`, no PIDs) beside a torchrun job of N ranks of --workers workers each.

Run: python bench/export_overhead.py [--seconds 60] [--interval 5] [--ranks 8 --workers 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.started import stop_job  # noqa: E402

TCK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / TCK, (int(v[13]) + int(v[14])) / TCK


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--interval", type=float, default=5)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--ranks", type=int, default=0, help="a torchrun job of this many ranks, and the node agent")
    p.add_argument("--warmup", type=float, default=30.0,
                   help="seconds before measuring: past start-up, each worker's first dump and each trainer's "
                        "first window (with --ranks 8: 120)")
    p.add_argument("--no-stacks", dest="extra", action="store_const", const=["--no-stacks"], default=[])
    args = p.parse_args()
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}"]
                if args.ranks else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([*launcher, "-m", "loadertop.demo.job", "--workers", str(args.workers), "--persistent",
                            "--sleep-ms", "20", "--batch-size", "4", "--step-ms", "20", "--duration",
                            str(args.seconds + args.warmup + 60), *(["--dist"] if args.ranks else [])], cwd=REPO,
                           env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    time.sleep(8 + 3 * args.ranks)
    target = ["--all"] if args.ranks else [str(job.pid)]
    exporter = subprocess.Popen([sys.executable, "-m", "loadertop", "export", *target, "--listen",
                                 f"127.0.0.1:{port}", "--interval", str(args.interval), *args.extra], cwd=REPO,
                                stderr=subprocess.DEVNULL)
    try:
        time.sleep(args.warmup)  # steady state: past start-up and the first dump of each worker
        own0, kids0 = cpu(exporter.pid)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            time.sleep(15)
        own1, kids1 = cpu(exporter.pid)
        wall = time.monotonic() - t0
        who = f"node agent, {args.ranks} ranks x {args.workers} workers" if args.ranks else \
            f"exporter, {args.workers} workers"
        label = f"{who}, every {args.interval:g} s" + (" (no py-spy)" if args.extra else "")
        print(f"| {label} | {100 * (own1 - own0) / wall:.2f}% "
              f"| {100 * (kids1 - kids0) / wall:.2f}% | {100 * (own1 - own0 + kids1 - kids0) / wall:.2f}% |")
    finally:
        exporter.send_signal(signal.SIGINT)
        exporter.wait(timeout=15)
        stop_job(job)  # its group and its tree: torchrun's ranks leave the group


if __name__ == "__main__":
    main()
