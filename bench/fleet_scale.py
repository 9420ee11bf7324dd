"""The fleet view at scale: `loadertop fleet` against a Prometheus that holds a synthetic fleet of
N nodes x 8 ranks (jobs of 8 nodes each, one straggler a job), its history written straight into
the TSDB with `promtool tsdb create-blocks-from openmetrics`, as agents scraped every 60 s would
have left it.

Measures, in one run, for each history length (the same fleet):
  refresh   fleet.read() of the whole fleet: every job joined across its nodes (wall time,
            median of --repeats), and the bytes Prometheus answered
  job       fleet.read(job=...) of one job with its ranks' 30-minute data wait history (the
            range query the live view makes when a job is selected)
  draw      the Textual view (headless, Pilot) filling its table and the selected job's ranks
            from that report
The goal (issue 33): under 2 s a refresh at 1,000 nodes, and a cost that grows with the jobs
shown, not with the history Prometheus holds.

Run: python bench/fleet_scale.py [--nodes 1000] [--history-min 10,60] [--repeats 5]
Needs Debian's prometheus and promtool (apt-get install prometheus).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.outputs import fleet  # noqa: E402
from loadertop.probes.prometheus import Prometheus  # noqa: E402

RANKS_PER_NODE = 8
NODES_PER_JOB = 8
STEP_S = 60  # one sample a minute a series: what a 60 s scrape interval leaves
FIGURES = ("loadertop_data_wait_ratio", "loadertop_sync_frames_ratio", "loadertop_sync_blocked_ratio",
           "loadertop_wait_for_ranks_ratio", "loadertop_steps_per_second", "loadertop_workers")


def write_openmetrics(path: Path, nodes: int, history_s: int, end: float) -> int:
    """The fleet's series, one family after another, each sample a minute apart up to `end`.
    Returns the number of samples."""
    rng = random.Random(0)
    jobs = max(1, nodes // NODES_PER_JOB)
    world = NODES_PER_JOB * RANKS_PER_NODE
    times = [end - history_s + i * STEP_S for i in range(history_s // STEP_S + 1)]
    ranks = []  # (labels, the rank's figures)
    for j in range(jobs):
        straggler = rng.randrange(world)
        for n in range(NODES_PER_JOB):
            node = f"gpu-{j * NODES_PER_JOB + n:04d}"
            for local in range(RANKS_PER_NODE):
                rank = n * RANKS_PER_NODE + local
                labels = (f'node="{node}",train_job="run:job-{j:03d}",rank="{rank}",local_rank="{local}",'
                          f'world_size="{world}"')
                slow = rank == straggler
                ranks.append((node, labels, {
                    "loadertop_data_wait_ratio": 0.45 if slow else 0.02,
                    "loadertop_sync_frames_ratio": 0.0 if slow else 0.40,
                    "loadertop_sync_blocked_ratio": 0.0 if slow else 0.38,
                    "loadertop_wait_for_ranks_ratio": 0.0 if slow else 0.40,
                    "loadertop_steps_per_second": 2.1,
                    "loadertop_workers": 4.0,
                    "loadertop_cpu_percent": 180.0,
                }))
    count = 0
    with path.open("w") as f:
        for metric in (*FIGURES, "loadertop_cpu_percent"):
            f.write(f"# TYPE {metric} gauge\n")
            for _, labels, figures in ranks:
                extra = ',worker_id="",role="main"' if metric == "loadertop_cpu_percent" else ""
                value = figures[metric]
                for t in times:
                    f.write(f"{metric}{{{labels}{extra}}} {value * (1 + 0.05 * rng.random()):.4f} {t:.0f}\n")
                    count += 1
        f.write("# TYPE loadertop_finding gauge\n")
        for _, labels, figures in ranks:
            if figures["loadertop_data_wait_ratio"] > 0.2:
                for t in times:
                    f.write(f'loadertop_finding{{{labels},id="input_bound",severity="critical"}} 1 {t:.0f}\n')
                    count += 1
        f.write("# TYPE loadertop_host_cpu_percent gauge\n")
        for node in sorted({r[0] for r in ranks}):
            for t in times:
                f.write(f'loadertop_host_cpu_percent{{node="{node}"}} {50 + 40 * rng.random():.1f} {t:.0f}\n')
                count += 1
        f.write("# EOF\n")
    return count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(tsdb: Path, port: int) -> subprocess.Popen:
    config = tsdb.parent / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 60s\nscrape_configs: []\n")
    return subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


class Counting(Prometheus):
    """Prometheus that counts the queries and the bytes of their answers."""

    def __init__(self, url: str) -> None:
        super().__init__(url, timeout_s=60.0)
        self.queries = 0
        self.bytes = 0

    def _get(self, api: str, params: dict[str, str]) -> list:
        result = super()._get(api, params)
        self.queries += 1
        self.bytes += len(json.dumps(result))
        return result


def timed(fn, repeats: int) -> tuple[float, float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times), out


async def draw_time(report: dict, history: dict) -> float:
    """Seconds for the live view to fill its table and the selected job's ranks from a report."""
    from loadertop.tui.fleet_view import FleetApp, FleetRead, HistoryRead

    app = FleetApp(Prometheus("http://127.0.0.1:1"), interval_s=3600)
    app._read = lambda: None  # the bench reads Prometheus itself: the view only draws
    app._read_history = lambda job: None
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.2)
        t0 = time.perf_counter()
        app.post_message(FleetRead(report, None))
        app.post_message(HistoryRead(report["jobs"][0]["job"], history))
        await pilot.pause(0)
        while app.query_one("#jobs").row_count < len(report["jobs"]):
            await pilot.pause(0.005)
        await pilot._wait_for_screen()
        return time.perf_counter() - t0


