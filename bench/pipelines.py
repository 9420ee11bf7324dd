"""The pipelines people train with (issue 45): timm's loader, a Hugging Face Trainer that
tokenizes in its collator, and webdataset shards through WebLoader (bench/pipeline_jobs.py),
each on data it makes itself, watched and tuned as their users would.

Per pipeline, from the setting its users start with (timm's `--workers 4`, the Trainer's
`dataloader_num_workers=2`, a WebLoader of 4 workers; torch's own thread counts):
1. advice: `loadertop snapshot PID --json` from the job's second epoch: the verdict, the change in the
   pipeline's own words, the predicted gain;
2. the change applied, interleaved: the start (A) and the start with the change (B) run
   A, B, B, A, A, B, ... for --rounds rounds of --epochs whole epochs each from the job's
   second epoch (its first is start-up), one job at a time:
   B's steps/s over A's in each round, their mean and 2 standard errors (the noise);
3. best fixed: worker counts {1, 2, 4} at torch's own threads, each run once like the above
   (A's and B's means count among them);
4. tuned: the start with tune=True for --tune-seconds; its steps/s over the whole epochs of its
   last third, against the best fixed; every epoch's items counted (repeated, lost), and the tuner's
   decisions as it logged them.

timm needs torchvision, whose PyPI build does not import beside the CPU torch of this machine
('operator torchvision::nms does not exist'): --timm-python names an interpreter where both
import (here a venv with torch 2.14.1 and torchvision 0.29.1; the monitor runs on this one).

Run: python bench/pipelines.py [--pipelines timm,hf,wds] [--timm-python /venv/bin/python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from advice import merged_change  # noqa: E402

from loadertop.started import stop_job  # noqa: E402

JOBS = Path(__file__).resolve().parent / "pipeline_jobs.py"


@dataclass(frozen=True)
class Setting:
    workers: int
    threads: int = 0  # OMP_NUM_THREADS and MKL_NUM_THREADS; 0: unset (torch's own)
    main_threads: int = 0  # torch.set_num_threads in the loop; 0: unset

    def label(self) -> str:
        out = f"{self.workers}w"
        if self.threads:
            out += f" OMP={self.threads}"
        if self.main_threads:
            out += f" main={self.main_threads}"
        return out


@dataclass(frozen=True)
class Pipeline:
    name: str
    start: Setting
    python: str


class Run:
    """One job of one pipeline at one setting; a context manager that always stops it."""

    def __init__(self, p: Pipeline, s: Setting, args, tune: bool = False, duration: float = 600.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="loadertop-pipelines-"))
        self.steps, self.epochs, self.ready = self.dir / "steps", self.dir / "epochs", self.dir / "ready"
        cmd = [p.python, str(JOBS), "--pipeline", p.name, "--data", args.data, "--workers", str(s.workers),
               "--duration", str(duration), "--log", str(self.steps), "--epochs-log", str(self.epochs),
               "--ready", str(self.ready)]
        if s.main_threads:
            cmd += ["--main-threads", str(s.main_threads)]
        if tune:
            cmd.append("--tune")
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        if s.threads:
            env.update(OMP_NUM_THREADS=str(s.threads), MKL_NUM_THREADS=str(s.threads))
        # TOKENIZERS_PARALLELISM is left to the tokenizers library (it turns its threads off in
        # forked workers itself; forced on, the workers deadlock after the fork).
        env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
        self.output = open(self.dir / "job.log", "w")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.output, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        stop_job(self.proc)
        self.output.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job did not start: {self.log()[-1500:]}")
            time.sleep(0.2)

    def log(self) -> str:
        self.output.flush()
        return (self.dir / "job.log").read_text(errors="replace")

    def step_times(self) -> list[tuple[float, int]]:
        rows = []
        for line in self.steps.read_text().splitlines():
            t, _, e = line.partition(" ")
            rows.append((float(t), int(e)))
        return rows

    def epoch_rows(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.epochs.read_text().splitlines()]
        except OSError:
            return []

    def second_epoch(self, timeout: float = 300.0) -> float:
        """When the job's second epoch began: its first epoch (workers starting, caches
        filling, the allocator growing) is not its steady state."""
        deadline = time.monotonic() + timeout
        while True:
            later = [t for t, e in self.step_times() if e >= 1]
            if later:
                return later[0]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job did not reach its second epoch: {self.log()[-1500:]}")
            time.sleep(0.3)


def measure(p: Pipeline, s: Setting, args) -> float:
    """Steps/s over --epochs whole epochs from the job's second (its first is start-up; whole
    epochs, as a window within one reads the burst of batches its workers fetched ahead)."""
    with Run(p, s, args, duration=600) as run:
        run.wait_ready()
        run.second_epoch()
        last = 1 + args.epochs
        deadline = time.monotonic() + 600
        while not any(e >= last for _, e in run.step_times()):
            if run.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job did not reach epoch {last}: {run.log()[-1500:]}")
            time.sleep(0.3)
        return epochs_rate(run.step_times(), 1, last)


def epochs_rate(times: list[tuple[float, int]], first: int, last: int) -> float:
    """Steps/s over epochs first..last-1: their steps over the time from epoch first's first
    step to epoch last's first step."""
    steps = sum(1 for _, e in times if first <= e < last)
    begin = min(t for t, e in times if e == first)
    end = min(t for t, e in times if e == last)
    return steps / (end - begin) if end > begin else 0.0


