"""One answer per job, measured (issue 41): the advice bench's jobs, each quiet and beside a CPU
hog that keeps two more runnable processes busy (busy loops of a fixed loop count per pass,
started by this bench).

Per job and host state:
- snapshots: --snapshots runs of `loadertop snapshot --duration S`: their verdict classes
  (the verdict without its figure) and how many times the class changed from one to the next;
- live: the live view's judgement (a LiveSource, in this process, as the TUI drives it) for
  --live seconds at --interval ticks, recorded: the verdict-class changes after the first
  confirmed verdict, and the invariants broken (rules/invariants.py, checked at every tick);
- views: on that recording, the verdict of the live header at its last tick at work, `replay`
  stepped there, `snapshot --from`, the summary, `diff` (the recording with itself) and the
  exporter fed the same snapshots: how many give the live header's verdict (goal 6 of 6);
- with --ab on the busy host: 1 and 2 workers measured interleaved (--ab rounds of --seconds),
  beside what loadertop's plan said of a second worker;
- with --cost N (quiet host only): the answer's own cost, N interleaved rounds of one job run
  unwatched, then watched by a `loadertop snapshot` of --seconds, each measured by the job's own
  log over the same seconds; the watched/unwatched ratio per round (goal >= 0.97 on a job that
  leaves no CPU idle: pick one, e.g. cpu_bound with --cost-workers 2 on 2 CPUs).

--same-session starts the job in this bench's session, beside the hog (one scheduling group on a
host with autogroups: there a 2nd worker takes CPU from the hog); by default the job runs in a
session of its own, as launchers start jobs (there it has its group's share already).

Run: python bench/consistency.py [--cases cpu_bound,io_bound,healthy] [--snapshot 20]
     [--live 60] [--ab 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from advice import Run, cases, clear_quota, set_quota  # noqa: E402

from loadertop import cli  # noqa: E402
from loadertop.demo.job import calibrate  # noqa: E402
from loadertop.outputs import summary  # noqa: E402
from loadertop.outputs.export import Exporter  # noqa: E402
from loadertop.outputs.record import Recorder  # noqa: E402
from loadertop.rules import Diagnoser  # noqa: E402
from loadertop.rules.diagnosis import kind_of  # noqa: E402
from loadertop.tui.source import LiveSource, ScriptedSource  # noqa: E402

HOG = "import sys\nn = int(sys.argv[1])\nwhile True:\n    x = 0\n    for i in range(n):\n        x += i\n"


class Hog:
    """Two busy processes, each a fixed loop count per pass (never a spin to a deadline).

    Started detached (their parent a shell that exits at once): loadertop counts its own
    children's CPU as its own load, not the host's, and the live view runs in this process. As
    this process's children the hog was invisible to the live view (others 0.0 CPUs), which then
    said INPUT-BOUND where a `loadertop snapshot` (another process) said BUSY HOST."""

    def __init__(self, n: int = 2) -> None:
        self.pids = [detached([sys.executable, "-c", HOG, "1000000"]) for _ in range(n)]

    def close(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def detached(cmd: list[str]) -> int:
    """Start cmd with no parent here (a shell starts it in the background and exits): its pid."""
    sh = subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *cmd],
                        capture_output=True, text=True, check=True)
    return int(sh.stdout.strip())


def first_trainer(run, timeout: float = 60.0) -> int:
    """The trainer's pid, from its truth file (written a little after its first batch)."""
    deadline = time.monotonic() + timeout
    while not (pids := run.trainer_pids()):
        if time.monotonic() > deadline:
            raise RuntimeError("the job wrote no truth file")
        time.sleep(0.2)
    return pids[0]


def classes(words: list[str]) -> int:
    """How many times the verdict class changed along the list."""
    kinds = [kind_of(w) for w in words]
    return sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != b)


def snapshots(target: int, args) -> tuple[list[str], list[str]]:
    """Each snapshot's verdict, and the change its plan names (with its predicted gain)."""
    said, changes = [], []
    for _ in range(args.snapshots):
        r = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", str(target), "--duration",
                            str(args.snapshot), "--json"], capture_output=True, text=True,
                           timeout=args.snapshot + 120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        if r.returncode != 0:
            said.append(f"ERROR {r.stderr.strip()[-80:]}")
            changes.append("")
            continue
        report = json.loads(r.stdout)
        said.append(report["verdict"])
        plan = (report["trainers"][0].get("plan") or {}) if report["trainers"] else {}
        gain = plan.get("predicted_gain")
        changes.append(f"{plan.get('change')}" + (f" {gain:+.0%}" if plan.get("change") and gain is not None else ""))
    return said, changes


