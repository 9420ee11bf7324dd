"""`loadertop diff`: one job before and after a change."""

from __future__ import annotations

import argparse
import os
import sys

from .arguments import UsageError
from .report_files import by_extension, check_output, report_of, write_report


def cmd_diff(args: argparse.Namespace) -> int:
    import json

    from ..outputs import diff
    from ..text import printable, printable_tree

    if args.output:
        check_output(args.output)
    # Every string of a report file is its author's: printable before anything shows it (the
    # terminal, .md, .html, and the "not comparable" line), as every other view does.
    before, after = printable_tree(report_of(args.before)), printable_tree(report_of(args.after))
    names = (printable(os.path.basename(args.before)), printable(os.path.basename(args.after)))
    try:
        assert isinstance(before, dict) and isinstance(after, dict)
        report = diff.diff(before, after, names=names)
        fell = diff.slower(report, args.fail_if_slower) if args.fail_if_slower is not None else []
        text = json.dumps(report, indent=2) + "\n"
        rendered = diff.render_text(report) if not args.json and not args.output else ""
        page = by_extension(args.output, text, report, diff.render_md, diff.render_html) if args.output else ""
    except diff.NotComparable as e:
        raise UsageError(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, AssertionError) as e:
        # A report whose fields are not of the types loadertop writes: one line, never a traceback.
        raise UsageError(f"{names[0]} or {names[1]} is not a report diff can read ({type(e).__name__}: "
                         f"{printable(str(e))[:120]}); write them again with `loadertop snapshot PID -o FILE.json`") \
            from None
    status = write_report(args.output, page) if args.output else 0
    if args.json:
        sys.stdout.write(text)
    elif not args.output:
        sys.stdout.write(rendered)
    for line in fell:
        print(f"loadertop: {line}", file=sys.stderr)
    return 1 if fell else status
