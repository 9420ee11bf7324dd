"""In-place tuning, measured: the advice matrix's jobs (bench/advice.py), each started from its
bad setting with short epochs and `watch(loader, tune=True)`, against the fixed settings.

For each case, side by side in one run:

- start: the starting setting, fixed (its steps/s sizes the epochs: about --epoch-s each);
- tuned: the same job with tune=True, for --epochs epochs: steps/s of every epoch, relative
  to its own first epoch (which runs the starting setting), the tuner's decisions and the
  time it took inside the loop;
- best: the fastest of the case's grid of fixed settings (what tune measures), relative to
  the start measured in the same round;
- advice: loadertop's one-shot change (a 10 s snapshot of the start), applied by restart;
- static: num_workers = the machine's cores; lightning: max(1, CPUs // local world size - 1).

Goals (issue 25): the steady state (the epochs from --steady-from on) reaches >= 95 % of the
grid's best; after the first epoch no epoch is slower than the start beyond noise; a job
already at its best is left alone (at most one exploratory epoch, then no change); the
tuner's own time is under 0.1 % of the loop's.

Every CPU cost is a fixed loop count (--work-per-ms), as in bench/advice.py.

Run: python bench/autotune.py [--cases cpu_bound,images] [--epochs 10] [--json out.json]
Needs root for the quota, pinned-rank and small /dev/shm cases, as bench/advice.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import advice as A  # noqa: E402  (the matrix, its jobs and its runs)

from loadertop.demo.job import calibrate  # noqa: E402

NOISE = 0.05  # an epoch's rate moves this much at a fixed setting on this VM (bench/advice.py's rounds)


def with_epochs(case: A.Case, items: int) -> A.Case:
    return replace(case, flags=(*case.flags, "--epoch-items", str(items)))


def epoch_rates(run: A.Run) -> dict[int, float]:
    """Steps per second of each epoch the job logged (every rank's steps summed)."""
    out: dict[int, float] = {}
    logs = run.logs()
    for e in sorted({row[4] for log in logs for row in log if len(row) > 4}):
        total = 0.0
        for log in logs:
            rows = [row for row in log if len(row) > 4 and row[4] == e]
            if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
                total = 0.0
                break
            total += (rows[-1][3] - rows[0][3]) / (rows[-1][0] - rows[0][0])
        if total > 0:
            out[int(e) + 1] = total  # the job counts from 0, the tuner (and people) from 1
    return out


def tuned_run(case: A.Case, args, seconds: float) -> dict:
    tuned = replace(case, flags=(*case.flags, "--tune"))
    with A.Run(tuned, case.start, args.work_per_ms, seconds + 30) as run:
        run.wait_ready()
        deadline = time.time() + seconds
        while time.time() < deadline and run.proc.poll() is None:
            rates = epoch_rates(run)
            if len(rates) > args.epochs:
                break
            time.sleep(1.0)
        rates = {e: r for e, r in epoch_rates(run).items() if e <= args.epochs}  # the last may be cut short
        truths = []
        for path in run._truth_files():
            try:
                truths.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                truths.append({})
    tunes = [t.get("tune") for t in truths if t.get("tune")]
    elapsed = max((t.get("elapsed_s", 0.0) for t in truths), default=0.0)
    return {"rates": rates, "tunes": tunes, "elapsed_s": elapsed}


def run_case(case: A.Case, args) -> dict:
    print(f"== {case.name}: {case.what}", flush=True)
    first = A.measure(case, case.start, args)
    start_rate = first.rate or 1.0
    batch = int(case.flags[case.flags.index("--batch-size") + 1])
    items = batch * max(60, round(start_rate / max(1, case.ranks or 1) * args.epoch_s))
    case = with_epochs(case, items)
    report, _ = A.advise(case, args)
    change, _ = A.merged_change(report)
    advised = A.apply(case.start, change)
    static = replace(case.start, workers=A.CPUS)
    lightning = replace(case.start, workers=max(1, case.affinity // case.local_world_size - 1))
    settings = list(dict.fromkeys([case.start, advised, static, lightning, *case.grid]))
    fixed: dict[A.Setting, list[float]] = {s: [] for s in settings}
    tuned: list[dict] = []
    seconds = args.epochs * args.epoch_s * 2.5 + 20
    for rnd in range(args.repeats):
        order = settings[rnd % len(settings):] + settings[: rnd % len(settings)]
        for s in order:
            m = A.measure(case, s, args)
            fixed[s].extend(m.rates)
            print(f"   [{rnd + 1}] {s.label():<40} {m.rate or 0:8.2f} steps/s {m.error or ''}", flush=True)
        t = tuned_run(case, args, seconds)
        tuned.append(t)
        print(f"   [{rnd + 1}] tuned: " + " ".join(f"{e}:{r:.1f}" for e, r in sorted(t["rates"].items())), flush=True)
        for tune in t["tunes"]:
            for d in tune["decisions"]:
                print(f"        {d['text']}", flush=True)

    def ratio(s: A.Setting) -> float:
        values = [a / b for a, b in zip(fixed[s], fixed[case.start], strict=True) if b > 0]
        return statistics.median(values) if values else 0.0

    best = max(case.grid, key=ratio)
    # The tuned runs, each against its own first epoch (the starting setting).
    per_epoch: dict[int, list[float]] = {}
    for t in tuned:
        rates = t["rates"]
        base = rates.get(1) or rates.get(min(rates, default=1), 0.0)
        for e, r in rates.items():
            if base:
                per_epoch.setdefault(e, []).append(r / base)
    epochs = {e: statistics.median(v) for e, v in sorted(per_epoch.items())}
    steady_epochs = [v for e, v in epochs.items() if e >= args.steady_from]
    steady = statistics.fmean(steady_epochs) if steady_epochs else None
    later = [v for e, v in epochs.items() if e >= 2]
    decisions = [d for t in tuned for tune in t["tunes"] for d in tune["decisions"]]
    tries = [d for d in decisions if d["action"] == "try"]
    final = [tune["setting"] for t in tuned for tune in t["tunes"]]
    cost = [sum(tune["cost_s"] for tune in t["tunes"]) / t["elapsed_s"] for t in tuned if t["elapsed_s"]]
    best_ratio = ratio(best)
    at_best = ratio(case.start) >= best_ratio * (1 - NOISE)
    # The tuned job's steady epochs against the grid's best in the same round, in steps/s:
    # apart from its first epoch, which a case whose epochs swing (pools fighting over the
    # CPUs) makes a poor base.
    same_round = []
    for rnd, t in enumerate(tuned):
        rates = [r for e, r in t["rates"].items() if e >= args.steady_from]
        if rates and rnd < len(fixed[best]) and fixed[best][rnd] > 0:
            same_round.append(statistics.fmean(rates) / fixed[best][rnd])
    row = {
        "case": case.name, "what": case.what, "start": case.start.label(), "epoch_items": items,
        "start_rate": start_rate, "epochs": epochs, "steady": steady,
        "best": best.label(), "best_ratio": best_ratio, "advised": advised.label(), "advice_ratio": ratio(advised),
        "static": static.label(), "static_ratio": ratio(static), "lightning": lightning.label(),
        "lightning_ratio": ratio(lightning),
        "share_of_best": steady / best_ratio if steady and best_ratio else None,
        "steady_of_best_same_round": statistics.median(same_round) if same_round else None,
        "slowest_later_epoch": min(later) if later else None,
        "start_at_best": at_best, "trials": len(tries) / max(1, len(tuned)),
        "final": final, "decisions": [d["text"] for d in decisions],
        "cost_share": max(cost) if cost else None,
        "fixed": {s.label(): v for s, v in fixed.items()},
    }
    print(f"   steady {steady} of best {best_ratio:.2f} ({best.label()}), in steps/s of the same round "
          f"{same_round}, final {final}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    def x(v) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    def mark(ok: bool) -> str:
        return "yes" if ok else "**no**"

    lines = ["| case | start | tuned, epoch by epoch (× its first) | ended on | steady × | best × (setting) | "
             "steady / best | steady / best, steps/s of its round | ≥ 95 % | no epoch slower | advice × | static × | "
             "lightning × | tuner's time |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r["share_of_best"]
        slow = r["slowest_later_epoch"]
        series = " ".join(f"{v:.2f}" for v in r["epochs"].values())
        final = ", ".join(sorted({f"w={f['num_workers']}" + (f" pf={f['prefetch_factor']}"
                                                              if f["prefetch_factor"] not in (None, 2) else "")
                                  + (f" main_threads={f['main_threads']}" if f.get("main_threads") == 1 else "")
                                  + (f" worker_threads={f['worker_threads']}" if f.get("worker_threads") else "")
                                  for f in r["final"] if f}))
        alone = f" ({r['trials']:.0f} trial{'s' if r['trials'] != 1 else ''})" if r["start_at_best"] else ""
        cost = "n/a" if r["cost_share"] is None else f"{100 * r['cost_share']:.3f} %"
        lines.append(
            f"| {r['case']} | {r['start']} | {series} | {final}{alone} | {x(r['steady'])} | {x(r['best_ratio'])} "
            f"({r['best']}) | {x(share)} | {x(r['steady_of_best_same_round'])} | "
            f"{mark(max(share or 0, r['steady_of_best_same_round'] or 0) >= 0.95)} | "
            f"{mark(slow is not None and slow >= 1 - NOISE)} | {x(r['advice_ratio'])} ({r['advised']}) | "
            f"{x(r['static_ratio'])} | {x(r['lightning_ratio'])} | {cost} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all but hung)")
    p.add_argument("--epochs", type=int, default=10, help="epochs of each tuned run")
    p.add_argument("--epoch-s", type=float, default=4.0, help="an epoch's length at the starting setting")
    p.add_argument("--steady-from", type=int, default=6, help="the steady state: epochs from this one on")
    p.add_argument("--seconds", type=float, default=10.0, help="measured steady state of each fixed run")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--snapshot", type=float, default=10.0, help="the one-shot advice's snapshot")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--work-per-ms", type=float, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.work_per_ms = args.work_per_ms or calibrate(trials=40)
    print(f"work units per ms: {args.work_per_ms:.1f}; {A.CPUS} CPUs", flush=True)
    print(table(A.run_cases([c for c in A.cases() if not c.hang], args, run_case)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
