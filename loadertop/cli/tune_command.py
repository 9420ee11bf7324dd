"""`loadertop tune`: measure the best DataLoader settings for a dataset."""

from __future__ import annotations

import argparse
import sys

from .arguments import UsageError
from .report_files import check_output


def cmd_tune(args: argparse.Namespace) -> int:
    from ..outputs.report import write_file
    from ..tune import output
    from ..tune.result import TuneSpec
    from ..tune.runner import FactoryError, Tuner
    from ..tune.view import LineProgress, LiveProgress

    if ":" not in args.factory or args.factory.startswith(":") or args.factory.endswith(":"):
        raise UsageError(f"need MODULE:FACTORY (e.g. mypkg.data:make_dataset), not {args.factory!r}")
    if args.prefetch[0] < 1:
        raise UsageError("--prefetch values must be at least 1")
    if args.output:
        check_output(args.output)
    spec = TuneSpec(factory=args.factory, batch_size=args.batch_size, collate=args.collate, budget_s=args.budget,
                    workers=args.workers, prefetch=args.prefetch, pin_memory=args.pin_memory,
                    per_step_ms=args.per_step_ms, first_batch_timeout_s=args.first_batch_timeout,
                    python=args.python)
    live = LiveProgress(spec.metric, args.budget) if sys.stderr.isatty() else None
    tuner = Tuner(spec, live or LineProgress(spec.metric, args.budget))
    try:
        if live is not None:
            with live:
                result = tuner.run()
        else:
            result = tuner.run()
    except FactoryError as e:
        raise UsageError(str(e)) from None
    finally:
        tuner.close()
    sys.stdout.write(output.to_text(result))
    if args.output:
        try:
            write_file(args.output, output.render(result, args.output))
        except OSError as e:
            raise UsageError(f"cannot write {args.output!r}: {e.strerror}") from None
        print(f"written: {args.output}", file=sys.stderr)
    if result.stopped:
        return 130
    return 0 if result.recommendation is not None else 1
