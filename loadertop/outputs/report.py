"""The `loadertop.report/2` report: built from a window of snapshots and the diagnoser's
judgement at its end (rules/diagnosis.py): the verdicts, findings and plans it shows are the
ones the live view showed, never judged again here.

/2 made `jobs` objects (each job's ranks, its verdict and the rank it waits for); /1 had the
named PIDs there. Recordings of either stay readable: they hold snapshots and each tick's
judgement (outputs/judgement.py), not reports.

Rates (CPU %, context switches/s, GPU utilization) are averages over the window; sizes
are the latest reading; shm carries its peak. Only this module knows the report's keys.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence

from ..files import write_atomic
from ..model import Finding, GpuSnapshot, Notice, ProcessSample, Snapshot, TrainerSnapshot, TuneState
from ..notices import NoticeBoard
from ..numbers import mean_of
from ..rules import diagnosed
from ..rules.diagnosis import Diagnosis
from ..rules.measure import queued_s_per_s
from ..rules.plan import Plan
from ..rules.ranks import Attribution
from ..rules.verdict import undecided, word_of
from .figures import run_figures

SCHEMA = "loadertop.report/2"


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    try:
        return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return None  # not a date (a damaged recording): no made-up one


def _mean(values: Iterable[float | None]) -> float | None:
    mean = mean_of(values)
    return None if mean is None else round(mean, 3)


def _process(p: ProcessSample, window: Sequence[ProcessSample]) -> dict:
    # Its id where py-spy read it at any time in the window (the last tick may not have read
    # it): the Markdown table named it w?0 where the HTML chart of the same report said w0.
    known = next((w.worker_id for w in reversed(window) if w.worker_id is not None), p.worker_id)
    return {
        "pid": p.pid,
        "worker_id": known,
        "status": p.status,
        "cpu_percent": _mean(w.cpu_percent for w in window),
        "rss_bytes": p.rss_bytes,
        "uss_bytes": p.uss_bytes,
        "pss_bytes": p.pss_bytes,
        "threads": p.threads,
        "busy_threads": p.busy_threads,
        "ctx_switches_voluntary_per_s": _mean(w.ctx_switches_voluntary_per_s for w in window),
        "ctx_switches_involuntary_per_s": _mean(w.ctx_switches_involuntary_per_s for w in window),
        # What the rules read: fresh each tick (rules.measure.queued_s_per_s), over the window.
        "runqueue_wait_s_per_s": _mean(queued_s_per_s(w) for w in window),
        "doing": p.doing,
        "doing_at": iso(p.doing_at),
        "thread_pools": list(p.thread_pools),
        "read_bytes_per_s": _mean(w.read_bytes_per_s for w in window),
        "started_at": iso(p.started_at),
        **({"found_by": p.found_by} if p.found_by is not None else {}),
    }


def _gpu(g: GpuSnapshot, window: Sequence[GpuSnapshot]) -> dict:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "utilization_percent": _mean(x.utilization_percent for x in window),
        "memory_utilization_percent": _mean(x.memory_utilization_percent for x in window),
        "memory_used_bytes": g.memory_used_bytes,
        "memory_total_bytes": g.memory_total_bytes,
        "power_watts": _mean(x.power_watts for x in window),
        "power_limit_watts": g.power_limit_watts,
        "sm_clock_mhz": g.sm_clock_mhz,
        "pcie_tx_bytes_per_s": _mean(x.pcie_tx_bytes_per_s for x in window),
        "pcie_rx_bytes_per_s": _mean(x.pcie_rx_bytes_per_s for x in window),
    }


def _trainer(last: TrainerSnapshot, snaps: Sequence[Snapshot], plan: Plan | None, said: str) -> dict:
    seen = [
        (s, t) for s in snaps for t in s.trainers if (t.pid, t.started_at) == (last.pid, last.started_at)
    ]
    running = [t for _, t in seen if t.status == "running"]
    # Each process's samples, indexed in one pass (looked up per process, the report was
    # snapshots x processes^2: 1.1 s for 4000 workers).
    samples: dict[int, list[ProcessSample]] = {}
    for t in running:
        for p in (t.main, *t.workers):
            samples.setdefault(p.pid, []).append(p)

    def history_of(pid: int) -> list[ProcessSample]:
        return samples.get(pid, [])

    shm = None
    if last.shm is not None:
        used = [t.shm.used_bytes for _, t in seen if t.shm and t.shm.used_bytes is not None]
        shm = {
            "path": last.shm.path,
            "total_bytes": last.shm.total_bytes,
            "used_bytes": last.shm.used_bytes,
            "peak_used_bytes": max(used) if used else None,
            "torch_bytes": last.shm.torch_bytes,
        }
    gpus = []
    for index in last.gpus:
        window = [g for s, _ in seen for g in s.gpus if g.index == index]
        if window:
            gpus.append(_gpu(window[-1], window))
    dw = last.data_wait
    return {
        "pid": last.pid,
        "job_pid": last.job_pid,
        "rank": last.rank,
        "local_rank": last.local_rank,
        "world_size": last.world_size,
        "cmdline": list(last.cmdline),
        "status": last.status,
        "started_at": iso(last.started_at),
        "env": dict(last.env),
        "usable_cpus": last.usable_cpus,
        "data_wait_fraction": dw.fraction if dw else None,
        "data_wait": None
        if dw is None
        else {
            "fraction": dw.fraction,
            "worker_wait_fraction": dw.worker_wait_fraction,
            "main_process_fraction": dw.main_process_fraction,
            "breakdown": dict(dw.breakdown),
            "samples": dw.samples,
            "window_s": dw.window_s,
            "stalled_for_s": dw.stalled_for_s,
            "source": dw.source,
            "loop": dw.loop,
            **({"dispatched_fraction": dw.dispatched_fraction} if dw.dispatched_fraction is not None else {}),
        },
        "loaders": [
            {
                "dataset_class": loader.dataset_class,
                "num_workers": loader.num_workers,
                "persistent_workers": loader.persistent_workers,
                "worker_pids": list(loader.worker_pids),
                **({"prefetch_factor": loader.prefetch_factor} if loader.prefetch_factor is not None else {}),
                **({"batch_size": loader.batch_size} if loader.batch_size is not None else {}),
                **({"name": loader.name} if loader.name is not None else {}),
                **({"tune": tune_dict(loader.tune)} if loader.tune is not None else {}),
            }
            for loader in last.loaders
        ],
        "pin_memory_thread": last.pin_memory_thread,
        "pin_memory_cpu_percent": _mean(t.pin_memory_cpu_percent for t in running),
        "shm": shm,
        "worker_respawns": last.worker_respawns,
        "gpus": gpus,
        "main": _process(last.main, history_of(last.main.pid)),
        "workers": [_process(w, history_of(w.pid)) for w in last.workers],
        "cpu_set": list(last.cpu_set),
        "cpu_quota": last.cpu_quota,
        "job": last.job,
        "verdict": said,
        "plan": plan.as_dict() if plan is not None and last.status == "running" else None,
        "figures": run_figures(last, snaps),
    }


def jobs_dicts(last: Snapshot, diagnosis: Diagnosis) -> list[dict]:
    """Each job of the last snapshot: its pid, name, ranks side by side (the one the others
    wait for first), its verdict, and its straggler (rank, pid, node, cause) or null."""
    groups: dict[str, list[TrainerSnapshot]] = {}
    for t in last.trainers:
        groups.setdefault(t.job, []).append(t)
    out = []
    for name, trainers in groups.items():
        job = diagnosis.job(name)
        ranks = [_rank(t, job, diagnosis.verdict(t).text) for t in trainers]
        ranks.sort(key=lambda r: (not r["straggler"], -(r["wait_for_ranks_fraction"] or 0.0),
                                  r["rank"] if r["rank"] is not None else -1))
        said = diagnosis.job_verdicts.get(name)
        text = said.text if said is not None else ranks[0]["verdict"]
        straggler = job.straggler if job is not None else None
        out.append({
            "pid": trainers[0].job_pid,
            "job": name,
            "world_size": job.world_size if job is not None else trainers[0].world_size,
            "ranks_seen": len(trainers),
            "verdict": text,
            "straggler": None if straggler is None else {
                "rank": straggler.rank, "pid": straggler.pid, "node": straggler.node, "cause": straggler.cause,
                "cost_fraction": _round(job.cost) if job is not None else None},
            "method": job.method if job is not None else None,
            "ranks": ranks,
        })
    return out


def _rank(t: TrainerSnapshot, job: Attribution | None, said: str) -> dict:
    figures = next((r for r in job.ranks if r.pid == t.pid), None) if job is not None else None
    straggler = job.straggler if job is not None else None
    return {
        "rank": t.rank,
        "pid": t.pid,
        "verdict": said,
        "straggler": straggler is not None and straggler.pid == t.pid,
        "data_wait_fraction": t.data_wait.fraction if t.data_wait else None,
        "sync_fraction": _round(None if figures is None else (
            figures.sync_frames if job is not None and job.method == "frames" else figures.sync_blocked)),
        "wait_for_ranks_fraction": _round(job.wait_of(t.rank) if job is not None and t.rank is not None else None),
        "steps_per_s": _round(figures.steps_per_s) if figures is not None else None,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def tune_dict(tune: TuneState) -> dict:
    """A loader's in-place tuner (`watch(loader, tune=True)`): its state and every decision."""
    return {
        "state": tune.state,
        "setting": tune.setting.as_dict() if tune.setting else None,
        "started_with": tune.started_with.as_dict() if tune.started_with else None,
        "epoch": tune.epoch,
        "steps_per_s": tune.steps_per_s,
        "cost_s": tune.cost_s,
        "reason": tune.reason or None,
        "summary": tune.summary,
        "decisions": [d.as_dict() for d in tune.decisions],
    }


