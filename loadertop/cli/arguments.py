"""Arguments: the parser of every command, the checks of each value, and the one-line usage error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..tui import LIVE_INTERVAL_S

SUBCOMMANDS = ("snapshot", "demo", "record", "replay", "diff", "export", "fleet", "tune")


MONITOR_USAGE = "loadertop [PID ...] [--interval S] [--no-stacks]"


MONITOR_DESCRIPTION = """Watch training jobs live: give the PID of a training script or of its launcher
(torchrun, accelerate launch, a shell), and loadertop finds its ranks and DataLoader
workers; with no PID, pick one from a list."""


EXAMPLES = """examples:
  loadertop 41822                           watch job 41822 live: its workers, data wait, findings
  loadertop snapshot 41822 -o report.html   sample it 10 s and write a report to share
  loadertop demo                            start a built-in starved job and watch it (q quits)"""


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


def pid_arg(text: str) -> int:
    # ASCII digits only: int() also reads other scripts' digits ("١٢٣" is 123).
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a PID: {text!r} (give a number in digits 0-9, e.g. 41822)")
    pid = int(text)
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r} (PIDs are positive)")
    return pid


def count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def int_list_arg(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"need whole numbers >= 0, e.g. 0,2,4: {text!r}")
    return values


LONGEST_S = 365 * 24 * 3600.0


def percent_arg(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (e.g. 10 for 10 %)") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage is between 0 and 100: {text!r}")
    return value


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value <= LONGEST_S:  # inf, nan, or years
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, at most a year: {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


# Floors below which a run would never end or spin: a tick every 0.1 s is already ten times
# what the live view needs; replay at a hundredth of real time is a frame every few minutes.
MIN_INTERVAL_S = 0.1


MIN_SPEED = 0.01


def interval_arg(text: str) -> float:
    value = seconds_arg(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL_S:g} seconds: {text!r}")
    return value


def speed_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (1 is real time, 2 twice as fast)") from None
    if not MIN_SPEED <= value <= 1e6:  # nan, inf, a crawl that never ends
        raise argparse.ArgumentTypeError(f"must be between {MIN_SPEED:g} and 1000000 times real time: {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="loadertop",
        usage=f"{MONITOR_USAGE}\n       loadertop COMMAND [ARGS ...]",
        description="Live monitor for the input pipeline (DataLoader) of PyTorch training jobs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # -h goes under "other options", after the live view and the commands
    )
    # The live view comes first, as the main use: main() hands PIDs to monitor_parser(), and
    # these are its options, shown here so that the first `--help` a new user reads has them.
    live = p.add_argument_group("the live view (the main use)", MONITOR_DESCRIPTION)
    monitor_arguments(live, pids=False)
    sub = p.add_subparsers(dest="command", parser_class=Parser, title="commands", metavar="COMMAND", prog="loadertop")
    other = p.add_argument_group("other options")
    other.add_argument("-h", "--help", action="help", help="show this help and exit")
    other.add_argument("--version", action="version", version=f"loadertop {__version__}")

    snap = sub.add_parser("snapshot", help="sample jobs for a while and write a report")
    snap.add_argument("pids", nargs="*", type=pid_arg, metavar="PID")
    snap.add_argument("--from", dest="recording", metavar="FILE", help="report on a recording instead")
    snap.add_argument("--duration", type=seconds_arg, default=10.0, help="seconds to sample (10)")
    snap.add_argument("--interval", type=interval_arg, default=1.0, help="seconds per tick (1)")
    snap.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    snap.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (.json, .md or .html)")
    snap.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")

    rec = sub.add_parser("record", help="record snapshots to a file, for replay and reports")
    rec.add_argument("pids", nargs="+", type=pid_arg, metavar="PID")
    rec.add_argument("-o", "--output", metavar="FILE", required=True, help="the recording to write")
    rec.add_argument("--duration", type=seconds_arg, default=None, help="seconds to record (until Ctrl-C)")
    rec.add_argument("--interval", type=interval_arg, default=1.0, help="seconds per tick (1)")
    rec.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")

    exp = sub.add_parser("export", help="serve Prometheus metrics of the jobs")
    exp.add_argument("pids", nargs="*", type=pid_arg, metavar="PID")
    exp.add_argument("--all", action="store_true",
                     help="the node agent: every training job on this host, found as it starts, dropped when it ends")
    exp.add_argument("--no-worker-series", action="store_true",
                     help="no per-worker series (a large node): trainers' and main processes' only")
    exp.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT (127.0.0.1:9464; all interfaces: 0.0.0.0)")
    exp.add_argument("--interval", type=interval_arg, default=5.0, help="seconds per tick (5)")
    exp.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")
    exp.add_argument("--job-names", action="store_true",
                     help="serve the job names read from other users' environments (run and Slurm ids, rendezvous "
                          "addresses) as they are; without it they are digests, which still join a job's ranks")

    fleet = sub.add_parser("fleet", help="every job the node agents report to Prometheus, joined across nodes")
    fleet.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus server, http://host:9090")
    fleet.add_argument("--json", action="store_true", help="print the loadertop.fleet/1 report as JSON")
    fleet.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (.json, .md or .html)")
    fleet.add_argument("--job", metavar="NAME", help="that job only (its train_job label), with each rank's "
                       "data wait over the last 30 minutes")
    fleet.add_argument("--ended", action="store_true", help="list the jobs that ended in the last 10 minutes too")
    fleet.add_argument("--timeout", type=seconds_arg, default=5.0, help="seconds a query may take (5)")
    fleet.add_argument("--interval", type=interval_arg, default=10.0,
                       help="seconds between reads in the live view (10)")

    dif = sub.add_parser("diff", help="one job before and after a change: what changed and what it did")
    dif.add_argument("before", metavar="BEFORE", help="a report (snapshot --json / -o .json) or a recording")
    dif.add_argument("after", metavar="AFTER", help="the same job's, after the change")
    dif.add_argument("--json", action="store_true", help="print the loadertop.diff/1 report as JSON")
    dif.add_argument("-o", "--output", metavar="FILE", help="write the diff to FILE (.json, .md or .html)")
    dif.add_argument("--fail-if-slower", type=percent_arg, metavar="PCT", default=None,
                     help="exit 1 where steps/s fell by more than PCT %% and past the noise (for CI)")

    rep = sub.add_parser("replay", help="watch a recording in the live view")
    rep.add_argument("recording", metavar="FILE")
    rep.add_argument("--speed", type=speed_arg, default=1.0, help="times real time (1)")

    tune = sub.add_parser("tune", help="measure the best DataLoader settings for your own dataset")
    tune.add_argument("factory", metavar="MODULE:FACTORY",
                      help="a callable returning your Dataset, (dataset, kwargs) or {'dataset': ..., **kwargs}; "
                           "module.path:name or path/to/file.py:name")
    tune.add_argument("--batch-size", type=count_arg, default=None, help="batch size (the factory's, else 1)")
    tune.add_argument("--collate", metavar="MODULE:FN", help="a collate_fn to use")
    tune.add_argument("--budget", type=seconds_arg, default=90.0, help="seconds for the whole tune (90)")
    tune.add_argument("--workers", type=int_list_arg, default=None,
                      help="num_workers to try, e.g. 0,2,4,8 (0, powers of two up to 2x this job's CPUs)")
    tune.add_argument("--prefetch", type=int_list_arg, default=[2, 4], help="prefetch_factor values to try (2,4)")
    tune.add_argument("--pin-memory", choices=["auto", "on", "off"], default="auto",
                      help="auto: try pinning where CUDA is available")
    tune.add_argument("--per-step-ms", type=seconds_arg, default=None,
                      help="emulate a training step this long (the GPU works, CPUs stay free): report data wait")
    tune.add_argument("--first-batch-timeout", type=seconds_arg, default=60.0,
                      help="seconds a setting may take to its first batch (60)")
    tune.add_argument("--python", default=sys.executable, help="the interpreter with your torch and code")
    tune.add_argument("-o", "--output", metavar="FILE", help="also write the result to FILE (.json, .md or .html)")

    demo = sub.add_parser("demo", help="start a built-in training job and watch it")
    from ..demo import SCENARIOS

    demo.add_argument("--scenario", choices=sorted(SCENARIOS), default="starved",
                      help="; ".join(f"{k}: {v[0]}" for k, v in SCENARIOS.items()))
    demo.add_argument("--interval", type=interval_arg, default=LIVE_INTERVAL_S,
                      help=f"seconds per tick ({LIVE_INTERVAL_S:g})")
    demo.add_argument("--tune", action="store_true",
                      help="the job watches its loader with tune=True and short epochs: watch the tuner fix it in "
                           "place")
    return p


def monitor_parser() -> argparse.ArgumentParser:
    p = Parser(prog="loadertop", usage=MONITOR_USAGE, description=MONITOR_DESCRIPTION, epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    monitor_arguments(p, pids=True)
    return p


def monitor_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, pids: bool) -> None:
    """The live view's arguments: parsed by monitor_parser(), shown first by `loadertop --help`."""
    if pids:
        p.add_argument("pids", nargs="*", type=pid_arg, metavar="PID", help="training scripts or launchers to watch")
    p.add_argument("--interval", type=interval_arg, default=LIVE_INTERVAL_S, metavar="S",
                   help=f"seconds per tick ({LIVE_INTERVAL_S:g})")
    p.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")


def check_pids(pids: Sequence[int]) -> None:
    """Each PID can be watched, else the one line that says why: the first thing to say."""
    from ..probes.discovery import why_not_watchable

    for pid in pids:
        why = why_not_watchable(pid)
        if why is not None:
            raise UsageError(why)
