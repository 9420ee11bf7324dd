"""The answer's invariants, written once (pure): the diagnoser checks each tick's judgement
against them before anything shows it, and the tests (as properties over generated histories)
and bench/consistency.py count what they find. A violation is a bug in loadertop: it is said in
a notice, never shown as a contradiction.

- no HEALTHY until a DataLoader was seen and a data-wait figure exists;
- a confirmed verdict never goes back to provisional; an exited trainer is never provisional;
- the header's change is one a finding or a pending finding asks for;
- a gain predicted for a loader change is at most what removing the data wait gives,
  1/(1 - w) - 1 (a thread limit, a named cause, may add to it).
"""

from __future__ import annotations

from ..model import Notice, Snapshot
from .diagnosis import Diagnosis

INVARIANT_BROKEN = "invariant_broken"
SLACK = 1e-6


def violations(snap: Snapshot, now: Diagnosis, before: Diagnosis | None, seen: set[tuple[int, float]]) -> list[str]:
    """What this tick's judgement breaks; `before`: the previous tick's, `seen`: the trainers
    whose DataLoader was seen so far (this tick's included)."""
    out = []
    claims = bool(now.findings or now.pending)
    for t in snap.trainers:
        key = (t.pid, t.started_at)
        said = now.verdict(t)
        if t.status == "exited" and said.provisional:
            out.append(f"trainer {t.pid} exited, yet its verdict is provisional")
        if said.text == "HEALTHY" and (key not in seen or t.data_wait is None or t.data_wait.fraction is None):
            out.append(f"trainer {t.pid} is called HEALTHY before a DataLoader and a data wait were seen")
        earlier = before.verdicts.get(key) if before is not None else None
        if (earlier is not None and said.provisional and not earlier.provisional and not earlier.measuring
                and earlier.text != "EXITED"):
            out.append(f"trainer {t.pid}'s confirmed verdict {earlier.text} went back to provisional {said.text}")
        if said.change and not claims:
            out.append(f"trainer {t.pid}'s header asks for a change no finding asks for")
        plan = now.plan(t)
        if (plan is not None and plan.gain is not None and plan.wait_now is not None and plan.wait_now < 1.0
                and not plan.thread_change and not plan.chosen.threads_per_worker
                and plan.gain > plan.wait_now / (1.0 - plan.wait_now) + SLACK):
            out.append(f"trainer {t.pid}'s plan predicts {plan.gain:+.0%} from a {plan.wait_now:.0%} data wait")
    return out


def notice(pid: int | None, what: str) -> Notice:
    return Notice(INVARIANT_BROKEN, f"loadertop contradicted itself: {what}; that claim is not to be trusted",
                  "this is a bug in loadertop: please report it with a recording (`loadertop record PID -o run.ltrec`)",
                  pid)

