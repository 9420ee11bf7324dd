"""Advice, proved by applying it: a matrix of real jobs on this machine.

For each case the built-in job runs with a starting setting; `loadertop snapshot` watches it
for --snapshot seconds; the change its findings name (all of them merged: they come from one
plan, so they must never disagree) is applied and the job re-run. Side by side, each measured
the same way (steps/s over --seconds of steady state, from the job's own log):

- before: the starting setting;
- advice: the starting setting with loadertop's change applied;
- best: the fastest of a grid of settings (what `loadertop tune` would measure);
- static: the seeds' rule, num_workers = the machine's cores;
- lightning: Lightning's rule, max(1, usable CPUs // local world size - 1).

and loadertop's predicted gain beside the measured one. A hung loader has no steps to
measure: there the check is that loadertop names the hang and proposes no setting.

Every CPU cost in the jobs is a fixed loop count (--work-per-ms, timed once here), never a
spin to a deadline, so that oversubscribed CPUs really slow a job down.

Run: python bench/advice.py [--cases cpu_bound,io_bound] [--seconds 12] [--json out.json]
Needs root for the quota (cgroup v1 cpu), pinned ranks (torchrun) and small /dev/shm cases.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadertop.demo.job import calibrate  # noqa: E402
from loadertop.probes.procfs import descendants  # noqa: E402
from loadertop.started import shm_wrapper, stop_job  # noqa: E402

CGROUP = "/sys/fs/cgroup/cpu/loadertop-bench"
CPUS = os.cpu_count() or 1


@dataclass(frozen=True)
class Setting:
    """What the advice may change, as the built-in job's flags and environment."""

    workers: int
    prefetch: int = 2
    persistent: bool = True
    pin_memory: bool = False
    val_workers: int = 0
    limit_worker_threads: int = 0
    main_threads: int = 0  # torch.set_num_threads(N) in the script; 0: as the case's flags set it
    env: tuple[tuple[str, str], ...] = ()
    shm_mb: int | None = None  # /dev/shm size (a container's --shm-size), None: the host's

    def label(self) -> str:
        parts = [f"w={self.workers}"]
        if self.val_workers:
            parts.append(f"val={self.val_workers}")
        if self.prefetch != 2:
            parts.append(f"pf={self.prefetch}")
        if self.limit_worker_threads:
            parts.append(f"init_threads={self.limit_worker_threads}")
        if self.main_threads:
            parts.append(f"set_num_threads={self.main_threads}")
        parts += [f"{k}={v}" for k, v in self.env]
        if self.shm_mb:
            parts.append(f"shm={self.shm_mb}M")
        return " ".join(parts)

    def flags(self) -> list[str]:
        out = ["--workers", str(self.workers), "--prefetch", str(self.prefetch)]
        if self.persistent:
            out.append("--persistent")
        if self.pin_memory:
            out.append("--pin-memory")
        if self.val_workers:
            out += ["--val-workers", str(self.val_workers)]
        if self.limit_worker_threads:
            out += ["--limit-worker-threads", str(self.limit_worker_threads)]
        if self.main_threads:  # after the case's flags: the last --main-threads is the one
            out += ["--main-threads", str(self.main_threads)]
        return out


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    flags: tuple[str, ...]  # the job's fixed flags (its workload)
    start: Setting
    grid: tuple[Setting, ...]
    quota_cpus: float | None = None
    ranks: int = 0  # torchrun ranks, each pinned to its own CPUs
    hang: bool = False  # SIGSTOP the workers once the job runs
    local_world_size: int = 1

    @property
    def affinity(self) -> int:
        """CPUs in each rank's affinity: what Lightning's rule counts (it ignores quotas)."""
        return CPUS // self.ranks if self.ranks else CPUS


def _grid(start: Setting, workers, **extra) -> tuple[Setting, ...]:
    out = [replace(start, workers=w) for w in workers]
    for key, values in extra.items():
        out += [replace(start, workers=w, **{key: v}) for w in workers for v in values]
    return tuple(dict.fromkeys(out))


