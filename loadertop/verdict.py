"""The one-word verdict on a trainer (HEALTHY, INPUT-BOUND 62%, STALLED, ...), from its
findings and data wait. Shared by the TUI header and the reports."""

from __future__ import annotations

from .model import Finding, TrainerSnapshot

# (finding ids, verdict word, colour), most urgent first.
ORDER = (
    (("loader_stalled",), "STALLED", "red"),
    (("worker_died",), "WORKER DIED", "red"),
    (("shm_pressure",), "SHM FULL", "red"),
    (("input_bound", "main_process_bound"), "INPUT-BOUND", "red"),
    (("cpu_oversubscribed", "worker_threads", "too_many_workers"), "OVERSUBSCRIBED", "yellow"),
    (("worker_memory_growth",), "MEMORY GROWING", "yellow"),
    (("worker_respawn", "pin_memory_off"), "TUNE", "yellow"),
)


def verdict(trainer: TrainerSnapshot | None, findings: list[Finding]) -> tuple[str, str]:
    """(text, colour) for one trainer."""
    if trainer is not None and trainer.status == "exited":
        return "EXITED", "magenta"
    mine = {f.id for f in findings if trainer is None or f.trainer_pid in (None, trainer.pid)}
    wait = trainer.data_wait.fraction if trainer and trainer.data_wait else None
    for ids, word, colour in ORDER:
        if mine & set(ids):
            if word == "INPUT-BOUND" and wait is not None:
                word = f"INPUT-BOUND {wait:.0%}"
            return word, colour
    if wait is None:
        return "WATCHING", "cyan"  # no data wait (yet): do not call it healthy
    return "HEALTHY", "green"


def verdict_of_report(report: dict) -> str:
    ids = {f["id"] for f in report["findings"]}
    for rule_ids, word, _ in ORDER:
        if ids & set(rule_ids):
            return word
    if report["trainers"] and all(t["status"] == "exited" for t in report["trainers"]):
        return "EXITED"
    if any(t["data_wait_fraction"] is not None for t in report["trainers"]):
        return "HEALTHY"
    return "NO DATA WAIT MEASURED"
