"""The one-word verdict on a trainer (STALLED, THROTTLED, INPUT-BOUND 62%, HEALTHY, ...), from
its findings and data wait: the root cause first. Shared by the TUI header and the reports."""

from __future__ import annotations

from . import rules as R
from .model import Finding, TrainerSnapshot
from .rules import thresholds as T

# (finding ids, verdict word, colour), root causes first: a hang, a death, a full /dev/shm,
# what takes the CPUs, then what the loader costs.
ORDER = (
    ((R.loader_stalled.ID,), "STALLED", "red"),
    ((R.worker_died.ID,), "WORKER DIED", "red"),
    ((R.shm_pressure.ID,), "SHM FULL", "red"),
    ((R.cpu_oversubscribed.ID, R.worker_threads.ID, R.too_many_workers.ID), "OVERSUBSCRIBED", "yellow"),
    ((R.input_bound.ID, R.main_process_bound.ID), "INPUT-BOUND", "red"),
    ((R.worker_memory_growth.ID,), "MEMORY GROWING", "yellow"),
    ((R.worker_respawn.ID, R.pin_memory_off.ID), "TUNE", "yellow"),
)
# cpu_oversubscribed names what takes the CPUs.
CPU_CAUSES = {"quota": "THROTTLED", "busy_host": "BUSY HOST"}


def _word(ids: set[str], findings: list[Finding], wait: float | None) -> tuple[str, str] | None:
    for rule_ids, word, colour in ORDER:
        if ids & set(rule_ids):
            if word == "OVERSUBSCRIBED":
                causes = {f.evidence.get("cause") for f in findings if f.id == R.cpu_oversubscribed.ID}
                word = next((CPU_CAUSES[c] for c in causes if c in CPU_CAUSES), word)
            if word == "INPUT-BOUND" and wait is not None:
                word = f"INPUT-BOUND {wait:.0%}"
            return word, colour
    return None


def undecided(wait: float | None) -> tuple[str, str] | None:
    """No finding, yet a data wait no healthy loop has: say so rather than HEALTHY."""
    if wait is not None and wait >= T.DATA_WAIT_CRITICAL:
        return f"DATA WAIT {wait:.0%}", "yellow"
    return None


def verdict(trainer: TrainerSnapshot | None, findings: list[Finding]) -> tuple[str, str]:
    """(text, colour) for one trainer."""
    if trainer is not None and trainer.status == "exited":
        return "EXITED", "magenta"
    mine = [f for f in findings if trainer is None or f.trainer_pid in (None, trainer.pid)]
    wait = trainer.data_wait.fraction if trainer and trainer.data_wait else None
    found = _word({f.id for f in mine}, mine, wait)
    if found:
        return found
    if wait is None:
        return "WATCHING", "cyan"  # no data wait (yet): do not call it healthy
    return undecided(wait) or ("HEALTHY", "green")


def verdict_of_report(report: dict) -> str:
    findings = [_finding(f) for f in report["findings"]]
    waits = [t["data_wait_fraction"] for t in report["trainers"] if t["data_wait_fraction"] is not None]
    found = _word({f.id for f in findings}, findings, max(waits) if waits else None)
    if found:
        return found[0]
    if report["trainers"] and all(t["status"] == "exited" for t in report["trainers"]):
        return "EXITED"
    if waits:
        return (undecided(max(waits)) or ("HEALTHY", ""))[0]
    return "NO DATA WAIT MEASURED"


def _finding(f: dict) -> Finding:
    return Finding(f["id"], f["severity"], f.get("trainer_pid"), f.get("title", ""), f.get("evidence") or {})