def cases() -> list[Case]:
    cpu = Setting(1)
    io = Setting(2)
    main = Setting(1)
    threads = Setting(2)
    quota = Setting(3)
    pinned = Setting(2)
    shm = Setting(2, shm_mb=64)
    val = Setting(2, val_workers=2)
    zero = Setting(0)
    healthy = Setting(2)
    images = Setting(4)
    loop_threads = Setting(2)
    omp1 = (("OMP_NUM_THREADS", "1"),)
    return [
        Case("cpu_bound", "CPU-bound items, 1 worker, a GPU-like 10 ms step",
             ("--item-ms", "6", "--batch-size", "8", "--step-ms", "10"), cpu, _grid(cpu, [1, 2, 3, 4, 6])),
        Case("io_bound", "items wait 10 ms each (a network disk), 2 workers",
             ("--sleep-ms", "10", "--batch-size", "8", "--step-ms", "10"), io, _grid(io, [2, 4, 8, 12, 16, 24])),
        Case("heavy_main", "the loop itself computes 20 ms per step on the CPU",
             ("--item-ms", "4", "--batch-size", "8", "--step-ms", "0", "--step-cpu-ms", "20"), main,
             _grid(main, [0, 1, 2, 3, 4])),
        Case("threads", "each worker runs a BLAS-like pool of one thread per CPU",
             ("--worker-threads", "0", "--matmuls", "6", "--batch-size", "2", "--step-ms", "5"), threads,
             _grid(threads, [1, 2, 3, 4], env=[omp1])),
        Case("quota", "a 1-CPU cgroup quota, 3 CPU-bound workers",
             ("--item-ms", "4", "--batch-size", "8", "--step-ms", "10"), quota, _grid(quota, [1, 2, 3, 4]),
             quota_cpus=1.0),
        Case("pinned", "torchrun, 2 ranks each pinned to its own CPU, 2 workers each",
             ("--item-ms", "4", "--batch-size", "8", "--step-ms", "10", "--rank-cpus", "1", "--dist"), pinned,
             _grid(pinned, [1, 2, 3]), ranks=2, local_world_size=2),
        Case("small_shm", "1 MiB samples in a 64 MB /dev/shm (Docker's default)",
             ("--item-ms", "3", "--tensor-kb", "1024", "--batch-size", "6", "--step-ms", "10"), shm,
             _grid(shm, [1, 2, 3, 4, 6])),
        Case("train_val", "a starved training loader beside an idle validation loader",
             ("--item-ms", "5", "--batch-size", "8", "--step-ms", "10", "--epoch-items", "1600",
              "--val-items", "64"), val, _grid(val, [1, 2, 3, 4])),
        Case("no_workers", "num_workers=0: the loop loads every batch itself",
             ("--item-ms", "2", "--batch-size", "8", "--step-ms", "10"), zero, _grid(zero, [0, 1, 2, 3, 4])),
        Case("hung", "every worker stopped (SIGSTOP), as a hung loader looks",
             ("--item-ms", "2", "--batch-size", "8", "--step-ms", "10"), Setting(2), (), hang=True),
        Case("healthy", "cheap items, a 50 ms GPU-like step",
             ("--item-ms", "1", "--batch-size", "8", "--step-ms", "50"), healthy, _grid(healthy, [1, 2, 3, 4])),
        # A real image pipeline as a new user writes one: JPEGs decoded by PIL in the workers,
        # a CNN trained on the CPU by the loop's own threads (torch's default: one per CPU),
        # more workers than the loop needs.
        Case("images", "JPEGs decoded by PIL, a CNN step on every CPU, 4 workers on 2 CPUs",
             ("--images", "64", "--batch-size", "16", "--step-ms", "0", "--step-conv", "32", "--main-threads", "0"),
             images, _grid(images, [1, 2, 3, 4], env=[omp1])),
        # Issue 35's plain CPU loop: a small model at torch's default threads (one per CPU)
        # beside 2 workers whose items cost 5 ms of Python.
        Case("main_threads", "a small CPU model at torch's default threads, 2 workers of 5 ms items",
             ("--item-ms", "5", "--batch-size", "4", "--step-ms", "0", "--main-threads", "0"), loop_threads,
             _grid(loop_threads, [1, 2, 3, 4], env=[omp1])),
    ]


# --- running a job -----------------------------------------------------------------------


