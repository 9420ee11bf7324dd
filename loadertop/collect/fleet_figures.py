"""The fleet's figures, read from Prometheus (`loadertop fleet --prometheus URL`): every rank the
node agents report, joined across nodes by their labels (train_job, node, rank), with each
node's staleness and each rank's figures, findings and verdict as its node exported them.
Judging them (who waits for whom across nodes) is rules/across_nodes.py's; the report and its forms
are outputs/fleet.py's.

The figures are each series' latest value within LOOKBACK (so that a node whose agent stopped
keeps its last figures, marked stale with their age, never shown as live). A rank whose series
its node's agent no longer serves (the job ended: the agent dropped it, and Prometheus marked
its series stale at the next scrape) is `ended`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..probes.prometheus import Prometheus, Sample

SCHEMA = "loadertop.fleet/1"
LOOKBACK = "10m"
# A node is stale once Prometheus no longer has its series (a failed scrape marks them stale),
# or its latest sample is older than this (the agent samples every few seconds, Prometheus
# scrapes every 15-60 s).
STALE_S = 120.0
# A job's ranks, looked at one by one: their data wait over the last half hour.
HISTORY_S = 1800.0
HISTORY_POINTS = 60

FIGURES = {
    "data_wait": "loadertop_data_wait_ratio",
    "sync_frames": "loadertop_sync_frames_ratio",
    "sync_blocked": "loadertop_sync_blocked_ratio",
    "frames_error": "loadertop_sync_frames_stderr_ratio",
    "blocked_error": "loadertop_sync_blocked_stderr_ratio",
    "wait_for_ranks": "loadertop_wait_for_ranks_ratio",
    "steps_per_s": "loadertop_steps_per_second",
    "workers": "loadertop_workers",
}
KEY = ("train_job", "node", "rank")


def _rank(label: str) -> int | None:
    """A rank label as a number ('²' and '٣' are digits to str.isdigit, not ranks)."""
    return int(label) if label.isascii() and label.isdigit() and len(label) <= 9 else None


def _key(s: Sample) -> tuple[str, str, str]:
    return (s.labels.get("train_job", ""), s.labels.get("node", ""), s.labels.get("rank", ""))


def _matcher(job: str | None) -> str:
    """The label matcher of one job's series ('' for the whole fleet)."""
    if job is None:
        return ""
    escaped = job.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{{train_job="{escaped}"}}'




@dataclass
class Joined:
    """The fleet as its agents report it: the nodes seen (with their age and staleness) and
    each job's ranks, one row a rank."""

    now: float
    nodes: list[dict]
    jobs: dict[str, list[dict]]


def join(prom: Prometheus, now: float | None = None, job: str | None = None) -> Joined:
    """Every rank the node agents report, joined across nodes by their labels: one query a
    figure (its cost grows with the jobs shown, not with the fleet's history). `job`: that job
    only, its ranks with their data wait's history."""
    now = time.time() if now is None else now
    only = _matcher(job)
    ranks: dict[tuple[str, str, str], dict] = {}
    sizes: dict[tuple[str, str, str], str] = {}
    pods: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}
    for name, metric in FIGURES.items():
        for s in prom.query(f"last_over_time({metric}{only}[{LOOKBACK}])"):
            if s.labels.get("rank") and _rank(s.labels["rank"]) is None:
                prom.refused += 1  # a rank label no agent writes ('²')
                continue
            row = ranks.setdefault(_key(s), {})
            row[name] = s.value
            sizes.setdefault(_key(s), s.labels.get("world_size", ""))
            pods.setdefault(_key(s), (s.labels.get("namespace") or None, s.labels.get("pod") or None))
    cpu = {_key(s): s.value for s in prom.query(
        f"sum by (train_job, node, rank) (last_over_time(loadertop_cpu_percent{only}[{LOOKBACK}]))")}
    findings: dict[tuple[str, str, str], list[str]] = {}
    for s in prom.query(f"last_over_time(loadertop_finding{only}[{LOOKBACK}]) == 1"):
        found = findings.setdefault(_key(s), [])
        if s.labels.get("id", "") not in found:  # one finding once, whatever its severity's series
            found.append(s.labels.get("id", ""))
    said: dict[tuple[str, str, str], str] = {}
    for s in prom.query(f"last_over_time(loadertop_verdict{only}[{LOOKBACK}]) == 1"):
        said[_key(s)] = s.labels.get("verdict", "")
    serving = {_key(s) for s in prom.query(f"loadertop_trainer_info{only}")}  # the ranks agents serve now
    seen = {s.labels.get("node", ""): s.value for s in prom.query(
        f"max by (node) (timestamp(last_over_time(loadertop_host_cpu_percent[{LOOKBACK}])))")}
    # Live: Prometheus has the node's series now. A failed scrape (the agent stopped, the node
    # went down) marks them stale at once; their last figures stay within the lookback.
    live = {s.labels.get("node", "") for s in prom.query("loadertop_host_cpu_percent")}
    nodes = [{"node": n, "age_s": round(max(0.0, now - at), 1), "stale": n not in live or now - at > STALE_S}
             for n, at in sorted(seen.items())]
    stale = {n["node"] for n in nodes if n["stale"]}
    jobs: dict[str, list[dict]] = {}
    for key, row in ranks.items():
        job, node, rank = key
        jobs.setdefault(job, []).append({
            "rank": _rank(rank), "node": node,
            "data_wait_fraction": _r(row.get("data_wait")), "sync_frames_fraction": _r(row.get("sync_frames")),
            "sync_blocked_fraction": _r(row.get("sync_blocked")), "steps_per_s": _r(row.get("steps_per_s")),
            "sync_frames_stderr": _r(row.get("frames_error")), "sync_blocked_stderr": _r(row.get("blocked_error")),
            "workers": int(row["workers"]) if "workers" in row else None, "cpu_percent": _r(cpu.get(key)),
            "findings": sorted(findings.get(key, [])), "stale": node in stale,
            "ended": node not in stale and key not in serving, "node_verdict": said.get(key),
            "world_size": _rank(sizes.get(key, "")),
            "namespace": pods.get(key, (None, None))[0], "pod": pods.get(key, (None, None))[1],
        })
    if job is not None:
        ranks_history = history(prom, job, now)
        for r in jobs.get(job, []):
            r["data_wait_history"] = ranks_history.get((r["node"], r["rank"]))
    return Joined(now, nodes, jobs)


def history(prom: Prometheus, job: str, now: float | None = None) -> dict[tuple[str, int | None], list[float | None]]:
    """Each rank of the job (by node and rank): its data wait over the last HISTORY_S,
    HISTORY_POINTS points (None: no sample), from one range query of the job's series."""
    now = time.time() if now is None else now
    step = HISTORY_S / HISTORY_POINTS
    start = now - HISTORY_S
    out: dict[tuple[str, int | None], list[float | None]] = {}
    for s in prom.query_range(f"loadertop_data_wait_ratio{_matcher(job)}", start, now, step):
        points: list[float | None] = [None] * HISTORY_POINTS
        for t, v in s.points:
            points[min(HISTORY_POINTS - 1, max(0, int((t - start) / step)))] = round(v, 4)
        out[(s.labels.get("node", ""), _rank(s.labels.get("rank", "")))] = points
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