def advise(p: Pipeline, args) -> dict:
    with Run(p, p.start, args, duration=600) as run:
        run.wait_ready()
        run.second_epoch()  # watched as a user attaches to a job that runs, not one that starts
        r = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", str(run.proc.pid), "--duration",
                            str(args.snapshot), "--json"], capture_output=True, text=True,
                           timeout=args.snapshot + 120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0:
        raise RuntimeError(f"loadertop snapshot failed: {r.stderr.strip()[-500:]}")
    report = json.loads(r.stdout)
    trainer = report["trainers"][0] if report["trainers"] else {}
    plan = trainer.get("plan") or {}
    change, conflicts = merged_change(report)
    return {"verdict": report["verdict"], "change_line": plan.get("change"),
            "predicted_gain": plan.get("predicted_gain"), "change": change, "conflicts": conflicts,
            "findings": [f["id"] for f in report["findings"]],
            "workers_seen": len(trainer.get("workers") or [])}


def apply(s: Setting, change: dict) -> Setting:
    """The setting after loadertop's change, as its sections say it."""
    loader = {**(change.get("DataLoader") or {}), **{k.removeprefix("dataloader_"): v for k, v in
                                                     (change.get("TrainingArguments") or {}).items()}}
    out = s
    if "num_workers" in loader:
        out = replace(out, workers=int(loader["num_workers"]))
    env = change.get("env") or {}
    if "OMP_NUM_THREADS" in env:
        out = replace(out, threads=int(env["OMP_NUM_THREADS"]))
    script = str(change.get("script") or "")
    if script.startswith("torch.set_num_threads("):
        out = replace(out, main_threads=int(script.removeprefix("torch.set_num_threads(").rstrip(")")))
    return out


def noise(values: list[float]) -> float:
    return 2 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def interleaved(p: Pipeline, a: Setting, b: Setting, args) -> dict:
    """B over A, round by round; A first in even rounds, B first in odd ones."""
    rates: dict[Setting, list[float]] = {a: [], b: []}
    ratios = []
    for rnd in range(args.rounds):
        for s in ((a, b) if rnd % 2 == 0 else (b, a)):
            rates[s].append(measure(p, s, args))
        ratios.append(rates[b][-1] / rates[a][-1] if rates[a][-1] else float("nan"))
    return {"ratios": ratios, "ratio": statistics.mean(ratios), "noise": noise(ratios),
            "rates": {a.label(): rates[a], b.label(): rates[b]}}


