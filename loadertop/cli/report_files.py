"""The files the commands read and write: recordings and reports read back, reports rendered by
extension and written (or saved elsewhere where the path refuses them)."""

from __future__ import annotations

import errno
import os
import sys
import tempfile

from .arguments import UsageError

REPORT_FORMATS = (".json", ".md", ".html")
MAX_REPORT_BYTES = 64 << 20  # a report of thousands of workers is a few MiB


def check_output(path: str, formats: tuple[str, ...] = REPORT_FORMATS) -> None:
    """Before anything is sampled: the file can be written (its format known, its folder there and
    writable, not a FIFO or a device). The write itself is safe in loadertop/files.py."""
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


def read_recording(path: str):
    from ..outputs.record import NotARecording, read

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


def render(path: str | None, report: dict, snapshots) -> str:
    ext = os.path.splitext(path or "")[1].lower()
    if ext == ".md":
        from ..outputs.report_md import render as render_md

        return render_md(report)
    if ext == ".html":
        from ..outputs.report_html import render as render_html

        return render_html(report, snapshots)
    from ..outputs.report import to_json

    return to_json(report)


def write_report(path: str, text: str) -> int:
    from ..outputs.report import write_file

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


def by_extension(path: str, json_text: str, report: dict, render_md, render_html) -> str:
    """What `-o FILE.{json,md,html}` writes (the extension was checked by check_output): the
    JSON already made, or only the one rendering asked for."""
    kind = os.path.splitext(path)[1].lower()
    return json_text if kind == ".json" else render_md(report) if kind == ".md" else render_html(report)


def report_of(path: str) -> dict:
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
    recording = read_recording(path)
    return report_of_recording(recording.snapshots, recording.judged)


def report_of_snapshots(snapshots, duration: float) -> dict:
    """The report of a live `snapshot` sampled over `duration` s."""
    from ..outputs.report import build_report
    from ..rules import diagnosed, thresholds

    # A short snapshot is one window of evidence: it may hold a finding for half its length.
    diagnoser = diagnosed(snapshots, hold_s=min(thresholds.HOLD_S, max(1.0, duration / 2)))
    return build_report(snapshots, diagnoser.diagnosis)


def report_of_recording(snapshots, judged=()) -> dict:
    """The report of a recording, as every view of it shows it (`snapshot --from`, the
    summary, `diff`; `replay` at the same tick): the job at work up to its last tick that
    ran the loop, with the judgement the recorder stored for that tick (`judged`: each tick's,
    stored or in memory); judged again by the live view's own diagnoser where none was stored."""
    from ..outputs import judgement, summary
    from ..outputs.report import build_report
    from ..rules import diagnosed

    running = summary.while_running(snapshots)
    said = judgement.at(judged, len(running) - 1)
    return build_report(running, said or diagnosed(running).diagnosis)
