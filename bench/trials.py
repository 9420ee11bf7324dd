"""Trials that the host cannot fool (issue 45): `watch(loader, tune=True)` beside a host whose
other work comes and goes, each of its trials checked against the same two settings measured
fixed and interleaved.

The host: two busy loops (a fixed loop count per pass) that run for --on seconds and sleep for
--off seconds, together, detached from this bench (bench/consistency.py's Hog, switched on and
off): the load a shared GPU server's other jobs put on and take off, which once made the tuner
revert changes that were faster ("measured -28 % (noise ±8 %), reverted": each trial fell into
a stretch the host made slow, compared with the stretch before it).

For each job (bench/advice.py's built-in job, every CPU cost a fixed loop count; `slow-loader` is
bench/ranks.py's two DDP ranks whose rank 1 reads a slow shard, tuned on both):
1. tuned: the job from its starting setting with tune=True for --tune-seconds, beside the load;
   every decision (try, keep, revert with why);
2. interleaved: each pair the tuner judged (the setting kept A, the trial B), run fixed
   A, B, A, B, ... (--rounds rounds of --seconds each after --warmup), beside the same load:
   B's steps/s over A's in each round, their mean and 2 standard errors (the noise).

Goals: the tuner keeps no trial that the interleaved runs show slower beyond their noise, and
reverts none that they show faster beyond it.

Run: python bench/trials.py [--jobs io_bound,cpu_bound] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import advice as A  # noqa: E402  (its jobs and runs)
import ranks as R  # noqa: E402  (its two-rank jobs)
from autotune import tuned_run, with_epochs  # noqa: E402
from consistency import Hog, detached  # noqa: E402

from loadertop.demo.job import calibrate  # noqa: E402

# Busy for `on` seconds (a fixed loop count per pass, timed only to switch), asleep for `off`.
LOAD = """import sys, time
on, off, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
while True:
    end = time.monotonic() + on
    while time.monotonic() < end:
        x = 0
        for i in range(n):
            x += i
    time.sleep(off)
"""


class ComingAndGoing(Hog):
    """Two busy loops that run and sleep together, detached (loadertop counts its own
    children's CPU as its own, not the host's); closed as the Hog is."""

    def __init__(self, on: float, off: float) -> None:
        self.pids = [detached([sys.executable, "-c", LOAD, str(on), str(off), "100000"]) for _ in range(2)]


def setting_of(start: A.Setting, knobs: dict) -> A.Setting:
    """The tuner's setting as the built-in job's flags."""
    return replace(start, workers=knobs["num_workers"], prefetch=knobs.get("prefetch_factor") or 2,
                   main_threads=knobs.get("main_threads") or start.main_threads,
                   limit_worker_threads=knobs.get("worker_threads") or 0)


def interleaved(case: A.Case, a: A.Setting, b: A.Setting, args) -> dict:
    """B's steps/s over A's, round by round (A then B, B then A in turn: neither always first)."""
    ratios = []
    for rnd in range(args.rounds):
        rates = {}
        for s in ((a, b) if rnd % 2 == 0 else (b, a)):
            m = A.measure(case, s, args)
            rates[s] = m.rate or 0.0
        if rates[a] > 0:
            ratios.append(rates[b] / rates[a])
        print(f"     round {rnd + 1}: {a.label()} {rates[a]:.1f}, {b.label()} {rates[b]:.1f} steps/s", flush=True)
    mean = statistics.fmean(ratios) if ratios else 0.0
    noise = 2 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.inf
    return {"ratios": ratios, "gain": mean - 1.0, "noise": noise}


def run_job(case: A.Case, args) -> dict:
    print(f"== {case.name}: {case.what}", flush=True)
    first = A.measure(case, case.start, args)
    batch = int(case.flags[case.flags.index("--batch-size") + 1])
    items = batch * max(60, round((first.rate or 1.0) / max(1, case.ranks) * args.epoch_s))
    case = with_epochs(case, items)
    t = tuned_run(case, args, args.tune_seconds)
    decisions = [d for tune in t["tunes"] for d in tune["decisions"]]
    for d in decisions:
        print(f"   {d['text']}", flush=True)
    judged = []
    for d in decisions:
        if d["action"] not in ("keep", "revert"):
            continue
        # keep: from A to B; revert: from the trial B back to A.
        a_knobs, b_knobs = (d["from"], d["to"]) if d["action"] == "keep" else (d["to"], d["from"])
        a, b = setting_of(case.start, a_knobs), setting_of(case.start, b_knobs)
        print(f"   interleaved {a.label()} / {b.label()} (the tuner: {d['action']})", flush=True)
        ab = interleaved(case, a, b, args)
        slower = ab["gain"] < -ab["noise"]
        faster = ab["gain"] > ab["noise"]
        ok = not (d["action"] == "keep" and slower) and not (d["action"] == "revert" and faster)
        judged.append({"decision": d["text"], "action": d["action"], "a": a.label(), "b": b.label(),
                       "tuner_gain": d["measured_gain"], "tuner_noise": d["noise"], **ab, "agrees": ok})
        print(f"   -> interleaved {ab['gain']:+.0%} ±{ab['noise']:.0%}: {'agrees' if ok else 'DISAGREES'}", flush=True)
    return {"job": case.name, "what": case.what, "start": case.start.label(), "epoch_items": items,
            "rates": t["rates"], "final": [tune["setting"] for tune in t["tunes"]],
            "decisions": [d["text"] for d in decisions], "judged": judged}


def table(rows: list[dict]) -> str:
    lines = ["| job | the tuner's decision | interleaved B/A − 1 (±2 SE) | agrees |", "|---|---|---|---|"]
    for r in rows:
        if not r["judged"]:
            lines.append(f"| {r['job']} | {'; '.join(r['decisions']) or 'none'} | (no trial judged) | |")
        for j in r["judged"]:
            lines.append(f"| {r['job']} | {j['decision']} | {j['gain']:+.0%} ±{j['noise']:.0%} "
                         f"({', '.join(f'{x:.2f}' for x in j['ratios'])}) | {'yes' if j['agrees'] else '**no**'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", default="io_bound,cpu_bound,slow-loader")
    p.add_argument("--on", type=float, default=5.0, help="seconds the load runs")
    p.add_argument("--off", type=float, default=7.0, help="seconds it sleeps")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--epoch-s", type=float, default=3.0)
    p.add_argument("--tune-seconds", type=float, default=90.0)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--work-per-ms", type=float, default=None)
    p.add_argument("--json")
    args = p.parse_args()
    args.work_per_ms = args.work_per_ms or calibrate(trials=40)
    every = {c.name: c for c in A.cases()} | {name: R.case(name) for name in R.JOBS}
    chosen = [every[name] for name in args.jobs.split(",")]
    print(f"work units per ms: {args.work_per_ms:.1f}; {A.CPUS} CPUs; the load: {args.on} s on, {args.off} s off",
          flush=True)
    load = ComingAndGoing(args.on, args.off)
    try:
        time.sleep(1.0)
        rows = [run_job(c, args) for c in chosen]
    finally:
        load.close()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
