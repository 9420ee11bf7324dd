"""A tick's judgement (rules/diagnosis.py's Diagnosis) as a recording stores it beside the
tick's snapshot, and read back: `replay`, `snapshot --from`, the summary and `diff` show what
was judged then, by the loadertop that watched, not what a later one would judge again.

Written as plain JSON (dataclasses as objects, the (pid, started_at) keys as lists); read back
field by field with the recording's own checks (record.decode_as), every string made
printable first: a recording is a file anyone may hand us. A judgement that does not read
back is None, and its reader judges that tick again from the figures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..model import Finding, Notice
from ..rules.diagnosis import Diagnosis, JobVerdict, Verdict, frozen
from ..rules.plan import Plan
from ..rules.ranks import Attribution
from ..text import printable_tree
from .record import Damaged, decode_as

VERSION = 1


def encode(d: Diagnosis) -> dict:
    asdict = dataclasses.asdict
    return {
        "version": VERSION,
        "time": d.time,
        "findings": [asdict(f) for f in d.findings],
        "pending": [asdict(f) for f in d.pending],
        "plans": [{"trainer": list(k), "plan": asdict(p)} for k, p in d.plans.items()],
        "jobs": [{"job": k, "compared": asdict(a)} for k, a in d.jobs.items()],
        "verdicts": [{"trainer": list(k), "verdict": asdict(v)} for k, v in d.verdicts.items()],
        # A job's comparison is stored once, under "jobs".
        "job_verdicts": [{**asdict(v), "compared": None} for v in d.job_verdicts.values()],
        "notices": [asdict(n) for n in d.notices],
    }


def _key(value: Any) -> tuple[int, float]:
    if not (isinstance(value, list) and len(value) == 2):
        raise Damaged("a trainer's key is not [pid, started_at]")
    return decode_as(int, value[0]), decode_as(float, value[1])


def _list(data: dict, name: str) -> list:
    value = data.get(name, [])
    if not isinstance(value, list):
        raise Damaged(f"the judgement's {name} is not a list")
    return value


def decode(data: Any) -> Diagnosis | None:
    """The Diagnosis stored, or None where there is none or it is not what loadertop writes."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None
    try:
        data = printable_tree(data)
        assert isinstance(data, dict)
        jobs = {decode_as(str, j.get("job")): decode_as(Attribution, j.get("compared")) for j in _list(data, "jobs")}
        job_verdicts = {}
        for j in _list(data, "job_verdicts"):
            v = decode_as(JobVerdict, j)
            job_verdicts[v.job] = dataclasses.replace(v, compared=jobs.get(v.job))
        return Diagnosis(
            time=decode_as(float, data.get("time")),
            findings=tuple(decode_as(Finding, f) for f in _list(data, "findings")),
            pending=tuple(decode_as(Finding, f) for f in _list(data, "pending")),
            plans=frozen({_key(p.get("trainer")): decode_as(Plan, p.get("plan")) for p in _list(data, "plans")}),
            jobs=frozen(jobs),
            verdicts=frozen({_key(v.get("trainer")): decode_as(Verdict, v.get("verdict"))
                             for v in _list(data, "verdicts")}),
            job_verdicts=frozen(job_verdicts),
            notices=tuple(decode_as(Notice, n) for n in _list(data, "notices")),
        )
    except (Damaged, AttributeError, TypeError, ValueError):
        return None


def at(judged, index: int) -> Diagnosis | None:
    """Tick `index`'s judgement from `judged` (each tick's: a Diagnosis kept in memory, or as a
    recording stores it), None where there is none."""
    if not 0 <= index < len(judged):
        return None
    said = judged[index]
    return said if isinstance(said, Diagnosis) or said is None else decode(said)