def live(target: int, args, path: str) -> dict:
    """The live view's judgement, tick by tick, recorded to path."""
    source = LiveSource([target], interval_s=args.interval)
    recorder = Recorder(path)
    said: list[tuple[str, bool]] = []
    broken: list[str] = []
    try:
        start = time.monotonic()
        while time.monotonic() - start < args.live:
            tick = time.monotonic()
            snap, diagnosis = source.next()
            recorder.write(snap)
            running = [t for t in snap.trainers if t.status == "running"]
            if running:
                # The answer the header gives: the job's, for a job of several ranks.
                v = diagnosis.verdict(running[0])
                job = diagnosis.job_verdicts.get(running[0].job)
                said.append((job.text if job is not None else v.text, v.provisional or v.measuring))
            broken += [n.message for n in diagnosis.notices if n.id == "invariant_broken"]
            time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
    finally:
        source.close()
        recorder.close()
    confirmed = [w for w, unsure in said if not unsure]
    return {"ticks": len(said), "first_confirmed": confirmed[0] if confirmed else None,
            "last": said[-1][0] if said else None, "changes_after_confirmed": classes(confirmed),
            "invariants_broken": sorted(set(broken))}


def views(path: str) -> dict:
    """The verdict each view gives of one recording, at its last tick at work."""
    snaps = cli.read_recording(path).snapshots
    at_work = summary.while_running(snaps)
    header = Diagnoser()
    for s in at_work:
        header.feed(s)
    t = at_work[-1].trainers[0]
    rec = cli.read_recording(path)

    def answer(diagnosis) -> str:
        """The header's answer: the job's verdict for a job of several ranks, else the trainer's."""
        job = diagnosis.job_verdicts.get(t.job)
        return job.text if job is not None else diagnosis.verdict(t).text

    said = {"live header": answer(header.diagnosis)}
    _, replayed = ScriptedSource(snaps, judged=rec.judged).seek(len(at_work))
    said["replay"] = answer(replayed)
    report = cli.report_of_recording(snaps, rec.judged)
    said["snapshot --from"] = report["verdict"]
    text = summary.render(report, summary.ended(snaps))
    said["summary"] = next((line.split("**")[1] for line in text.splitlines()
                            if "The job's verdict" in line or "Last verdict" in line), "")
    # diff and the exporter show each rank's own verdict: compared with the live view's for the rank.
    rank_said = header.diagnosis.verdict(t).text
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "diff.json"
        subprocess.run([sys.executable, "-m", "loadertop", "diff", path, path, "-o", str(out)], check=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True)
        rows = [r for r in json.loads(out.read_text())["trainers"] if r.get("pid_after") == t.pid]
        said["diff"] = (rows or json.loads(out.read_text())["trainers"])[0]["verdict_after"]

    class Replay:
        def __init__(self) -> None:
            self.left = list(at_work)

        def tick(self):
            return self.left.pop(0)

        def close(self) -> None:
            pass

    exporter = Exporter(Replay())
    for _ in at_work:
        exporter.sample_once()
    said["exporter"] = exporter.diagnoser.diagnosis.verdict(t).text
    agree = sum(1 for k, v in said.items() if v == (rank_said if k in ("diff", "exporter") else said["live header"]))
    return {"said": said, "rank": rank_said, "agree": agree, "of": len(said)}


def ab(case, args) -> dict:
    """1 and 2 workers, interleaved rounds on the busy host: steps/s of each, their ratio."""
    from dataclasses import replace

    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.ab):
        for workers in (1, 2):
            with Run(case, replace(case.start, workers=workers), args.work_per_ms, args.seconds + 30,
                     own_session=not args.same_session) as run:
                run.wait_ready()
                start = time.time() + 3.0
                time.sleep(3.0 + args.seconds + 0.5)
                rates[workers].append(run.steps_per_s(start, start + args.seconds))
    ratios = [b / a for a, b in zip(rates[1], rates[2], strict=True) if a > 0]
    return {"w1": rates[1], "w2": rates[2], "ratios": [round(r, 3) for r in ratios]}


