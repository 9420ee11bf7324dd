"""The first answer: how soon the live view names each advice bench job's problem, and how
often that first (provisional) answer is changed by the full window that follows.

For each case of bench/advice.py at its starting setting: the job starts, its first batch is
delivered, then the live view's source (LiveSource: the LIVE py-spy profile, its 3 s first
look, the same diagnoser) ticks every --interval s for --seconds, in this process, with no
screen. At every tick the header's verdict is read the way the screen reads it
(the Diagnosis of each tick, rules/diagnosis.py: the raised findings, else the pending ones, provisional while they
have not held or while data wait comes from the first look alone). Per case:

- first: seconds from the first tick to the first verdict that is not WATCHING;
- confirmed: seconds to the first verdict that is not provisional;
- the first verdict's word and the confirmed one's (figures stripped: INPUT-BOUND 81% and
  INPUT-BOUND 78% are one answer), and whether they differ (a flip);
- changes: how many times the word changed over the whole run after the first verdict, the
  last verdict, and from when it held (a root cause a later reading finds: threads, a quota).

Run: python bench/first_verdict.py [--cases cpu_bound,io_bound] [--seconds 30] [--json out.json]
Needs root for the quota case (cgroup v1 cpu), as bench/advice.py.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from advice import CGROUP, Run, cases, clear_quota, set_quota  # noqa: E402

from loadertop.demo.job import calibrate  # noqa: E402
from loadertop.rules.verdict import job_verdict  # noqa: E402
from loadertop.tui.source import LiveSource  # noqa: E402


def family(word: str) -> str:
    """A verdict without its figures: INPUT-BOUND 81% -> INPUT-BOUND."""
    return re.sub(r"\s*\d+(-\d+)?%", "", word).strip()


def watch(case, args) -> dict:
    with Run(case, case.start, args.work_per_ms, args.seconds + 60) as run:
        run.wait_ready()
        if case.hang:
            time.sleep(1.0)
            for pid in run.worker_pids():
                subprocess.run(["kill", "-STOP", str(pid)], check=False)
        source = LiveSource([run.proc.pid], interval_s=args.interval)
        seen: list[tuple[float, str, bool]] = []
        try:
            start = time.monotonic()
            while time.monotonic() - start < args.seconds:
                tick = time.monotonic()
                snap, diagnosis = source.next()
                said = [diagnosis.verdict(t) for t in snap.trainers]
                ranks = [(t.rank, v.text, v.colour) for t, v in zip(snap.trainers, said, strict=True)]
                provisional = any(v.provisional for v in said)
                word = job_verdict(None, ranks)[0] if ranks else "WATCHING"
                seen.append((snap.monotonic, word, provisional))
                time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
        finally:
            source.close()
    t0 = seen[0][0]
    answered = [(t - t0, w, p) for t, w, p in seen if family(w) != "WATCHING"]
    confirmed = [(t, w) for t, w, p in answered if not p]
    words = [family(w) for _, w, _ in answered]
    changes = sum(1 for a, b in zip(words, words[1:], strict=False) if a != b)
    settled = next((t for i, (t, _, _) in enumerate(answered) if all(w == words[-1] for w in words[i:])), None)
    if args.verbose:
        for i, (t, w, p) in enumerate(answered):
            if i == 0 or words[i] != words[i - 1] or p != answered[i - 1][2]:
                print(f"  {case.name} {t:5.1f} s  {w}{' (provisional)' if p else ''}", flush=True)
    first = answered[0] if answered else None
    return {
        "case": case.name,
        "first_s": round(first[0], 1) if first else None,
        "first": first[1] if first else None,
        "first_provisional": first[2] if first else None,
        "confirmed_s": round(confirmed[0][0], 1) if confirmed else None,
        "confirmed": confirmed[0][1] if confirmed else None,
        "last": seen[-1][1],
        "flip": bool(first and confirmed and family(first[1]) != family(confirmed[0][1])),
        "changes": changes,
        "settled_s": round(settled, 1) if settled is not None else None,
    }


def table(rows: list[dict]) -> str:
    out = ["| case | first verdict | after | confirmed | after | flip | changes after | last verdict | from |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        prov = " (provisional)" if r["first_provisional"] else ""
        out.append(f"| {r['case']} | {r['first']}{prov} | {r['first_s']} s | {r['confirmed']} | {r['confirmed_s']} s | "
                   f"{'**yes**' if r['flip'] else 'no'} | {r['changes']} | {r['last']} | {r['settled_s']} s |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", help="comma-separated case names (all by default)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the view watches each job (30)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds per tick (0.5)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--verbose", action="store_true", help="print each change of the verdict as it comes")
    args = p.parse_args()
    args.work_per_ms = calibrate()
    chosen = [c for c in cases() if not args.cases or c.name in args.cases.split(",")]
    rows = []
    for case in chosen:
        if case.quota_cpus:
            set_quota(case.quota_cpus)
        try:
            rows.append(watch(case, args))
        finally:
            if case.quota_cpus:
                clear_quota()
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    first = [r["first_s"] for r in rows if r["first_s"] is not None]
    flips = sum(r["flip"] for r in rows)
    print(f"\nfirst verdict: median {sorted(first)[len(first) // 2]:.1f} s, max {max(first):.1f} s; "
          f"flips {flips} of {len(rows)}; quota cgroup {CGROUP}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
