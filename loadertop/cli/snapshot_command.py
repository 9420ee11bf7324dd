"""`loadertop snapshot`: sample jobs for a while (or read a recording) and report."""

from __future__ import annotations

import argparse
import sys

from .arguments import UsageError, check_pids
from .report_files import check_output, read_recording, render, report_of_recording, report_of_snapshots, write_report


def cmd_snapshot(args: argparse.Namespace) -> int:
    from ..outputs import summary
    from ..outputs.report import to_json

    if args.output:
        check_output(args.output)
    if args.recording:
        if args.pids:
            raise UsageError("give either PIDs or --from FILE, not both")
        recording = read_recording(args.recording)
        snapshots = recording.snapshots
        report = report_of_recording(snapshots, recording.judged)
        interrupted = False
    else:
        if not args.pids:
            raise UsageError("which job? give its PID (`loadertop` lists them) or --from a recording")
        snapshots, interrupted = sample_for_snapshot(args)
        report = report_of_snapshots(snapshots, args.duration)
    if not args.recording and summary.ended(snapshots):
        # The job ended while it was watched: what it did over the run, in the terminal too.
        sys.stderr.write(summary.render(report_of_recording(snapshots), True))
    status = 0
    if args.output:
        status = write_report(args.output, render(args.output, report, snapshots))
    if args.json or (not args.output and not sys.stdout.isatty()):
        sys.stdout.write(to_json(report))  # JSON for scripts, pipes and files
    elif not args.output:
        from ..outputs import report_text

        sys.stdout.write(report_text.render(report))  # a person at a terminal: the answer first
    return status or (130 if interrupted else 0)


def sample_for_snapshot(args: argparse.Namespace):
    from ..probes.processes import ProcessSampler
    from ..sampler import History, Sampler, run_ticks

    check_pids(args.pids)
    stacks = None
    if not args.no_stacks:
        from ..probes.stacks import StackSampler, snapshot_profile

        stacks = StackSampler.of(snapshot_profile(args.duration))
    # A snapshot is short and its report should be complete: it reads smaps (USS/PSS) four
    # times as often as the live monitor, within ten times its budget per tick.
    processes = ProcessSampler(slow_interval_s=3.0, slow_budget_s=0.05)
    sampler = Sampler(args.pids, interval_s=args.interval, stacks=stacks, processes=processes)
    history = History()

    def collect_last_window() -> None:
        if stacks is not None:
            stacks.stop_after_window()
            stacks.flush(timeout=stacks.window_s + 15)

    interrupted = False
    try:
        run_ticks(sampler, args.duration, history.append, collect_last_window)
    except KeyboardInterrupt:
        interrupted = True  # report what was sampled
    finally:
        sampler.close()
    if not len(history):
        raise UsageError("interrupted before the first sample; nothing to report")
    return list(history), interrupted
