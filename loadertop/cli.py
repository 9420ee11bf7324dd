"""Command line: arguments and sub-commands. Textual is imported only on the TUI path."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import NoReturn

from . import __version__
from .text import count
from .tui import LIVE_INTERVAL_S

SUBCOMMANDS = ("snapshot", "demo", "record", "replay", "diff", "export", "fleet", "tune")
REPORT_FORMATS = (".json", ".md", ".html")
MAX_REPORT_BYTES = 64 << 20  # a report of thousands of workers is a few MiB
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


def _pid(text: str) -> int:
    # ASCII digits only: int() also reads other scripts' digits ("١٢٣" is 123).
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a PID: {text!r} (give a number in digits 0-9, e.g. 41822)")
    pid = int(text)
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"not a PID: {text!r} (PIDs are positive)")
    return pid


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"need whole numbers >= 0, e.g. 0,2,4: {text!r}")
    return values


LONGEST_S = 365 * 24 * 3600.0


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (e.g. 10 for 10 %)") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage is between 0 and 100: {text!r}")
    return value


def _positive(text: str) -> float:
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


def _interval(text: str) -> float:
    value = _positive(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL_S:g} seconds: {text!r}")
    return value


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (1 is real time, 2 twice as fast)") from None
    if not MIN_SPEED <= value <= 1e6:  # nan, inf, a crawl that never ends
        raise argparse.ArgumentTypeError(f"must be between {MIN_SPEED:g} and 1000000 times real time: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="loadertop",
        usage=f"{MONITOR_USAGE}\n       loadertop COMMAND [ARGS ...]",
        description="Live monitor for the input pipeline (DataLoader) of PyTorch training jobs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # -h goes under "other options", after the live view and the commands
    )
    # The live view comes first, as the main use: main() hands PIDs to _monitor_parser(), and
    # these are its options, shown here so that the first `--help` a new user reads has them.
    live = p.add_argument_group("the live view (the main use)", MONITOR_DESCRIPTION)
    _monitor_arguments(live, pids=False)
    sub = p.add_subparsers(dest="command", parser_class=_Parser, title="commands", metavar="COMMAND", prog="loadertop")
    other = p.add_argument_group("other options")
    other.add_argument("-h", "--help", action="help", help="show this help and exit")
    other.add_argument("--version", action="version", version=f"loadertop {__version__}")

    snap = sub.add_parser("snapshot", help="sample jobs for a while and write a report")
    snap.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    snap.add_argument("--from", dest="recording", metavar="FILE", help="report on a recording instead")
    snap.add_argument("--duration", type=_positive, default=10.0, help="seconds to sample (10)")
    snap.add_argument("--interval", type=_interval, default=1.0, help="seconds per tick (1)")
    snap.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    snap.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (.json, .md or .html)")
    snap.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")

    rec = sub.add_parser("record", help="record snapshots to a file, for replay and reports")
    rec.add_argument("pids", nargs="+", type=_pid, metavar="PID")
    rec.add_argument("-o", "--output", metavar="FILE", required=True, help="the recording to write")
    rec.add_argument("--duration", type=_positive, default=None, help="seconds to record (until Ctrl-C)")
    rec.add_argument("--interval", type=_interval, default=1.0, help="seconds per tick (1)")
    rec.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")

    exp = sub.add_parser("export", help="serve Prometheus metrics of the jobs")
    exp.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    exp.add_argument("--all", action="store_true",
                     help="the node agent: every training job on this host, found as it starts, dropped when it ends")
    exp.add_argument("--no-worker-series", action="store_true",
                     help="no per-worker series (a large node): trainers' and main processes' only")
    exp.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT (127.0.0.1:9464; all interfaces: 0.0.0.0)")
    exp.add_argument("--interval", type=_interval, default=5.0, help="seconds per tick (5)")
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
    fleet.add_argument("--timeout", type=_positive, default=5.0, help="seconds a query may take (5)")
    fleet.add_argument("--interval", type=_interval, default=10.0, help="seconds between reads in the live view (10)")

    dif = sub.add_parser("diff", help="one job before and after a change: what changed and what it did")
    dif.add_argument("before", metavar="BEFORE", help="a report (snapshot --json / -o .json) or a recording")
    dif.add_argument("after", metavar="AFTER", help="the same job's, after the change")
    dif.add_argument("--json", action="store_true", help="print the loadertop.diff/1 report as JSON")
    dif.add_argument("-o", "--output", metavar="FILE", help="write the diff to FILE (.json, .md or .html)")
    dif.add_argument("--fail-if-slower", type=_percent, metavar="PCT", default=None,
                     help="exit 1 where steps/s fell by more than PCT %% and past the noise (for CI)")

    rep = sub.add_parser("replay", help="watch a recording in the live view")
    rep.add_argument("recording", metavar="FILE")
    rep.add_argument("--speed", type=_speed, default=1.0, help="times real time (1)")

    tune = sub.add_parser("tune", help="measure the best DataLoader settings for your own dataset")
    tune.add_argument("factory", metavar="MODULE:FACTORY",
                      help="a callable returning your Dataset, (dataset, kwargs) or {'dataset': ..., **kwargs}; "
                           "module.path:name or path/to/file.py:name")
    tune.add_argument("--batch-size", type=_count, default=None, help="batch size (the factory's, else 1)")
    tune.add_argument("--collate", metavar="MODULE:FN", help="a collate_fn to use")
    tune.add_argument("--budget", type=_positive, default=90.0, help="seconds for the whole tune (90)")
    tune.add_argument("--workers", type=_int_list, default=None,
                      help="num_workers to try, e.g. 0,2,4,8 (0, powers of two up to 2x this job's CPUs)")
    tune.add_argument("--prefetch", type=_int_list, default=[2, 4], help="prefetch_factor values to try (2,4)")
    tune.add_argument("--pin-memory", choices=["auto", "on", "off"], default="auto",
                      help="auto: try pinning where CUDA is available")
    tune.add_argument("--per-step-ms", type=_positive, default=None,
                      help="emulate a training step this long (the GPU works, CPUs stay free): report data wait")
    tune.add_argument("--first-batch-timeout", type=_positive, default=60.0,
                      help="seconds a setting may take to its first batch (60)")
    tune.add_argument("--python", default=sys.executable, help="the interpreter with your torch and code")
    tune.add_argument("-o", "--output", metavar="FILE", help="also write the result to FILE (.json, .md or .html)")

    demo = sub.add_parser("demo", help="start a built-in training job and watch it")
    from .demo import SCENARIOS

    demo.add_argument("--scenario", choices=sorted(SCENARIOS), default="starved",
                      help="; ".join(f"{k}: {v[0]}" for k, v in SCENARIOS.items()))
    demo.add_argument("--interval", type=_interval, default=LIVE_INTERVAL_S,
                      help=f"seconds per tick ({LIVE_INTERVAL_S:g})")
    demo.add_argument("--tune", action="store_true",
                      help="the job watches its loader with tune=True and short epochs: watch the tuner fix it in "
                           "place")
    return p


def _monitor_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="loadertop", usage=MONITOR_USAGE, description=MONITOR_DESCRIPTION, epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _monitor_arguments(p, pids=True)
    return p


def _monitor_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, pids: bool) -> None:
    """The live view's arguments: parsed by _monitor_parser(), shown first by `loadertop --help`."""
    if pids:
        p.add_argument("pids", nargs="*", type=_pid, metavar="PID", help="training scripts or launchers to watch")
    p.add_argument("--interval", type=_interval, default=LIVE_INTERVAL_S, metavar="S",
                   help=f"seconds per tick ({LIVE_INTERVAL_S:g})")
    p.add_argument("--no-stacks", action="store_true", help="do not run py-spy (no data wait)")