def finding_dict(f: Finding) -> dict:
    return {
        "id": f.id,
        "severity": f.severity,
        "trainer_pid": f.trainer_pid,
        "title": f.title,
        "evidence": f.evidence,
        "suggestion": f.suggestion,
        "change": f.change,
    }


def notice_dict(n: Notice) -> dict:
    return {"id": n.id, "trainer_pid": n.trainer_pid, "message": n.message, "fix": n.fix}


def build_report(snapshots: Sequence[Snapshot], diagnosis: Diagnosis | None = None,
                 extra_notices: Iterable[Notice] = ()) -> dict:
    """The report of a window of snapshots, with `diagnosis`: the judgement the diagnoser
    made at its last snapshot (the live view's, a recording's); worked out from the snapshots
    when not given."""
    if not snapshots:
        raise ValueError("a report needs at least one snapshot")
    if diagnosis is None:
        diagnosis = diagnosed(snapshots).diagnosis
    findings = list(diagnosis.findings)
    first, last = snapshots[0], snapshots[-1]
    notices = NoticeBoard()
    for n in (*last.notices, *diagnosis.notices, *extra_notices):
        notices.add(n)
    host = last.host
    jobs = jobs_dicts(last, diagnosis)
    return {
        "schema": SCHEMA,
        "created_at": iso(last.time),
        "duration_s": round(last.monotonic - first.monotonic, 3),
        "samples": len(snapshots),
        "interval_s": last.interval_s,
        "verdict": headline(jobs),
        "jobs": jobs,
        "host": {
            "hostname": host.hostname,
            "cpu_count": host.cpu_count,
            "usable_cpus": host.usable_cpus,
            "mem_total_bytes": host.mem_total_bytes,
            "mem_available_bytes": host.mem_available_bytes,
            "load_avg": list(host.load_avg),
            "cpu_percent": _mean(s.host.cpu_percent for s in snapshots),
            "dataloader_workers": host.dataloader_workers,
            "dataloader_trainers": host.dataloader_trainers,
        },
        "trainers": [_trainer(t, snapshots, diagnosis.plan(t), diagnosis.verdict(t).text) for t in last.trainers],
        "findings": [finding_dict(f) for f in findings],
        "notices": [notice_dict(n) for n in notices.all()],
        "events": [
            {
                "time": iso(e.time),
                "kind": e.kind,
                "trainer_pid": e.trainer_pid,
                "pid": e.pid,
                "detail": e.detail,
                "exit_code": e.exit_code,
            }
            for s in snapshots
            for e in s.events
        ],
    }


