"""The words of a verdict on a trainer (STALLED, THROTTLED, INPUT-BOUND 62%, HEALTHY, ...) and
on a job, from findings and data wait: the root cause first (pure). The diagnoser says them
once a tick (rules/diagnosis.py); every output shows what it said. The colour beside each word
is its tone, by name (red: the job loses time; yellow: it may; cyan: not known yet)."""

from __future__ import annotations

import re

from ..model import Finding, TrainerSnapshot
from . import thresholds as T
from .ranks import Attribution

# (finding ids, verdict word, colour), root causes first: a hang, a death, a full /dev/shm,
# what takes the CPUs, then what the loader costs (every rule's id has a word: a test checks it).
ORDER = (
    (("loader_stalled",), "STALLED", "red"),
    (("worker_died",), "WORKER DIED", "red"),
    (("shm_pressure",), "SHM FULL", "red"),
    # A rank of a lockstep job that waits for another: the job's straggler is its cause.
    (("waits_for_rank",), "WAITS FOR RANK", "yellow"),
    (("rank_straggler",), "SLOWEST RANK", "red"),
    (("cpu_oversubscribed", "worker_threads", "main_threads", "too_many_workers"), "OVERSUBSCRIBED", "yellow"),
    (("input_bound", "main_process_bound"), "INPUT-BOUND", "red"),
    (("worker_memory_growth",), "MEMORY GROWING", "yellow"),
    (("worker_respawn", "pin_memory_off"), "TUNE", "yellow"),
)
# cpu_oversubscribed names what takes the CPUs.
CPU_CAUSES = {"quota": "THROTTLED", "busy_host": "BUSY HOST"}


def word_of(ids: set[str], findings: list[Finding], wait: float | None) -> tuple[str, str] | None:
    for rule_ids, word, colour in ORDER:
        if ids & set(rule_ids):
            if word == "OVERSUBSCRIBED":
                causes = {f.evidence.get("cause") for f in findings if f.id == "cpu_oversubscribed"}
                word = next((CPU_CAUSES[c] for c in causes if c in CPU_CAUSES), word)
            if word == "INPUT-BOUND" and wait is not None:
                word = f"INPUT-BOUND {wait:.0%}"
            if word == "WAITS FOR RANK":
                ranks = {f.evidence.get("straggler_rank") for f in findings if f.id == "waits_for_rank"}
                word = f"WAITS FOR RANK {min(r for r in ranks if isinstance(r, int))}"
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
    found = word_of({f.id for f in mine}, mine, wait)
    if found:
        return found
    if wait is None:
        return "WATCHING", "cyan"  # no data wait (yet): do not call it healthy
    return undecided(wait) or ("HEALTHY", "green")


def first_answer(trainer: TrainerSnapshot | None, findings: list[Finding],
                 pending: list[Finding]) -> tuple[str, str, bool]:
    """(text, colour, provisional) for one trainer in the live view: its verdict, and before its
    findings have held, what the pending ones say, marked provisional; a verdict read from
    py-spy's short first look alone is provisional too, until a full window confirms it."""
    word, colour = verdict(trainer, findings)
    dw = trainer.data_wait if trainer is not None else None
    provisional = dw is not None and dw.first_look
    mine = [f for f in findings if trainer is None or f.trainer_pid in (None, trainer.pid)]
    waiting = [f for f in pending if trainer is None or f.trainer_pid in (None, trainer.pid)]
    if trainer is not None and trainer.status != "exited" and waiting:
        # A root cause found but not held yet goes first, as the raised ones would put it.
        both = mine + waiting
        found = word_of({f.id for f in both}, both, dw.fraction if dw else None)
        if found is not None and found != word_of({f.id for f in mine}, mine, dw.fraction if dw else None):
            return (*found, True)
    return word, colour, provisional and word != "WATCHING"


# The job's verdict where no straggler is named: the most fundamental of its ranks' verdicts.
_ROOTS = ("STALLED", "WORKER DIED", "SHM FULL", "THROTTLED", "BUSY HOST", "OVERSUBSCRIBED", "SLOWEST RANK",
          "INPUT-BOUND", "DATA WAIT", "MEMORY GROWING", "TUNE", "WAITS FOR RANK", "WATCHING", "HEALTHY", "EXITED")


def job_verdict(job: Attribution | None, ranks: list[tuple[int | None, str, str]]) -> tuple[str, str]:
    """(text, colour) for a job: `job` its ranks compared (rules.ranks.Attribution, or None
    for one process), `ranks` each rank's (rank, verdict, colour). A straggler names the job's
    verdict (`INPUT-BOUND on rank 1 of 2`); balanced ranks give theirs, the worst first."""
    straggler = job.straggler if job is not None else None
    if job is not None and straggler is not None:
        seen = len(job.ranks)
        of = job.world_size or seen
        text = "INPUT-BOUND" if straggler.cause == "input" else "SLOW STEP"
        return f"{text} on rank {straggler.rank} of {of}", "red"
    if not ranks:
        return "WATCHING", "cyan"
    words = {text for _, text, _ in ranks}
    if len(words) == 1:
        return ranks[0][1], ranks[0][2]

    def root(item: tuple[int | None, str, str]) -> int:
        return next((i for i, r in enumerate(_ROOTS) if item[1].startswith(r)), len(_ROOTS))

    rank, text, colour = min(ranks, key=root)
    if len({root(r) for r in ranks}) == 1:  # alike but for a figure (INPUT-BOUND 14% and 18%)
        figures = sorted(int(m.group(1)) for _, t, _ in ranks if (m := re.search(r"(\d+)%", t)))
        if len(figures) == len(ranks):
            text = re.sub(r"\d+%", f"{figures[0]}-{figures[-1]}%", text, count=1)
        return f"{text} on every rank", colour
    return (f"{text} on rank {rank}" if rank is not None else text), colour