def one_fleet(nodes: int, history_min: int, repeats: int, work: Path) -> dict:
    end = time.time() - 5
    data = work / f"fleet-{history_min}m.om"
    tsdb = work / f"tsdb-{history_min}m"
    t0 = time.perf_counter()
    samples = write_openmetrics(data, nodes, history_min * 60, end)
    written = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
                   check=True, capture_output=True)
    blocks = time.perf_counter() - t0
    data.unlink()
    port = free_port()
    prom = start_prometheus(tsdb, port)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                if Prometheus(url, 5).query("count(loadertop_workers)"):
                    break
            except Exception:
                pass
            if time.time() > deadline:
                raise SystemExit("prometheus did not load the blocks in 5 minutes")
            time.sleep(1)
        counting = Counting(url)
        fleet.read(counting)  # warm: the first read pulls the blocks' index into memory
        counting.queries = counting.bytes = 0
        refresh, refresh_max, report = timed(lambda: fleet.read(counting), repeats)
        per_read = (counting.queries // repeats, counting.bytes // repeats)
        job = report["jobs"][0]["job"]
        one = Counting(url)
        job_s, job_max, job_report = timed(lambda: fleet.read(one, job=job), repeats)
        ranks = job_report["jobs"][0]["ranks"]
        history = {(r["node"], r["rank"]): r.get("data_wait_history") or [] for r in ranks}
        draw = asyncio.run(draw_time(report, history))
        return {"nodes": nodes, "ranks": sum(len(j["ranks"]) for j in report["jobs"]), "jobs": len(report["jobs"]),
                "history_min": history_min, "samples": samples, "write_s": round(written, 1),
                "blocks_s": round(blocks, 1), "refresh_s": round(refresh, 3), "refresh_max_s": round(refresh_max, 3),
                "refresh_queries": per_read[0], "refresh_bytes": per_read[1],
                "job_s": round(job_s, 3), "job_max_s": round(job_max, 3),
                "job_queries": one.queries // repeats, "job_bytes": one.bytes // repeats,
                "draw_s": round(draw, 3),
                "stragglers_named": sum(1 for j in report["jobs"] if j["straggler"] is not None)}
    finally:
        prom.terminate()
        prom.wait(timeout=60)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--history-min", default="10,60", help="history lengths to compare, minutes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: apt-get install prometheus")
    rows = []
    with tempfile.TemporaryDirectory(prefix="loadertop-fleet-scale-") as tmp:
        for minutes in (int(m) for m in args.history_min.split(",")):
            row = one_fleet(args.nodes, minutes, args.repeats, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(Path(tmp) / f"tsdb-{minutes}m", ignore_errors=True)
    print("| nodes | ranks | jobs | history | samples | refresh (median / worst) | queries, bytes | one job + "
          "history | queries, bytes | draw | stragglers named |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['ranks']} | {r['jobs']} | {r['history_min']} min | {r['samples']:,} | "
              f"{r['refresh_s']:.2f} / {r['refresh_max_s']:.2f} s | {r['refresh_queries']}, "
              f"{r['refresh_bytes'] / 2**20:.1f} MiB | {r['job_s'] * 1000:.0f} / {r['job_max_s'] * 1000:.0f} ms | "
              f"{r['job_queries']}, {r['job_bytes'] / 2**10:.0f} KiB | {r['draw_s']:.2f} s | "
              f"{r['stragglers_named']} of {r['jobs']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