def headline(jobs: list[dict]) -> str:
    """The report's one answer: the job the others wait for, else the one job's verdict, else
    the first job's (the worst comes first in the live view's order)."""
    named = [j for j in jobs if j.get("straggler")] or jobs
    return str(named[0]["verdict"]) if named else "NO TRAINER SEEN"


def verdict_of_report(report: dict) -> str:
    """The answer a report gives: its own `verdict` (what the diagnoser said); for a report
    written before it had one, the words its findings and figures give."""
    if isinstance(report.get("verdict"), str):
        return report["verdict"]
    jobs = [j for j in report.get("jobs", ()) if isinstance(j, dict) and j.get("ranks_seen", 0) >= 2]
    named = [j for j in jobs if j.get("straggler")] or (jobs if len(jobs) == 1 else [])
    if named:
        return str(named[0]["verdict"])
    findings = [Finding(f["id"], f["severity"], f.get("trainer_pid"), f.get("title", ""), f.get("evidence") or {})
                for f in report["findings"]]
    waits = [t["data_wait_fraction"] for t in report["trainers"] if t["data_wait_fraction"] is not None]
    found = word_of({f.id for f in findings}, findings, max(waits) if waits else None)
    if found:
        return found[0]
    if report["trainers"] and all(t["status"] == "exited" for t in report["trainers"]):
        return "EXITED"
    if waits:
        return (undecided(max(waits)) or ("HEALTHY", ""))[0]
    return "NO DATA WAIT MEASURED"


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def write_file(path: str, text: str) -> None:
    """Write a report: private, UTF-8, whole or not at all, never through a link (files.py)."""
    write_atomic(path, text)