def cost(case, args) -> dict:
    """Watched against unwatched, interleaved within one run of the job (its speed drifts from
    run to run more than the cost to measure): an unwatched stretch, a stretch watched by a
    `loadertop snapshot`, another unwatched one; the watched one against the mean of the two."""
    from dataclasses import replace

    setting = replace(case.start, workers=args.cost_workers or case.start.workers)
    ratios = []
    per_round = 3 * (args.seconds + 15)
    with Run(case, setting, args.work_per_ms, args.cost * per_round + 60, own_session=not args.same_session) as run:
        run.wait_ready()
        time.sleep(3.0)
        target = run.trainer_pids()[0]
        for _ in range(args.cost):
            spans = []
            for watched in (False, True, False):
                start = time.time()
                if watched:
                    subprocess.run([sys.executable, "-m", "loadertop", "snapshot", str(target), "--duration",
                                    str(args.seconds), "--json"], capture_output=True, timeout=args.seconds + 120,
                                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
                else:
                    time.sleep(args.seconds)
                spans.append((start, time.time()))
                time.sleep(2.0)  # loadertop gone, its py-spy reaped
            time.sleep(0.6)
            before, during, after = (run.steps_per_s(a, b) for a, b in spans)
            if before > 0 and after > 0:
                ratios.append(round(during / ((before + after) / 2), 3))
    return {"case": case.name, "setting": setting.label(), "ratios": ratios}


def run_case(case, busy: bool, args) -> dict:
    hog = Hog() if busy else None
    try:
        with Run(case, case.start, args.work_per_ms, args.snapshots * (args.snapshot + 15) + args.live + 120,
                 own_session=not args.same_session) as run:
            run.wait_ready()
            target = run.proc.pid if case.ranks else first_trainer(run)
            with tempfile.TemporaryDirectory() as d:
                path = str(Path(args.keep or d) / f"{case.name}-{'busy' if busy else 'quiet'}.ltrec")
                watched = live(target, args, path)
                seen = views(path)
            shots, changes = snapshots(target, args)
        row = {"case": case.name, "host": "busy" if busy else "quiet", "snapshots": shots, "changes": changes,
               "snapshot_changes": classes(shots), **watched, "views": seen}
        if busy and args.ab and case.name != "healthy":
            row["ab"] = ab(case, args)
        return row
    finally:
        if hog is not None:
            hog.close()


def table(rows: list[dict]) -> str:
    out = ["| job | host | snapshots | their change | class changes | live: first confirmed | live: changes after | "
           "invariants broken | views agreeing | 2 workers / 1 (busy) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratios = r.get("ab", {}).get("ratios")
        out.append(f"| {r['case']} | {r['host']} | {' · '.join(r['snapshots'])} | {' · '.join(r['changes'])} | "
                   f"{r['snapshot_changes']} | "
                   f"{r['first_confirmed']} | {r['changes_after_confirmed']} | {len(r['invariants_broken'])} | "
                   f"{r['views']['agree']} of {r['views']['of']} | {', '.join(map(str, ratios)) if ratios else ''} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="cpu_bound,io_bound,healthy", help="comma-separated advice-bench cases")
    p.add_argument("--hosts", default="quiet,busy", help="quiet, busy or both")
    p.add_argument("--snapshots", type=int, default=3, help="snapshots per job (3)")
    p.add_argument("--snapshot", type=float, default=20.0, help="seconds each snapshot samples (20)")
    p.add_argument("--live", type=float, default=60.0, help="seconds of the live view (60)")
    p.add_argument("--interval", type=float, default=0.5, help="the live view's tick (0.5 s)")
    p.add_argument("--ab", type=int, default=0, help="rounds of 1 vs 2 workers on the busy host (0: none)")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds each A/B run is measured (20)")
    p.add_argument("--same-session", action="store_true", help="the job in this bench's session, beside the hog")
    p.add_argument("--cost", type=int, default=0, help="rounds of watched against unwatched (0: none)")
    p.add_argument("--cost-workers", type=int, default=0, help="workers for the cost runs (0: the case's own)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--keep", help="keep the live views' recordings in this folder")
    args = p.parse_args()
    args.work_per_ms = calibrate()
    chosen = [c for c in cases() if c.name in args.cases.split(",")]
    if args.cost:
        costs = [cost(case, args) for case in chosen]
        for c in costs:
            print(json.dumps(c), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(costs, indent=2))
        return 0
    rows = []
    for case in chosen:
        for host in args.hosts.split(","):
            if case.quota_cpus:
                set_quota(case.quota_cpus)
            try:
                rows.append(run_case(case, host == "busy", args))
            finally:
                if case.quota_cpus:
                    clear_quota()
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
