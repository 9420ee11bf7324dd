"""`loadertop fleet`: every job the node agents report to Prometheus, joined across nodes."""

from __future__ import annotations

import argparse
import sys

from .arguments import UsageError
from .report_files import by_extension, check_output


def cmd_fleet(args: argparse.Namespace) -> int:
    import json

    from ..outputs import fleet
    from ..outputs.report import write_file
    from ..probes.prometheus import FleetError, Prometheus

    if args.output:
        check_output(args.output, (".json", ".md", ".html"))
    try:
        prometheus = Prometheus(args.prometheus, timeout_s=args.timeout)
        if not args.json and not args.output and sys.stdout.isatty() and sys.stdin.isatty():
            prometheus.query("vector(1)")  # a wrong address is one line here, not a screen of n/a
            from ..tui.fleet_view import FleetApp

            FleetApp(prometheus, interval_s=args.interval).run()
            return 0
        report = fleet.read(prometheus, job=args.job, ended=args.ended)
    except FleetError as e:
        raise UsageError(str(e)) from None
    if args.job is not None and not report["jobs"]:
        raise UsageError(f"--job {args.job!r}: Prometheus has no ranks of that job in the last {fleet.LOOKBACK}; "
                         "`loadertop fleet --prometheus URL` lists the jobs it has")
    text = json.dumps(report, indent=2) + "\n"
    if args.output:
        write_file(args.output, by_extension(args.output, text, report, fleet.render_md, fleet.render_html))
        print(f"loadertop: fleet report written to {args.output}", file=sys.stderr)
    if args.json:
        sys.stdout.write(text)
    elif not args.output:
        sys.stdout.write(fleet.render_text(report))
    return 0
