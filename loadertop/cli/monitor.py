"""The live view: a job's PIDs, the picker, the demo, and a recording replayed."""

from __future__ import annotations

import argparse
import sys

from .arguments import UsageError, check_pids
from .report_files import read_recording


def require_terminal() -> None:
    """Checked before anything starts sampling, so a refusal leaves nothing behind."""
    if not sys.stdout.isatty():
        raise UsageError("the live view needs a terminal; use `loadertop snapshot PID --json` in scripts")


def run_tui(source, on_exit=None, connect=None) -> int:
    try:
        from ..tui.app import LoadertopApp
    except ImportError as e:  # textual missing in a broken install
        raise UsageError(f"the live view needs textual ({e}); pip install textual") from None
    LoadertopApp(source, on_exit=on_exit, connect=connect).run()
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    check_pids(args.pids)  # a PID that cannot be watched is the first thing to say
    require_terminal()
    from ..tui.source import LiveSource

    def connect(pids: list[int]) -> LiveSource:
        return LiveSource(pids, interval_s=args.interval, stacks=not args.no_stacks)

    if not args.pids:  # the picker attaches with the same options
        return run_tui(None, connect=connect)
    return run_tui(connect(args.pids))


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import start_job, stop_job
    from ..tui.source import LiveSource

    require_terminal()
    proc, note = start_job(args.scenario, tune=args.tune)
    if note:
        print(f"loadertop: {note}", file=sys.stderr)
    try:
        return run_tui(LiveSource([proc.pid], interval_s=args.interval), on_exit=lambda: stop_job(proc))
    finally:
        stop_job(proc)


def cmd_replay(args: argparse.Namespace) -> int:
    from ..tui.source import ScriptedSource

    require_terminal()
    recording = read_recording(args.recording)
    snaps = recording.snapshots
    interval = snaps[-1].interval_s if snaps else 1.0
    return run_tui(ScriptedSource(snaps, interval_s=interval / args.speed, judged=recording.judged))