def _require_terminal() -> None:
    """Checked before anything starts sampling, so a refusal leaves nothing behind."""
    if not sys.stdout.isatty():
        raise UsageError("the live view needs a terminal; use `loadertop snapshot PID --json` in scripts")


def _run_tui(source, on_exit=None, connect=None) -> int:
    try:
        from .tui.app import LoadertopApp
    except ImportError as e:  # textual missing in a broken install
        raise UsageError(f"the live view needs textual ({e}); pip install textual") from None
    LoadertopApp(source, on_exit=on_exit, connect=connect).run()
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    _check_pids(args.pids)  # a PID that cannot be watched is the first thing to say
    _require_terminal()
    from .tui.source import LiveSource

    def connect(pids: list[int]) -> LiveSource:
        return LiveSource(pids, interval_s=args.interval, stacks=not args.no_stacks)

    if not args.pids:  # the picker attaches with the same options
        return _run_tui(None, connect=connect)
    return _run_tui(connect(args.pids))


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import start_job, stop_job
    from .tui.source import LiveSource

    _require_terminal()
    proc, note = start_job(args.scenario, tune=args.tune)
    if note:
        print(f"loadertop: {note}", file=sys.stderr)
    try:
        return _run_tui(LiveSource([proc.pid], interval_s=args.interval), on_exit=lambda: stop_job(proc))
    finally:
        stop_job(proc)


