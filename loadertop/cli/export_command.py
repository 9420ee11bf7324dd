"""`loadertop export`: the jobs' Prometheus metrics, or every job on the node (--all)."""

from __future__ import annotations

import argparse
import sys

from .arguments import UsageError, check_pids


def cmd_export(args: argparse.Namespace) -> int:
    from ..outputs.export import serves_every_interface
    from ..sampler import Sampler

    host, sep, port = args.listen.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {args.listen!r}: give HOST:PORT, e.g. 127.0.0.1:9464")
    if serves_every_interface(host):
        print(f"loadertop: warning: --listen {args.listen} serves every interface: anyone who reaches this host "
              "reads the jobs' command lines and pids; prefer 127.0.0.1 and scrape through an SSH tunnel or a "
              "local agent, or firewall the port", file=sys.stderr)
    if not args.pids and not args.all:
        raise UsageError("give the PIDs of the jobs to export, or --all for every training job on this host")
    check_pids(args.pids)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError("the exporter needs prometheus-client: pip install prometheus-client") from None
    from ..outputs.export import NodeAgent, serve

    stacks = None
    if not args.no_stacks:
        from ..probes.stacks import EXPORTER, StackSampler

        stacks = StackSampler.of(EXPORTER)
    sampler = Sampler(args.pids, interval_s=args.interval, stacks=stacks)
    source = NodeAgent(sampler) if args.all else sampler
    print(f"loadertop: metrics on http://{args.listen}/metrics (Ctrl-C stops)", file=sys.stderr)
    try:
        serve(source, args.listen, args.interval, workers=not args.no_worker_series, job_names=args.job_names)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.listen}: {e.strerror}") from None
    except KeyboardInterrupt:
        pass
    return 0
