"""`loadertop record`: snapshots to a file, each with its judgement, and the run's summary beside it."""

from __future__ import annotations

import argparse
import os
import sys

from ..text import count
from .arguments import UsageError, check_pids
from .report_files import check_output, report_of_recording


def cmd_record(args: argparse.Namespace) -> int:
    from ..outputs import judgement
    from ..outputs.record import Recorder
    from ..rules import Diagnoser
    from ..sampler import Sampler, run_ticks

    check_pids(args.pids)
    check_output(args.output, formats=())
    stacks = None
    if not args.no_stacks:
        from ..probes.stacks import RECORDING, StackSampler

        stacks = StackSampler.of(RECORDING)
    sampler = Sampler(args.pids, interval_s=args.interval, stacks=stacks)
    try:
        recorder = Recorder(args.output)
    except OSError as e:
        sampler.close()
        raise UsageError(f"cannot write {args.output!r}: {e.strerror}") from None
    print(f"loadertop: recording to {args.output} (Ctrl-C stops)", file=sys.stderr)
    # The summary is made from the snapshots as they were written, kept here: never read back
    # by path (in a folder another user can write to, a FIFO swapped in hung root's `record`,
    # and a forged file got summarised).
    written: list = []
    # Each tick is judged as the live view judges it, and the judgement stored beside it: every
    # view of the recording shows what was judged then (outputs/judgement.py).
    diagnoser = Diagnoser()
    judged: list = []

    def write(snap) -> None:
        diagnoser.feed(snap)
        recorder.write(snap, judgement.encode(diagnoser.diagnosis))
        written.append(snap)
        judged.append(diagnoser.diagnosis)

    try:
        run_ticks(sampler, args.duration if args.duration else float("inf"), write)
    except KeyboardInterrupt:
        pass
    finally:
        sampler.close()
        recorder.close()
    print(f"loadertop: {count(recorder.written, 'snapshot')} in {args.output}", file=sys.stderr)
    if written:
        write_summary(args.output, written, judged)
    return 0


def write_summary(recording: str, snapshots: list, judged: list) -> None:
    """The run's summary, printed and written beside the recording (FILE.summary.md)."""
    from ..outputs import summary
    from ..outputs.report import write_file

    text = summary.render(report_of_recording(snapshots, judged), summary.ended(snapshots), recording=recording)
    sys.stderr.write(text)
    path = os.path.splitext(recording)[0] + ".summary.md"
    try:
        write_file(path, text)
    except OSError as e:
        print(f"loadertop: cannot write the summary {path!r}: {e.strerror}", file=sys.stderr)
        return
    print(f"loadertop: summary written to {path}", file=sys.stderr)