class Run:
    """One job of one case at one setting; a context manager that always kills it."""

    def __init__(self, case: Case, setting: Setting, work_per_ms: float, duration: float,
                 own_session: bool = True) -> None:
        """own_session: the job in a session of its own (setsid, as launchers start jobs), else
        in the bench's (beside what the bench starts: its scheduling group on a busy host)."""
        self.dir = Path(tempfile.mkdtemp(prefix="loadertop-advice-"))
        self.truth = self.dir / "truth.json"
        self.ready = self.dir / "ready"
        module = ["-m", "loadertop.demo.job", *case.flags, *setting.flags(),
                  "--work-per-ms", f"{work_per_ms:.3f}", "--duration", str(duration),
                  "--truth", str(self.truth), "--ready", str(self.ready)]
        cmd = [sys.executable, *module]
        if case.ranks:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={case.ranks}", *module]
        if setting.shm_mb:
            cmd = [*shm_wrapper(f"{setting.shm_mb}m"), *cmd]
        if case.quota_cpus:
            cmd = ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$0" "$@"', *cmd]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        env.update(dict(setting.env))
        env["PYTHONPATH"] = str(REPO)
        self.ranks = max(1, case.ranks)
        self.log = open(self.dir / "job.log", "w")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=own_session, process_group=None if own_session else 0,
                                     cwd=REPO)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _truth_files(self) -> list[Path]:
        if self.ranks == 1:
            return [self.truth]
        return [Path(f"{self.truth}.{r}") for r in range(self.ranks)]

    def logs(self) -> list[list[list[float]]]:
        out = []
        for path in self._truth_files():
            try:
                out.append(json.loads(path.read_text())["log"])
            except (OSError, ValueError, KeyError):
                out.append([])
        return out

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        paths = [self.ready] if self.ranks == 1 else [Path(f"{self.ready}.{r}") for r in range(self.ranks)]
        while not all(p.exists() for p in paths):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job did not start: {(self.dir / 'job.log').read_text()[-1500:]}")
            time.sleep(0.2)

    def steps_per_s(self, since: float, until: float) -> float:
        """Steps per second of the whole job (every rank) between two wall-clock times."""
        total = 0.0
        for log in self.logs():
            window = [row for row in log if since <= row[0] <= until]
            if len(window) < 2:
                return 0.0  # no progress logged: hung, or crashed
            total += (window[-1][3] - window[0][3]) / (window[-1][0] - window[0][0])
        return total

    def trainer_pids(self) -> list[int]:
        return [json.loads(p.read_text())["pid"] for p in self._truth_files() if p.exists()]

    def worker_pids(self) -> list[int]:
        out = []
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "pt_data_worker":
                        out.append(pid)
            except OSError:
                continue
        return out

    def close(self) -> None:
        stop_job(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Measured:
    setting: Setting
    rates: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


def measure(case: Case, setting: Setting, args, repeats: int = 1) -> Measured:
    out = Measured(setting)
    for _ in range(repeats):
        with Run(case, setting, args.work_per_ms, args.warmup + args.seconds + 30) as run:
            try:
                run.wait_ready()
            except RuntimeError as e:
                out.error = str(e).splitlines()[-1][:200] if str(e) else "did not start"
                out.rates.append(0.0)
                continue
            start = time.time() + args.warmup
            time.sleep(args.warmup + args.seconds + 0.6)
            rate = run.steps_per_s(start, start + args.seconds)
            if run.proc.poll() not in (None, 0) and rate == 0.0:
                out.error = f"job died ({run.proc.returncode})"
            out.rates.append(rate)
    return out


def advise(case: Case, args) -> tuple[dict, float | None]:
    """Run the case's starting setting, take loadertop's snapshot, return (report, steps/s
    measured by the job over the snapshot's window)."""
    with Run(case, case.start, args.work_per_ms, args.warmup + args.snapshot + 60) as run:
        run.wait_ready()
        if case.hang:
            time.sleep(1.0)
            for pid in run.worker_pids():
                os.kill(pid, signal.SIGSTOP)
        time.sleep(args.warmup)
        target = run.proc.pid if case.ranks else run.trainer_pids()[0]
        began = time.time()
        r = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", str(target),
                            "--duration", str(args.snapshot), "--json"],
                           capture_output=True, text=True, timeout=args.snapshot + 120, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        rate = run.steps_per_s(began, time.time())
        if case.hang:
            for pid in run.worker_pids():
                os.kill(pid, signal.SIGCONT)
    if r.returncode != 0:
        raise RuntimeError(f"loadertop snapshot failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout), rate


# --- reading the advice -------------------------------------------------------------------


def merged_change(report: dict) -> tuple[dict, list[str]]:
    """Every finding's change merged per section; conflicts (one key, two values) listed."""
    merged: dict = {}
    conflicts = []
    for f in report["findings"]:
        for section, values in (f.get("change") or {}).items():
            if not isinstance(values, dict):
                if section in merged and merged[section] != values:
                    conflicts.append(f"{section}: {merged[section]!r} vs {values!r} ({f['id']})")
                merged[section] = values
                continue
            target = merged.setdefault(section, {})
            for k, v in values.items():
                if k in target and target[k] != v:
                    conflicts.append(f"{section}.{k}: {target[k]!r} vs {v!r} ({f['id']})")
                target[k] = v
    return merged, conflicts


def predicted_gain(report: dict) -> float | None:
    for t in report["trainers"]:
        plan = t.get("plan") or {}
        if plan.get("predicted_gain") is not None:
            return plan["predicted_gain"]
    return None


def apply(setting: Setting, change: dict) -> Setting:
    """The built-in job's setting after a change as loadertop writes it."""
    loader = change.get("DataLoader") or {}
    val = change.get("dataset") == "ValData"
    out = setting
    if "num_workers" in loader:
        out = replace(out, **{"val_workers" if val else "workers": int(loader["num_workers"])})
    if "prefetch_factor" in loader:
        out = replace(out, prefetch=int(loader["prefetch_factor"]))
    if "persistent_workers" in loader:
        out = replace(out, persistent=bool(loader["persistent_workers"]))
    if "pin_memory" in loader:
        out = replace(out, pin_memory=bool(loader["pin_memory"]))
    if "worker_init_fn" in loader:
        out = replace(out, limit_worker_threads=1)
    script = re.fullmatch(r"torch\.set_num_threads\((\d+)\)", str(change.get("script") or ""))
    if script:
        out = replace(out, main_threads=int(script.group(1)))
    env = dict(out.env)
    env.update({k: str(v) for k, v in (change.get("env") or {}).items()})
    out = replace(out, env=tuple(sorted(env.items())))
    shm = (change.get("docker") or {}).get("shm_size")
    if shm and out.shm_mb:
        out = replace(out, shm_mb=_megabytes(shm))
    return out


def _megabytes(flag: str) -> int:
    unit = flag[-1].lower()
    value = float(flag[:-1])
    return int(value * 1024) if unit == "g" else int(value)


# --- the matrix ---------------------------------------------------------------------------


def _ratios(results: dict[Setting, Measured], s: Setting, base: Setting) -> list[float]:
    """s against base, round by round: the machine's speed drifts between rounds (other
    tenants), and a ratio measured minutes apart within one round drifts much less."""
    return [a / b for a, b in zip(results[s].rates, results[base].rates, strict=True) if b > 0]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _same_as(a: list[float], b: list[float]) -> bool:
    """Two settings' per-round ratios are indistinguishable: their mean difference is within
    two standard errors (tune's rule)."""
    diffs = [x - y for x, y in zip(a, b, strict=False)]
    if len(diffs) < 2:
        return False
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    return abs(statistics.fmean(diffs)) <= 2 * se


def run_case(case: Case, args) -> dict:
    print(f"== {case.name}: {case.what}", flush=True)
    report, rate_watched = advise(case, args)
    change, conflicts = merged_change(report)
    ids = sorted({f["id"] for f in report["findings"]})
    row = {"case": case.name, "what": case.what, "start": case.start.label(), "findings": ids,
           "change": change, "conflicts": conflicts, "predicted_gain": predicted_gain(report),
           "verdict_trainers": [t.get("verdict") for t in report["trainers"]], "rate_watched": rate_watched,
           # Each trainer's plan with its evidence: what the model read, to tell a wrong
           # prediction's term when the measured gain disagrees.
           "plans": [t.get("plan") for t in report["trainers"]]}
    print(f"   findings {ids} change {change} conflicts {conflicts}", flush=True)
    if case.hang:
        row["named_hang"] = "loader_stalled" in ids
        row["proposed_setting"] = bool(change.get("DataLoader") or change.get("env"))
        return row
    advised = apply(case.start, change)
    static = replace(case.start, workers=CPUS)
    lightning = replace(case.start, workers=max(1, case.affinity // case.local_world_size - 1))
    settings = list(dict.fromkeys([case.start, advised, static, lightning, *case.grid]))
    results: dict[Setting, Measured] = {s: Measured(s) for s in settings}
    for rnd in range(args.repeats):
        # Each round in another order, so that a drift within rounds favours no setting.
        for s in settings[rnd % len(settings):] + settings[: rnd % len(settings)]:
            m = measure(case, s, args)
            results[s].rates.extend(m.rates)
            results[s].error = results[s].error or m.error
            print(f"   [{rnd + 1}] {s.label():<40} {m.rate or 0:8.2f} steps/s {m.error or ''}", flush=True)
    ratio = {s: _ratios(results, s, case.start) for s in settings}
    median = {s: _median(ratio[s]) or 0.0 for s in settings}
    best = max(case.grid, key=lambda s: median[s])
    gain = median[advised] - 1.0
    predicted = row["predicted_gain"] or 0.0
    row.update({
        "advised": advised.label(), "before": results[case.start].rate, "after": results[advised].rate,
        "after_ratio": median[advised], "best_ratio": median[best], "best_setting": best.label(),
        "static_ratio": median[static], "static_setting": static.label(),
        "lightning_ratio": median[lightning], "lightning_setting": lightning.label(),
        "measured_gain": gain,
        "share_of_best": median[advised] / median[best] if median[best] else None,
        "same_as_best": advised == best or _same_as(ratio[advised], ratio[best]),
        "never_slower": median[advised] >= 1.0 or _same_as(ratio[advised], [1.0] * len(ratio[advised])),
        # Within 30% of the measured gain, or 10 points where the gain is small (a gain of a
        # few % is within the noise of one measurement).
        "prediction_holds": abs(predicted - gain) <= max(0.3 * abs(gain), 0.10),
        "grid": {s.label(): median[s] for s in case.grid},
        "rates": {s.label(): results[s].rates for s in settings},
        "errors": {s.label(): results[s].error for s in settings if results[s].error},
    })
    return row


def table(rows: list[dict]) -> str:
    def fmt(x, pct=False):
        if x is None:
            return "n/a"
        return f"{x:+.0%}" if pct else f"{x:.2f}"

    def mark(ok) -> str:
        return "yes" if ok else "**no**"

    lines = ["| case | start | findings | advice | steps/s before | advice × | best × (setting) | static × | "
             "lightning × | advice / best | ≥ 90 % of best | never slower | predicted gain | measured gain | "
             "prediction holds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "before" not in r:
            lines.append(f"| {r['case']} | {r['start']} | {', '.join(r['findings'])} | "
                         f"{'no setting' if not r['proposed_setting'] else r['change']} | "
                         f"{fmt(r['rate_watched'])} | - | - | - | - | - | - | - | - | - | - |")
            continue
        share = r["share_of_best"]
        lines.append(
            f"| {r['case']} | {r['start']} | {', '.join(r['findings']) or '-'} | {r['advised']} | "
            f"{fmt(r['before'])} | {fmt(r['after_ratio'])} | {fmt(r['best_ratio'])} ({r['best_setting']}) | "
            f"{fmt(r['static_ratio'])} ({r['static_setting']}) | {fmt(r['lightning_ratio'])} "
            f"({r['lightning_setting']}) | {fmt(share)} | "
            f"{mark((share or 0) >= 0.9 or r['same_as_best'])}"
            f"{' (within noise)' if (share or 0) < 0.9 and r['same_as_best'] else ''} | "
            f"{mark(r['never_slower'])} | {fmt(r['predicted_gain'], True)} | {fmt(r['measured_gain'], True)} | "
            f"{mark(r['prediction_holds'])} |")
    return "\n".join(lines)


def set_quota(cpus: float) -> None:
    """The cgroup (v1 cpu) the quota case's jobs run in, with a quota of `cpus`."""
    os.makedirs(CGROUP, exist_ok=True)
    with open(f"{CGROUP}/cpu.cfs_period_us", "w") as f:
        f.write("100000")
    with open(f"{CGROUP}/cpu.cfs_quota_us", "w") as f:
        f.write(str(int(100000 * cpus)))


def clear_quota() -> None:
    if os.path.isdir(CGROUP):
        try:
            os.rmdir(CGROUP)
        except OSError:
            pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    p.add_argument("--seconds", type=float, default=12.0, help="measured steady state per run")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds after the first batch before measuring")
    p.add_argument("--snapshot", type=float, default=10.0, help="loadertop snapshot duration")
    p.add_argument("--repeats", type=int, default=1, help="rounds over every setting (interleaved)")
    p.add_argument("--work-per-ms", type=float, default=None)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    args.work_per_ms = args.work_per_ms or calibrate(trials=40)
    print(f"work units per ms: {args.work_per_ms:.1f}; {CPUS} CPUs", flush=True)
    print(table(run_cases(cases(), args, run_case)))
    return 0


def run_cases(chosen: list[Case], args, run) -> list[dict]:
    """run(case, args) for each case --cases names (all by default), under the cgroup quota
    the cases ask for; the rows so far go to --json after each case."""
    if args.cases:
        names = args.cases.split(",")
        chosen = [c for c in chosen if c.name in names]
    quota = next((c.quota_cpus for c in chosen if c.quota_cpus), None)
    if quota:
        set_quota(quota)
    rows = []
    try:
        for case in chosen:
            rows.append(run(case, args))
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    finally:
        if quota:
            clear_quota()
    return rows


if __name__ == "__main__":
    sys.exit(main())