def _check_pids(pids: Sequence[int]) -> None:
    from .probes import procfs

    for pid in pids:
        st = procfs.read_stat(pid)
        if st is None and procfs.hidden(pid):
            raise UsageError(f"PID {pid} exists but /proc hides it from this user (hidepid): run loadertop as "
                             "root or as the job's user")
        if st is None:
            raise UsageError(f"no process with PID {pid} (is the job running? `loadertop` lists them)")
        if pid == 1 and not st.comm.startswith("python"):
            # Every orphan on the host is init's child: it would take every DataLoader job.
            raise UsageError(f"PID 1 is {st.comm}, the init process, parent of every job on this machine: "
                             "give the training process's PID (`loadertop` lists them)")
        if not _starts_python(st):
            raise UsageError(f"PID {pid} is {st.comm}, not Python, and starts no Python process: give the PID of "
                             "the training script (python train.py) or its launcher (`loadertop` lists them)")


def _starts_python(st) -> bool:
    """The process is Python, or a wrapper (a shell, srun, a container's init) with Python
    under it; a process not readable to us counts as Python (the sampler says what it can)."""
    from .probes import procfs
    from .probes.discovery import runs_python

    for pid in (st.pid, *procfs.descendants(st.pid)):
        other = procfs.read_stat(pid) if pid != st.pid else st
        if other is None:
            continue
        try:
            args = procfs.cmdline(pid) or []
        except PermissionError:
            return True
        if runs_python(other, args) or other.comm in ("pt_elastic", "pt_data_worker"):
            return True
    return False


def _check_output(path: str, formats: tuple[str, ...] = REPORT_FORMATS) -> None:
    ext = os.path.splitext(path)[1].lower()
    if formats and ext not in formats:
        raise UsageError(f"cannot write {path!r}: the format is picked by extension: {', '.join(formats)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {path!r}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {path!r}: permission denied (choose another -o path)")
    if os.path.exists(path) and not os.path.islink(path) and not os.path.isfile(path):
        raise UsageError(f"cannot write {path!r}: it is not a regular file (a FIFO, a device or a folder)")


def _read_recording(path: str):
    from .outputs.record import NotARecording, read

    try:
        recording = read(path)
    except FileNotFoundError:
        raise UsageError(f"no such recording: {path}") from None
    except (NotARecording, IsADirectoryError, PermissionError) as e:
        raise UsageError(str(e)) from None
    if recording.problem:
        print(f"loadertop: {path}: {recording.problem}", file=sys.stderr)
    if not recording.snapshots:
        raise UsageError(f"{path} holds no complete snapshot")
    return recording


def _render(path: str | None, report: dict, snapshots) -> str:
    ext = os.path.splitext(path or "")[1].lower()
    if ext == ".md":
        from .outputs.report_md import render as render_md

        return render_md(report)
    if ext == ".html":
        from .outputs.report_html import render as render_html

        return render_html(report, snapshots)
    from .outputs.report import to_json

    return to_json(report)


