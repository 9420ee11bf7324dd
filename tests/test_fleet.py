"""`loadertop fleet`: the node agent (`loadertop export --all`) beside a real two-rank torchrun
job whose rank 1 reads a slow shard, Debian's prometheus scraping the agent, and the fleet
report read back from Prometheus's HTTP API: the job, the straggler's rank and node. Also
each way Prometheus cannot be read, in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from support.exporter import free_port, scrape
from support.jobs import REPO, loadertop, wait_for
from support.ranks import COMMON, JOBS, TORCHRUN

PROMETHEUS = shutil.which("prometheus")


def fleet(url: str, *args: str) -> subprocess.CompletedProcess:
    return loadertop("fleet", "--prometheus", url, *args, timeout=60)


@pytest.mark.live
@pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (apt-get install prometheus)")
def test_the_fleet_names_the_rank_and_node_the_job_waits_for(job, tmp_path):
    # One node: where PID and UTS namespaces cannot be made; elsewhere the two-node test below
    # proves all of this and more (one job of two nodes), and this one would only repeat it.
    if _can_unshare_pid():
        pytest.skip("the two-node test proves the fleet here")
    j = job(*COMMON, *JOBS["slow-loader"], cmd=[TORCHRUN, "--standalone", "--nproc_per_node=2"],
            env={"OMP_NUM_THREADS": "1"})
    agent_port, prom_port = free_port(), free_port()
    agent = subprocess.Popen([sys.executable, "-m", "loadertop", "export", "--all", "--listen",
                              f"127.0.0.1:{agent_port}", "--interval", "1"], cwd=REPO, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"scrape_configs:\n  - job_name: loadertop\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{agent_port}']\n")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        j.wait_ready(suffix=".0", timeout=90)
        j.wait_ready(suffix=".1", timeout=90)
        wait_for(lambda: "loadertop_sync_frames_ratio{" in scrape(agent_port), 90, what="the agent's rank figures")

        def named() -> dict | None:
            r = fleet(url, "--json")
            if r.returncode != 0:
                return None
            report = json.loads(r.stdout)
            jobs = [x for x in report["jobs"] if x["straggler"] is not None and len(x["ranks"]) == 2]
            return report if jobs else None

        report = wait_for(named, 90, interval=2, what="the fleet to name the straggler")
        assert report["schema"] == "loadertop.fleet/1"
        (job_,) = [x for x in report["jobs"] if x["straggler"] is not None]
        assert job_["straggler"]["rank"] == 1 and job_["straggler"]["cause"] == "input"
        assert job_["straggler"]["node"] == report["nodes"][0]["node"] and job_["verdict"] == "INPUT-BOUND on rank 1 of 2"
        assert [r["rank"] for r in job_["ranks"]] == [1, 0] and job_["ranks"][1]["verdict"] == "WAITS FOR RANK 1"
        _reads_of_one_job(url, job_, tmp_path)
        # The agent stops: its node goes stale (figures kept, marked with their age), never live.
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=15)

        def stale() -> dict | None:
            r = fleet(url, "--json")
            report = json.loads(r.stdout) if r.returncode == 0 else None
            return report if report and all(n["stale"] for n in report["nodes"]) else None

        gone = wait_for(stale, 60, interval=2, what="the node to show stale")
        (was,) = [x for x in gone["jobs"] if x["job"] == job_["job"]]
        assert all(r["stale"] and r["verdict"] == "STALE" for r in was["ranks"])
        assert was["ranks"][0]["data_wait_fraction"] is not None  # its last figures, kept
        assert "STALE, last reported" in fleet(url).stdout
        # Prometheus stops: one line that says so, exit 2.
        prom.send_signal(signal.SIGTERM)
        prom.wait(timeout=30)
        r = fleet(url)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot reach Prometheus" in r.stderr
    finally:
        for p in (agent, prom):
            if p.poll() is None:
                p.kill()
                p.wait()


def _reads_of_one_job(url: str, job_: dict, tmp_path) -> None:
    """The fleet's reports of a job it named: markdown, and the one job looked at: its ranks
    only, each with its data wait over the last half hour (a range query), as JSON and as a
    page to share; a job it does not know is one line."""
    md = tmp_path / "fleet.md"
    assert fleet(url, "-o", str(md)).returncode == 0
    assert "The job waits for rank 1 on" in md.read_text()
    page = tmp_path / "job.html"
    r = fleet(url, "--job", job_["job"], "--json", "-o", str(page))
    assert r.returncode == 0, r.stderr
    (one,) = json.loads(r.stdout)["jobs"]
    assert one["job"] == job_["job"] and one["straggler"]["rank"] == 1
    for rank in one["ranks"]:
        history = rank["data_wait_history"]
        assert len(history) == 60 and any(v is not None for v in history), rank
    slow = next(r for r in one["ranks"] if r["rank"] == 1)
    assert max(v for v in slow["data_wait_history"] if v is not None) >= 0.2  # it waits for its loader
    text = page.read_text()
    assert "<tr class='straggler'><td>1</td>" in text and "<polyline" in text and "<script" not in text
    r = fleet(url, "--job", "no-such-job", "--json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no ranks of that job" in r.stderr


def test_an_address_that_is_not_prometheus_is_one_line():
    # The agent's own /metrics page, a 404, no server, a malformed address.
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            code = 404 if self.path.startswith("/missing") else 401 if self.path.startswith("/locked") else 200
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"# HELP loadertop_workers a metrics page\n")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for url, said in ((base, "did not answer as Prometheus does"), (base + "/missing", "no Prometheus query API"),
                          (base + "/locked", "refused the query (401)"), ("http://127.0.0.1:1", "cannot reach"),
                          ("prometheus:9090", "give its address")):
            r = fleet(url)
            assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, (url, r.stderr)
            assert "Traceback" not in r.stderr
    finally:
        server.shutdown()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (apt-get install prometheus)")
def test_the_alert_rules_parse_and_the_straggler_alert_fires_on_the_straggler_only():
    rules = REPO / "docs" / "prometheus"
    check = subprocess.run(["promtool", "check", "rules", "alerts.yml"], cwd=rules, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=rules, capture_output=True,
                          text=True)
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_dashboard_has_a_job_variable_and_reads_only_metrics_the_exporter_serves():
    import re

    from loadertop.fields import metrics_table

    board = json.loads((REPO / "docs" / "prometheus" / "grafana-dashboard.json").read_text())
    assert "train_job" in {v["name"] for v in board["templating"]["list"]}
    served = set(re.findall(r"`(loadertop_\w+)`", metrics_table()))
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"loadertop_\w+", e)}
    assert used and used <= served, used - served
    assert any("$train_job" in e and "loadertop_wait_for_ranks_ratio" in e for e in exprs)


def test_the_deployment_files_parse_and_run_the_agent_the_tests_run():
    yaml = pytest.importorskip("yaml")
    deploy = REPO / "deploy"
    agent = ["loadertop", "export", "--all", "--listen", "0.0.0.0:9464"]  # the tested agent, on every interface
    daemonset = yaml.safe_load((deploy / "kubernetes" / "daemonset.yaml").read_text())
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert daemonset["kind"] == "DaemonSet" and spec["hostPID"] is True
    assert container["command"] == agent and container["ports"][0] == {"name": "metrics", "containerPort": 9464}
    assert "SYS_PTRACE" in container["securityContext"]["capabilities"]["add"]
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    monitor = yaml.safe_load((deploy / "kubernetes" / "podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    unit = (deploy / "slurm" / "loadertop-agent.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.split("=", 1)[1].split() == ["/usr/local/bin/" + agent[0], *agent[1:]]
    assert "AmbientCapabilities=CAP_SYS_PTRACE" in unit
    assert " ".join(agent[1:]) in (deploy / "slurm" / "prolog.sh").read_text()
    assert 'ENTRYPOINT ["loadertop", "export", "--all", "--listen", "0.0.0.0:9464"]' in (deploy / "Dockerfile").read_text()
    # The agent's arguments are ones the CLI takes.
    r = loadertop("export", "--help")
    assert r.returncode == 0 and "--all" in r.stdout


def _node(name: str, node_rank: int, master_port: int, agent_port: int) -> subprocess.Popen:
    """One "node" of a two-node job on this machine: a PID and UTS namespace of its own (its
    hostname, only its processes), its node agent, and its half of the torchrun launch."""
    job = " ".join([TORCHRUN, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node_rank}",
                    "--master_addr=127.0.0.1", f"--master_port={master_port}", "-m", "loadertop.demo.job",
                    *COMMON, *JOBS["slow-loader"]])
    agent = f"{sys.executable} -m loadertop export --all --listen 127.0.0.1:{agent_port} --interval 1"
    script = f"hostname {name}; {agent} 2>/dev/null & exec {job}"
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(["unshare", "-p", "-f", "-u", "--mount-proc", "sh", "-c", script], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _can_unshare_pid() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-p", "-f", "-u", "--mount-proc", "true"], capture_output=True).returncode == 0


@pytest.mark.live
@pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (apt-get install prometheus)")
def test_two_nodes_one_job_the_fleet_names_the_node_and_rank_it_waits_for(tmp_path):
    # Two namespaces with their own hostname and processes, one 2-node torchrun job across them
    # (rank 1, on node-b, reads a slow shard), an agent on each, prometheus scraping both.
    if not _can_unshare_pid():
        pytest.skip("needs root and unshare of PID and UTS namespaces")
    from support.jobs import stop_job

    master, a_port, b_port, prom_port = free_port(), free_port(), free_port(), free_port()
    nodes = [_node("node-a", 0, master, a_port), _node("node-b", 1, master, b_port)]
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: loadertop\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{a_port}', '127.0.0.1:{b_port}']\n")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        def named() -> dict | None:
            r = fleet(url, "--json")
            if r.returncode != 0:
                return None
            jobs = [x for x in json.loads(r.stdout)["jobs"] if x["job"] == f"127.0.0.1:{master}@uid{os.geteuid()}"]
            return jobs[0] if jobs and jobs[0]["straggler"] and len(jobs[0]["ranks"]) == 2 else None

        job_ = wait_for(named, 180, interval=2, what="the fleet to join the two nodes' ranks and name the straggler")
        assert job_["nodes"] == ["node-a", "node-b"] and job_["seen"] == "2 ranks"
        assert (job_["straggler"]["rank"], job_["straggler"]["node"]) == (1, "node-b")
        assert job_["verdict"] == "INPUT-BOUND on rank 1 of 2"
        waiting = next(r for r in job_["ranks"] if r["rank"] == 0)
        assert waiting["node"] == "node-a" and waiting["verdict"] == "WAITS FOR RANK 1"
        assert [r["rank"] for r in job_["ranks"]] == [1, 0]
        _reads_of_one_job(url, job_, tmp_path)
        # node-b's agent stops: node-b shows stale, node-a stays live.
        subprocess.run(["pkill", "-f", f"export --all --listen 127.0.0.1:{b_port}"], check=False)

        def b_stale() -> dict | None:
            r = fleet(url, "--json")
            nodes = {n["node"]: n["stale"] for n in json.loads(r.stdout)["nodes"]} if r.returncode == 0 else {}
            return nodes if nodes.get("node-b") and nodes.get("node-a") is False else None

        wait_for(b_stale, 60, interval=2, what="node-b to show stale")
        # Its rank's figures are kept, marked with their age, never live.
        r = fleet(url, "--json")
        (was,) = [x for x in json.loads(r.stdout)["jobs"] if x["job"] == job_["job"]]
        b_rank = next(r for r in was["ranks"] if r["node"] == "node-b")
        assert b_rank["stale"] and b_rank["verdict"] == "STALE" and b_rank["data_wait_fraction"] is not None
        assert "STALE, last reported" in fleet(url).stdout
        prom.send_signal(signal.SIGTERM)
        prom.wait(timeout=30)
        r = fleet(url)
        assert r.returncode == 2 and "cannot reach Prometheus" in r.stderr and r.stderr.count("\n") == 1
    finally:
        if prom.poll() is None:
            prom.kill()
            prom.wait()
        for node in nodes:
            stop_job(node)


async def test_the_fleet_view_lists_the_jobs_and_the_selected_jobs_ranks_and_keeps_them_on_an_error():
    # The live view over a report (the reading itself is the HTTP tests' above): rows worst
    # first, the ranks of the selected job, and an error line that keeps the rows.
    from loadertop.probes.prometheus import Prometheus
    from loadertop.tui.fleet_view import FleetApp, FleetRead

    rank = {"node": "node-b", "data_wait_fraction": 0.8, "wait_for_ranks_fraction": 0.0, "workers": 1,
            "cpu_percent": 12.0, "findings": ["input_bound"], "stale": False}
    report = {"created_at": "2026-12-06T00:00:00+00:00", "nodes": [{"node": "node-a", "age_s": 1.0, "stale": False},
                                                               {"node": "node-b", "age_s": 300.0, "stale": True}],
              "jobs": [{"job": "127.0.0.1:29500", "verdict": "INPUT-BOUND on rank 1 of 2", "nodes": ["node-a", "node-b"],
                        "seen": "2 ranks", "stale_nodes": [],
                        "straggler": {"rank": 1, "node": "node-b", "cause": "input", "cost_fraction": 0.9},
                        "ranks": [{**rank, "rank": 1, "verdict": "INPUT-BOUND 80%"},
                                  {**rank, "rank": 0, "node": "node-a", "data_wait_fraction": 0.02,
                                   "wait_for_ranks_fraction": 0.9, "findings": [], "verdict": "WAITS FOR RANK 1"}]}]}
    app = FleetApp(Prometheus("http://127.0.0.1:1"), interval_s=3600)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.3)  # the first read fails: no server
        assert "cannot reach Prometheus" in str(app.query_one("#status").render())
        app.post_message(FleetRead(report, None))
        await pilot.pause(0.2)
        table = app.query_one("#jobs")
        assert table.row_count == 1 and str(table.get_row_at(0)[4]) == "rank 1 on node-b"
        ranks = str(app.query_one("#ranks").render())
        assert "WAITS FOR RANK 1" in ranks and ranks.index("INPUT-BOUND 80%") < ranks.index("WAITS FOR RANK 1")
        assert "node node-b: STALE, last reported 300 s ago" in str(app.query_one("#status").render())
        # The selected job's history (its range query fails here: no server) then arrives.
        from loadertop.tui.fleet_view import HistoryRead

        app.post_message(HistoryRead("127.0.0.1:29500", {("node-b", 1): [None] * 30 + [0.1] * 10 + [0.9] * 20}))
        await pilot.pause(0.2)
        ranks = str(app.query_one("#ranks").render())
        assert "WAIT, 30 MIN" in ranks and "▁▁▁███████" in ranks.replace(" ", "")
        app.post_message(FleetRead(None, "cannot reach Prometheus at http://x (refused)"))
        await pilot.pause(0.2)
        assert table.row_count == 1 and "n/a: cannot reach" in str(app.query_one("#status").render())


def test_the_fleet_weighs_a_ranks_gap_against_the_noise_its_agent_exported():
    # Two balanced ranks whose blocked shares differ by 18 points, each within an exported
    # standard error of 7: no straggler. The same gap read exactly names rank 1's step.
    from loadertop.rules.across_nodes import judge_job as _job

    def rows(stderr: float | None) -> list[dict]:
        return [{"rank": r, "node": f"node-{r}", "stale": False, "data_wait_fraction": 0.05,
                 "sync_frames_fraction": None, "sync_blocked_fraction": blocked, "sync_frames_stderr": None,
                 "sync_blocked_stderr": stderr, "steps_per_s": 20.0, "world_size": 2, "workers": 2,
                 "cpu_percent": 150.0, "findings": [], "namespace": None, "pod": None}
                for r, blocked in ((0, 0.40), (1, 0.22))]

    assert _job("run:a", rows(0.07))["straggler"] is None
    exact = _job("run:a", rows(None))
    assert exact["straggler"]["rank"] == 1 and exact["straggler"]["cause"] == "step"