def tuned(p: Pipeline, args) -> dict:
    with Run(p, p.start, args, tune=True, duration=args.tune_seconds) as run:
        run.wait_ready()
        run.proc.wait(timeout=args.tune_seconds + 300)
        times = run.step_times()
        epochs = run.epoch_rows()
        said = [line for line in run.log().splitlines() if "loadertop" in line.lower()]
    seen = sorted({e for _, e in times})
    # Its last third of whole epochs (each from its first step to the next epoch's first).
    last = seen[-1 - max(2, len(seen) // 3):-1]
    rate = epochs_rate(times, last[0], seen[-1]) if len(last) >= 2 else 0.0
    return {"rate": rate, "last_epochs": last, "epochs": len(epochs),
            "repeated": sum(e["items"] - e["unique"] for e in epochs),
            "lost": sum(e["expected"] - e["unique"] for e in epochs),
            "workers": [e["workers"] for e in epochs], "said": said[-40:]}


def run_pipeline(p: Pipeline, args) -> dict:
    out: dict = {"pipeline": p.name, "start": p.start.label()}
    out["advice"] = advice = advise(p, args)
    b = apply(p.start, advice["change"])
    out["applied"] = b.label()
    rates: dict[str, float] = {}
    if b != p.start:
        out["ab"] = ab = interleaved(p, p.start, b, args)
        rates.update({k: statistics.mean(v) for k, v in ab["rates"].items()})
    grid = [Setting(w) for w in (1, 2, 4)]  # torch's own threads (OMP_NUM_THREADS=1 where B asks it)
    for s in grid:
        if s.label() not in rates:
            rates[s.label()] = measure(p, s, args)
    out["fixed"] = rates
    out["best"] = best = max(rates, key=lambda k: rates[k])
    out["tuned"] = t = tuned(p, args)
    out["tuned_of_best"] = t["rate"] / rates[best] if rates[best] else float("nan")
    return out


def table(rows: list[dict]) -> str:
    lines = ["| pipeline | verdict | change (predicted) | A/B: B over A ± noise | best fixed | tuned / best "
             "| items repeated, lost |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["advice"]
        gain = f" ({a['predicted_gain']:+.0%})" if a.get("predicted_gain") is not None else ""
        ab = r.get("ab")
        ab_text = f"{ab['ratio']:.2f} ± {ab['noise']:.2f}" if ab else "no change"
        t = r["tuned"]
        lines.append(f"| {r['pipeline']} {r['start']} | {a['verdict']} | {a['change_line'] or 'none'}{gain} "
                     f"| {ab_text} | "
                     f"{r['best']} {r['fixed'][r['best']]:.2f}/s | {r['tuned_of_best']:.2f} ({t['rate']:.2f}/s) | "
                     f"{t['repeated']}, {t['lost']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", default="timm,hf,wds")
    ap.add_argument("--timm-python", default=sys.executable)
    ap.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "loadertop-pipelines-data"))
    ap.add_argument("--epochs", type=int, default=2, help="whole epochs measured a run, after the first")
    ap.add_argument("--snapshot", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tune-seconds", type=float, default=150.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    starts = {"timm": Pipeline("timm", Setting(4), args.timm_python), "hf": Pipeline("hf", Setting(2), sys.executable),
              "wds": Pipeline("wds", Setting(4), sys.executable)}
    rows = []
    for name in args.pipelines.split(","):
        p = starts[name]
        subprocess.run([p.python, str(JOBS), "--pipeline", name, "--data", args.data, "--prepare", "--log", "/dev/null",
                        "--epochs-log", "/dev/null", "--ready", "/dev/null"], check=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        began = time.monotonic()
        row = run_pipeline(p, args)
        row["bench_s"] = round(time.monotonic() - began)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