def _write_report(path: str, text: str) -> int:
    from .outputs.report import write_file

    try:
        write_file(path, text)
    except OSError as e:
        suffix = os.path.splitext(path)[1] or ".json"
        fd, fallback = tempfile.mkstemp(prefix="loadertop-", suffix=suffix)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        why = e.strerror
        if e.errno == errno.ELOOP and why == os.strerror(errno.ELOOP):  # the kernel's words, not files.py's
            why = "it is a symbolic link, and reports are never written through one"
        print(f"loadertop: cannot write {path!r}: {why}; report saved to {fallback}", file=sys.stderr)
        return 1
    print(f"loadertop: report written to {path}", file=sys.stderr)
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from .outputs import summary
    from .outputs.report import to_json

    if args.output:
        _check_output(args.output)
    if args.recording:
        if args.pids:
            raise UsageError("give either PIDs or --from FILE, not both")
        recording = _read_recording(args.recording)
        snapshots = recording.snapshots
        report = _report_of_recording(snapshots, recording.judged)
        interrupted = False
    else:
        if not args.pids:
            raise UsageError("which job? give its PID (`loadertop` lists them) or --from a recording")
        snapshots, interrupted = _sample_for_snapshot(args)
        report = _report_of_snapshots(snapshots, args.duration)
    if not args.recording and summary.ended(snapshots):
        # The job ended while it was watched: what it did over the run, in the terminal too.
        sys.stderr.write(summary.render(_report_of_recording(snapshots), True))
    status = 0
    if args.output:
        status = _write_report(args.output, _render(args.output, report, snapshots))
    if args.json or (not args.output and not sys.stdout.isatty()):
        sys.stdout.write(to_json(report))  # JSON for scripts, pipes and files
    elif not args.output:
        from .outputs import report_text

        sys.stdout.write(report_text.render(report))  # a person at a terminal: the answer first
    return status or (130 if interrupted else 0)


def _sample_for_snapshot(args: argparse.Namespace):
    from .probes.processes import ProcessSampler
    from .sampler import History, Sampler, run_ticks

    _check_pids(args.pids)
    stacks = None
    if not args.no_stacks:
        from .probes.stacks import StackSampler, snapshot_profile

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


def cmd_record(args: argparse.Namespace) -> int:
    from .outputs import judgement
    from .outputs.record import Recorder
    from .rules import Diagnoser
    from .sampler import Sampler, run_ticks

    _check_pids(args.pids)
    _check_output(args.output, formats=())
    stacks = None
    if not args.no_stacks:
        from .probes.stacks import RECORDING, StackSampler

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
        _write_summary(args.output, written, judged)
    return 0


def _write_summary(recording: str, snapshots: list, judged: list) -> None:
    """The run's summary, printed and written beside the recording (FILE.summary.md)."""
    from .outputs import summary
    from .outputs.report import write_file

    text = summary.render(_report_of_recording(snapshots, judged), summary.ended(snapshots), recording=recording)
    sys.stderr.write(text)
    path = os.path.splitext(recording)[0] + ".summary.md"
    try:
        write_file(path, text)
    except OSError as e:
        print(f"loadertop: cannot write the summary {path!r}: {e.strerror}", file=sys.stderr)
        return
    print(f"loadertop: summary written to {path}", file=sys.stderr)


