"""A real exporter attached to a real job, scraped over HTTP on loopback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

from jobs import REPO, loadertop, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_scrape_shows_the_job_and_its_workers(job):
    j = job("--workers", "2", "--persistent", "--item-ms", "10")
    j.wait_ready()
    workers = j.wait_workers(2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "export", str(j.pid), "--listen", f"127.0.0.1:{port}",
                             "--interval", "0.5", "--no-stacks"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: t if "loadertop_cpu_percent{" in (t := scrape(port)) else None, 30,
                        what="a scrape with worker metrics")
        assert f'loadertop_workers{{hostname="{socket.gethostname()}",rank="",trainer_pid="{j.pid}"}} 2.0' in text
        for w in workers:
            assert f'pid="{w}"' in text
        assert "# HELP loadertop_data_wait_ratio" in text and "# HELP loadertop_uss_bytes" in text
        assert 'role="worker"' in text and 'role="main"' in text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()


def test_default_listen_address_is_loopback():
    from loadertop.cli import _parser

    args = _parser().parse_args(["export", "1"])
    assert args.listen.startswith("127.0.0.1:")


def test_bad_listen_address_is_one_line():
    r = loadertop("export", "1", "--listen", "nonsense")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "HOST:PORT" in r.stderr
