"""Command line: one module per command (`NAME_command.py` for snapshot, record, export, fleet,
diff and tune; the live view, the demo and replay in monitor.py), their arguments in
arguments.py, the files they read and write in report_files.py. Textual is imported only on the
TUI path.

A new command: its parser in arguments.parser(), its body in a module of its own, its line in
COMMANDS below."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from .arguments import SUBCOMMANDS, UsageError, monitor_parser, parser
from .diff_command import cmd_diff
from .export_command import cmd_export
from .fleet_command import cmd_fleet
from .monitor import cmd_demo, cmd_monitor, cmd_replay
from .record_command import cmd_record
from .report_files import read_recording, report_of_recording, report_of_snapshots
from .snapshot_command import cmd_snapshot, sample_for_snapshot
from .tune_command import cmd_tune

__all__ = ["UsageError", "main", "read_recording", "report_of_recording", "report_of_snapshots", "sample_for_snapshot"]

COMMANDS = {"snapshot": cmd_snapshot, "demo": cmd_demo, "record": cmd_record, "replay": cmd_replay,
            "export": cmd_export, "tune": cmd_tune, "fleet": cmd_fleet, "diff": cmd_diff}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The restore of SIGPIPE's default lets `loadertop snapshot --json | head` end quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        if argv and argv[0] in SUBCOMMANDS or argv[:1] in (["-h"], ["--help"], ["--version"]):
            args = parser().parse_args(argv)
            return COMMANDS[args.command](args)
        if argv and not argv[0].startswith("-") and not argv[0].isdigit():
            raise UsageError(f"unknown command {argv[0]!r}: use a PID, or one of {', '.join(SUBCOMMANDS)}")
        return cmd_monitor(monitor_parser().parse_args(argv))
    except UsageError as e:
        print(f"loadertop: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