def _every_interface(host: str) -> bool:
    """The host as the socket will bind it is the unspecified address (0.0.0.0, ::): every
    spelling of it (0, 0.0, 0x0, 00, [::0], [0:0:0:0:0:0:0:0]) resolves to that."""
    import ipaddress
    import socket

    name = host.strip("[]")
    if not name:
        return True  # an empty host binds every interface too
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        try:
            return _unspecified(ipaddress.ip_address(name))
        except ValueError:
            return False  # a host name: it resolves to its own addresses
    return any(_unspecified(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos)


def _unspecified(address) -> bool:
    """The unspecified address, also as IPv4 mapped into IPv6 (::ffff:0.0.0.0 binds every IPv4
    interface)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_unspecified or (mapped is not None and mapped.is_unspecified)


def cmd_export(args: argparse.Namespace) -> int:
    from .sampler import Sampler

    host, sep, port = args.listen.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {args.listen!r}: give HOST:PORT, e.g. 127.0.0.1:9464")
    if _every_interface(host):
        print(f"loadertop: warning: --listen {args.listen} serves every interface: anyone who reaches this host "
              "reads the jobs' command lines and pids; prefer 127.0.0.1 and scrape through an SSH tunnel or a "
              "local agent, or firewall the port", file=sys.stderr)
    if not args.pids and not args.all:
        raise UsageError("give the PIDs of the jobs to export, or --all for every training job on this host")
    _check_pids(args.pids)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError("the exporter needs prometheus-client: pip install prometheus-client") from None
    from .outputs.export import NodeAgent, serve

    stacks = None
    if not args.no_stacks:
        from .probes.stacks import EXPORTER, StackSampler

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


def cmd_fleet(args: argparse.Namespace) -> int:
    import json

    from .outputs import fleet
    from .outputs.report import write_file
    from .probes.prometheus import FleetError, Prometheus

    if args.output:
        _check_output(args.output, (".json", ".md", ".html"))
    try:
        prometheus = Prometheus(args.prometheus, timeout_s=args.timeout)
        if not args.json and not args.output and sys.stdout.isatty() and sys.stdin.isatty():
            prometheus.query("vector(1)")  # a wrong address is one line here, not a screen of n/a
            from .tui.fleet_view import FleetApp

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
        write_file(args.output, _by_extension(args.output, text, report, fleet.render_md, fleet.render_html))
        print(f"loadertop: fleet report written to {args.output}", file=sys.stderr)
    if args.json:
        sys.stdout.write(text)
    elif not args.output:
        sys.stdout.write(fleet.render_text(report))
    return 0


def _by_extension(path: str, json_text: str, report: dict, render_md, render_html) -> str:
    """What `-o FILE.{json,md,html}` writes (the extension was checked by _check_output): the
    JSON already made, or only the one rendering asked for."""
    kind = os.path.splitext(path)[1].lower()
    return json_text if kind == ".json" else render_md(report) if kind == ".md" else render_html(report)


def _report_of(path: str) -> dict:
    """A report file as it is, or the report of a recording (as `snapshot --from` makes it)."""
    import json

    try:
        with open(path, "rb") as f:
            head = f.read(MAX_REPORT_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder: give a report or a recording") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if head.lstrip()[:1] == b"{" and b'"loadertop.report/' in head[:4096]:
        if len(head) > MAX_REPORT_BYTES:
            raise UsageError(f"{path}: a report larger than {MAX_REPORT_BYTES >> 20} MiB is not one loadertop wrote")
        try:
            report = json.loads(head.decode("utf-8", errors="replace"))
        except (json.JSONDecodeError, RecursionError) as e:
            where = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "nested too deep"
            raise UsageError(f"{path}: a damaged report ({where}); write it again with "
                             "`loadertop snapshot PID -o FILE.json`") from None
        if not (isinstance(report, dict) and str(report.get("schema", "")).startswith("loadertop.report/")
                and isinstance(report.get("trainers"), list)
                and all(isinstance(t, dict) and isinstance(t.get("pid"), int) and isinstance(t.get("cmdline"), list)
                        for t in report["trainers"])):
            raise UsageError(f"{path}: not a loadertop report (no trainers with a pid and a command line)")
        return report
    recording = _read_recording(path)
    return _report_of_recording(recording.snapshots, recording.judged)


def _report_of_snapshots(snapshots, duration: float) -> dict:
    """The report of a live `snapshot` sampled over `duration` s."""
    from .outputs.report import build_report
    from .rules import diagnosed, thresholds

    # A short snapshot is one window of evidence: it may hold a finding for half its length.
    diagnoser = diagnosed(snapshots, hold_s=min(thresholds.HOLD_S, max(1.0, duration / 2)))
    return build_report(snapshots, diagnoser.diagnosis)


def _report_of_recording(snapshots, judged=()) -> dict:
    """The report of a recording, as every view of it shows it (`snapshot --from`, the
    summary, `diff`; `replay` at the same tick): the job at work up to its last tick that
    ran the loop, with the judgement the recorder stored for that tick (`judged`: each tick's,
    stored or in memory); judged again by the live view's own diagnoser where none was stored."""
    from .outputs import judgement, summary
    from .outputs.report import build_report
    from .rules import diagnosed

    running = summary.while_running(snapshots)
    said = judgement.at(judged, len(running) - 1)
    return build_report(running, said or diagnosed(running).diagnosis)


def cmd_diff(args: argparse.Namespace) -> int:
    import json

    from .outputs import diff
    from .text import printable, printable_tree

    if args.output:
        _check_output(args.output)
    # Every string of a report file is its author's: printable before anything shows it (the
    # terminal, .md, .html, and the "not comparable" line), as every other view does.
    before, after = printable_tree(_report_of(args.before)), printable_tree(_report_of(args.after))
    names = (printable(os.path.basename(args.before)), printable(os.path.basename(args.after)))
    try:
        assert isinstance(before, dict) and isinstance(after, dict)
        report = diff.diff(before, after, names=names)
        fell = diff.slower(report, args.fail_if_slower) if args.fail_if_slower is not None else []
        text = json.dumps(report, indent=2) + "\n"
        rendered = diff.render_text(report) if not args.json and not args.output else ""
        page = _by_extension(args.output, text, report, diff.render_md, diff.render_html) if args.output else ""
    except diff.NotComparable as e:
        raise UsageError(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, AssertionError) as e:
        # A report whose fields are not of the types loadertop writes: one line, never a traceback.
        raise UsageError(f"{names[0]} or {names[1]} is not a report diff can read ({type(e).__name__}: "
                         f"{printable(str(e))[:120]}); write them again with `loadertop snapshot PID -o FILE.json`") \
            from None
    status = _write_report(args.output, page) if args.output else 0
    if args.json:
        sys.stdout.write(text)
    elif not args.output:
        sys.stdout.write(rendered)
    for line in fell:
        print(f"loadertop: {line}", file=sys.stderr)
    return 1 if fell else status


def cmd_replay(args: argparse.Namespace) -> int:
    from .tui.source import ScriptedSource

    _require_terminal()
    recording = _read_recording(args.recording)
    snaps = recording.snapshots
    interval = snaps[-1].interval_s if snaps else 1.0
    return _run_tui(ScriptedSource(snaps, interval_s=interval / args.speed, judged=recording.judged))


def cmd_tune(args: argparse.Namespace) -> int:
    from .outputs.report import write_file
    from .tune import output
    from .tune.result import TuneSpec
    from .tune.runner import FactoryError, Tuner
    from .tune.view import LineProgress, LiveProgress

    if ":" not in args.factory or args.factory.startswith(":") or args.factory.endswith(":"):
        raise UsageError(f"need MODULE:FACTORY (e.g. mypkg.data:make_dataset), not {args.factory!r}")
    if args.prefetch[0] < 1:
        raise UsageError("--prefetch values must be at least 1")
    if args.output:
        _check_output(args.output)
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The restore of SIGPIPE's default lets `loadertop snapshot --json | head` end quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        if argv and argv[0] in SUBCOMMANDS or argv[:1] in (["-h"], ["--help"], ["--version"]):
            args = _parser().parse_args(argv)
            if args.command == "snapshot":
                return cmd_snapshot(args)
            if args.command == "demo":
                return cmd_demo(args)
            if args.command == "record":
                return cmd_record(args)
            if args.command == "replay":
                return cmd_replay(args)
            if args.command == "export":
                return cmd_export(args)
            if args.command == "tune":
                return cmd_tune(args)
            if args.command == "fleet":
                return cmd_fleet(args)
            if args.command == "diff":
                return cmd_diff(args)
        if argv and not argv[0].startswith("-") and not argv[0].isdigit():
            raise UsageError(f"unknown command {argv[0]!r}: use a PID, or one of {', '.join(SUBCOMMANDS)}")
        return cmd_monitor(_monitor_parser().parse_args(argv))
    except UsageError as e:
        print(f"loadertop: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
