"""A real exporter attached to a real job, scraped over HTTP on loopback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
from support.exporter import free_port, scrape
from support.jobs import REPO, loadertop, wait_for


def test_scrape_shows_the_job_and_its_workers(job):
    # In a Kubernetes pod (as its container's environment says): namespace and pod labels.
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "trainer-0", "POD_NAMESPACE": "research"}
    j = job("--workers", "2", "--persistent", "--item-ms", "10", env=pod)
    j.wait_ready()
    workers = j.wait_workers(2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "export", str(j.pid), "--listen", f"127.0.0.1:{port}",
                             "--interval", "0.5", "--no-stacks"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: t if "loadertop_cpu_percent{" in (t := scrape(port)) else None, 30,
                        what="a scrape with worker metrics")
        host = socket.gethostname()
        labels = (f'local_rank="",namespace="research",node="{host}",pod="trainer-0",rank="",'
                  f'train_job="{host}/{j.pid}",world_size=""')
        assert f"loadertop_workers{{{labels}}} 2.0" in text
        info = [line for line in text.splitlines() if line.startswith("loadertop_trainer_info{")]
        assert len(info) == 1 and f'job_pid="{j.pid}"' in info[0] and f',pid="{j.pid}"' in info[0]
        for w in workers:
            assert f'pid="{w}"' in text
        assert "# HELP loadertop_data_wait_ratio" in text and "# HELP loadertop_uss_bytes" in text
        assert 'role="worker"' in text and 'role="main"' in text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()


def test_default_listen_address_is_loopback():
    from loadertop.cli.arguments import parser as _parser

    args = _parser().parse_args(["export", "1"])
    assert args.listen.startswith("127.0.0.1:")


def test_bad_listen_address_is_one_line():
    r = loadertop("export", "1", "--listen", "nonsense")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "HOST:PORT" in r.stderr


class _Scripted:
    """A sampler that plays prepared snapshots (the exporter's side of the boundary)."""

    def __init__(self, snaps):
        self.snaps = list(snaps)

    def tick(self):
        return self.snaps.pop(0)

    def close(self):
        pass


def test_the_metrics_document_is_the_table_the_exporter_serves():
    """docs/PROMETHEUS.md's table is generated from fields.py, and every family the exporter
    serves (tuned loader, finding, worker whose id is not read yet) is in it."""
    import re
    from dataclasses import replace
    from pathlib import Path

    from support.synth import host, snapshot, trainer
    from support.tune import SETTLED

    from loadertop.fields import metrics_table
    from loadertop.outputs.export import Exporter

    doc = (Path(REPO) / "docs/PROMETHEUS.md").read_text()
    table = doc.split("<!-- metrics table: generated from loadertop/fields.py -->\n")[1]
    table = table.split("<!-- end of the metrics table -->")[0]
    assert table == metrics_table(), "regenerate the table: python3 -c 'from loadertop.fields import metrics_table; print(metrics_table())'"

    tr = trainer(workers=2, worker_cpu=97.0, wait=0.62, usable=8)
    unread = replace(tr.workers[1], worker_id=None)
    tr = replace(tr, workers=(tr.workers[0], unread), loaders=(replace(tr.loaders[0], tune=SETTLED),))
    exporter = Exporter(_Scripted([snapshot(t, [tr], host()) for t in range(30)]))
    for _ in range(30):
        exporter.sample_once()
    served = {f.name for f in exporter.collect()}
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    # prometheus_client adds _total to counters' names itself.
    assert {n if n in documented else n + "_total" for n in served} == documented
    ids = {s.labels["worker_id"] for f in exporter.collect() if f.name == "loadertop_cpu_percent" for s in f.samples}
    assert ids == {"", str(tr.workers[0].worker_id), "?1"}


def test_a_worker_whose_id_is_not_read_yet_has_one_name_everywhere():
    from dataclasses import replace

    from support.synth import host, snapshot, trainer

    from loadertop.outputs.report import build_report
    from loadertop.outputs.report_html import worker_names
    from loadertop.outputs.report_md import processes

    tr = trainer(workers=3)
    tr = replace(tr, workers=tuple(replace(w, worker_id=None) if i == 2 else w for i, w in enumerate(tr.workers)))
    report = build_report([snapshot(0, [tr], host())])
    assert [name for name, _ in processes(report["trainers"][0])][-1] == "w?2"
    assert worker_names([tr])[tr.workers[2].pid] == "w?2"


def test_a_lone_surrogate_from_a_job_never_blanks_the_scrape(tmp_path):
    # A hook's dataset class "\ud800" made every scrape a UnicodeEncodeError, for every job served.
    import os
    import time
    from dataclasses import replace

    from prometheus_client import generate_latest
    from support.synth import host, snapshot, trainer

    from loadertop.hookfile import CONFIG_AT, HEADER, MAGIC, SIZE
    from loadertop.outputs.export import Exporter
    from loadertop.probes.hook_files import read_hook

    blob = b'{"dataset_class": "Evil\\ud800", "num_workers": 2, "name": "x\\udfff"}'
    now = time.time()
    raw = bytearray(SIZE)
    HEADER.pack_into(raw, 0, MAGIC, os.getpid(), now, now, 10, 1, now, now, 0, len(blob), 0.0)
    raw[CONFIG_AT:CONFIG_AT + len(blob)] = blob
    path = tmp_path / "evil.hook"
    path.write_bytes(bytes(raw))
    config = read_hook(str(path))["config"]
    assert config["dataset_class"] == "Evil\ufffd" and config["name"] == "x\ufffd"

    tr = trainer(workers=2, worker_cpu=97.0, wait=0.62, usable=8)
    # Past the reader too (a recording of an older version): the model shows it as an escape.
    from support.tune import SETTLED

    tr = replace(tr, loaders=(replace(tr.loaders[0], dataset_class="Evil\ud800", tune=SETTLED),))
    exporter = Exporter(_Scripted([snapshot(t, [tr], host()) for t in range(3)]))
    for _ in range(3):
        exporter.sample_once()
    text = generate_latest(exporter).decode()
    assert 'loader="Evil\\\\ud800"' in text and "loadertop_finding{" in text


def test_two_tuned_loaders_of_one_dataset_class_are_two_series():
    from dataclasses import replace

    from prometheus_client import generate_latest
    from support.synth import host, snapshot, trainer
    from support.tune import SETTLED

    from loadertop.outputs.export import Exporter

    tr = trainer(workers=2, worker_cpu=97.0, wait=0.62, usable=8)
    one = replace(tr.loaders[0], dataset_class="Shards", tune=SETTLED, name="train")
    tr = replace(tr, loaders=(one, replace(one, name="train-aux")))
    exporter = Exporter(_Scripted([snapshot(t, [tr], host()) for t in range(3)]))
    for _ in range(3):
        exporter.sample_once()
    lines = [line for line in generate_latest(exporter).decode().splitlines()
             if line.startswith("loadertop_tune_num_workers{")]
    assert len(lines) == 2 and {'loader="train"' in line for line in lines} == {True, False}


@pytest.mark.live
def test_the_node_agent_picks_up_a_job_that_starts_after_it_and_drops_one_that_ends(job):
    # `loadertop export --all`: no PIDs. A job started after the agent shows within a few
    # intervals; once it ends, its series are gone (never left as values that look live).
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "loadertop", "export", "--all", "--listen", f"127.0.0.1:{port}",
                              "--interval", "0.5", "--no-stacks"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "loadertop_last_sample_timestamp_seconds" in scrape(port), 30, what="the agent")
        j = job("--workers", "2", "--persistent", "--item-ms", "5")
        j.wait_ready()
        name = f'train_job="{socket.gethostname()}/{j.pid}"'
        text = wait_for(lambda: t if "loadertop_workers{" in (t := scrape(port)) and name in t else None, 30,
                        what="the new job's series")
        workers = [line for line in text.splitlines() if line.startswith("loadertop_workers{") and name in line]
        assert len(workers) == 1 and workers[0].endswith(" 2.0")
        j.kill()
        wait_for(lambda: name not in scrape(port), 30, what="the ended job's series to go")
        assert "loadertop_last_sample_timestamp_seconds" in scrape(port)  # the agent goes on
    finally:
        agent.send_signal(signal.SIGINT)
        assert agent.wait(timeout=15) == 0, agent.stderr.read()


def test_the_agent_or_pids_one_of_them_is_needed():
    r = loadertop("export", "--listen", "127.0.0.1:1")
    assert r.returncode == 2 and "--all" in r.stderr and r.stderr.count("\n") == 1
