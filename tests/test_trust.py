"""Trust boundaries (docs/SECURITY.md): hostile recordings, report files, CLI input, the
exporter's exposure, the picker, hidden /proc entries, and threads that must not die. The
hook channel's own tests are in test_hook.py, redaction's in test_redact.py."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import zlib
from types import SimpleNamespace

import pytest
from support.jobs import REPO, loadertop, python_sleeper, wait_for
from support.synth import snapshot, trainer

from loadertop.outputs import record
from loadertop.outputs.record import MAGIC, Damaged, Recorder, decode, encode


def _recording(path, lines: list[bytes]) -> None:
    z = zlib.compressobj()
    with open(path, "wb") as f:
        f.write(MAGIC + z.compress(b"\n".join(lines) + b"\n") + z.flush())


def _good() -> dict:
    """A snapshot as a recording holds it (JSON: tuples are lists)."""
    return json.loads(json.dumps(encode(snapshot(0, [trainer()]))))


# --- recordings and reports a stranger hands us ---------------------------------------------


def test_a_zlib_bomb_is_read_only_up_to_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "MAX_DECOMPRESSED", 4 << 20)
    path = tmp_path / "bomb.ltrec"
    z = zlib.compressobj(9)
    good = json.dumps(_good()).encode() + b"\n"
    with open(path, "wb") as f:
        f.write(MAGIC + z.compress(good))
        for _ in range(64):  # 64 MiB of newlines in a few KiB
            f.write(z.compress(b"\n" * (1 << 20)))
        f.write(z.flush())
    assert path.stat().st_size < 200_000
    rec = record.read(str(path))
    assert len(rec.snapshots) == 1 and ("inflates past 4 MiB" in rec.problem or "lines" in rec.problem)


def test_a_bomb_of_newlines_is_read_in_little_memory(tmp_path):
    # ~1 MiB of compressed newlines inflates to 1 GiB: read a line at a time, it costs a
    # chunk and the line cap, not ~10 bytes of memory per inflated byte (78 MiB at 8 MiB).
    import tracemalloc

    path = tmp_path / "newlines.ltrec"
    z = zlib.compressobj(9)
    with open(path, "wb") as f:
        f.write(MAGIC + z.compress(json.dumps(_good()).encode() + b"\n"))
        for _ in range(1024):
            f.write(z.compress(b"\n" * (1 << 20)))
        f.write(z.flush())
    assert path.stat().st_size < 2_000_000
    tracemalloc.start()
    try:
        rec = record.read(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rec.snapshots) == 1 and "lines" in rec.problem
    assert peak < 16 << 20, peak


def test_a_report_on_thousands_of_workers_reads_each_trainers_workers_once():
    # history_of walked every process of every snapshot for each process: 4000 workers in a
    # 70 KiB recording cost 1.1 s. Counted, not timed: how often the workers are walked.
    from dataclasses import replace

    from support.synth import process

    from loadertop.outputs import report

    walks = []

    class Walked(tuple):
        def __iter__(self):
            walks.append(1)
            return super().__iter__()

    t = trainer(workers=0)
    many = Walked(process(5000 + i, 10.0, worker_id=i) for i in range(2000))
    snaps = [snapshot(k, [replace(t, workers=many)]) for k in range(5)]
    out = report.build_report(snaps)
    assert len(out["trainers"][0]["workers"]) == 2000
    assert len(walks) < 200, len(walks)  # a few passes a snapshot, not one per process


@pytest.mark.parametrize("field,value", [("time", "soon"), ("time", float("nan")), ("time", 1e20),
                                         ("monotonic", [1]), ("interval_s", None)])
def test_a_damaged_field_is_a_problem_not_a_traceback(tmp_path, field, value):
    bad = _good()
    bad[field] = value
    path = tmp_path / "bad.ltrec"
    _recording(path, [json.dumps(_good()).encode(), json.dumps(bad, allow_nan=True).encode()])
    rec = record.read(str(path))
    assert len(rec.snapshots) == 1 and "snapshot 2 is damaged" in rec.problem
    r = loadertop("snapshot", "--from", str(path), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "damaged" in r.stderr


def test_a_short_list_and_a_wrong_type_deep_inside_are_refused():
    bad = _good()
    bad["host"]["load_avg"] = [1.0]
    with pytest.raises(Damaged):
        decode(bad)
    bad = _good()
    bad["trainers"][0]["workers"][0]["pid"] = "4001"
    with pytest.raises(Damaged):
        decode(bad)
    assert decode(_good()) == snapshot(0, [trainer()])


def test_a_word_outside_the_vocabulary_is_refused():
    """A closed set of words (vocabulary.py) is checked when a recording is read: a status or
    a way of finding a worker that loadertop never writes is damage, not data."""
    for where, value in ((("trainers", 0, "workers", 0, "status"), "hacked"),
                         (("trainers", 0, "workers", 0, "found_by"), "rumour"), (("trainers", 0, "status"), "gone")):
        bad = _good()
        node = bad
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
        with pytest.raises(Damaged, match="none of"):
            decode(bad)


def test_the_html_report_escapes_everything_a_recording_holds(tmp_path):
    from dataclasses import replace

    snap = snapshot(0, [trainer()])
    evil = "<script>alert(1)</script>"
    t = snap.trainers[0]
    t = replace(t, cmdline=(evil,), workers=tuple(replace(w, doing=evil) for w in t.workers))
    snap = replace(snap, trainers=(t,), host=replace(snap.host, hostname=evil))
    path = tmp_path / "evil.ltrec"
    rec = Recorder(str(path))
    rec.write(snap)
    rec.close()
    out = tmp_path / "evil.html"
    r = loadertop("snapshot", "--from", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "<script>" not in out.read_text(encoding="utf-8")


# --- report and recording files ---------------------------------------------------------------


def test_reports_and_recordings_are_private_whole_and_utf8(tmp_path):
    from loadertop.outputs.report import write_file

    path = tmp_path / "r.md"
    write_file(str(path), "données ✓")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().decode("utf-8") == "données ✓"
    assert [p.name for p in tmp_path.iterdir()] == ["r.md"]  # no temporary file left
    rec = tmp_path / "r.ltrec"
    Recorder(str(rec)).close()
    assert stat.S_IMODE(rec.stat().st_mode) == 0o600


def test_an_ascii_locale_and_a_non_utf8_command_line_still_write_the_report(tmp_path):
    # A command line with bytes that are not UTF-8, written under LC_ALL=C.
    target = python_sleeper(b"sh-\xff\xfe-caf\xc3\xa9", seconds=30)
    try:
        out = tmp_path / "r.md"
        env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}
        r = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", str(target.pid), "--duration", "1",
                            "--no-stacks", "-o", str(out)], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert "café" in out.read_text(encoding="utf-8")
    finally:
        target.kill()
        target.wait()


def test_a_fifo_at_the_output_path_is_refused_not_blocked_on(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    r = loadertop("snapshot", "1", "-o", str(fifo))
    assert r.returncode == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1
    assert time.monotonic() - started < 30
    r = loadertop("record", str(os.getpid()), "-o", str(fifo), "--duration", "1")
    assert r.returncode == 2 and "not a regular file" in r.stderr


def test_a_recording_onto_a_file_another_user_created_is_a_new_file_of_ours(tmp_path):
    # nobody pre-creates the path and keeps it open: what we record must not reach them.
    path = tmp_path / "run.ltrec"
    path.write_bytes(b"")
    os.chown(path, 65534, 65534)
    held = open(path, "rb")  # noqa: SIM115 (the other user's descriptor)
    try:
        r = loadertop("record", str(os.getpid()), "-o", str(path), "--duration", "1", "--no-stacks")
        assert r.returncode == 0, r.stderr
        st = path.stat()
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size > 0
        assert held.read() == b""  # their descriptor still sees their own empty file
    finally:
        held.close()


def test_a_folder_link_another_user_planted_in_the_output_path_is_refused(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "reports"
    link.symlink_to(private)
    os.lchown(link, 65534, 65534)  # nobody's link, into root's folder
    r = loadertop("snapshot", str(os.getpid()), "--duration", "0.5", "--interval", "0.25", "--no-stacks",
                  "-o", str(link / "run.md"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "symbolic link of user 65534" in r.stderr
    assert list(private.iterdir()) == []
    for leftover in r.stderr.split("report saved to ")[1:]:
        os.remove(leftover.strip())


# --- CLI input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    (["snapshot", "1", "--duration", "inf"], "finite"),
    (["snapshot", "1", "--duration", "nan"], "finite"),
    (["record", "1", "-o", "x.ltrec", "--interval", "1e400"], "finite"),
    (["export", "1", "--listen", "127.0.0.1:²"], "HOST:PORT"),
    (["export", "1", "--listen", "127.0.0.1:٣"], "HOST:PORT"),
    (["snapshot", "١٢٣", "--duration", "1"], "digits 0-9"),  # not read as PID 123
    (["snapshot", "1", "--duration", "1", "--interval", "1e-9"], "at least 0.1 seconds"),
    (["record", "1", "-o", "x.ltrec", "--interval", "0.01"], "at least 0.1 seconds"),
    (["replay", "x.ltrec", "--speed", "1e-300"], "between 0.01"),
    (["replay", "x.ltrec", "--speed", "nan"], "between 0.01"),
])
def test_bad_numbers_are_one_line_errors(args, message):
    r = loadertop(*args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("command", [["snapshot"], ["record", "-o", "/tmp/never.rec"], ["export", "--listen", "127.0.0.1:1"], []])
def test_a_pid_that_is_not_python_and_starts_none_is_refused_in_one_line(command):
    # `loadertop snapshot <sleep's pid>` exited 0 with a full report titled NO DATA WAIT MEASURED.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        if not command:  # the live view
            r = loadertop(str(sleeper.pid))
        elif command[0] == "export":
            r = loadertop("export", str(sleeper.pid), *command[1:])
        else:
            r = loadertop(command[0], str(sleeper.pid), *command[1:], "--duration", "1")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
        assert f"PID {sleeper.pid} is sleep, not Python" in r.stderr and "Traceback" not in r.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pid_1_is_refused_unless_it_is_the_training_script():
    r = loadertop("snapshot", "1", "--duration", "1")
    with open("/proc/1/comm") as f:
        comm = f.read().strip()
    if comm.startswith("python"):
        pytest.skip("PID 1 here is a Python process (a container's training script)")
    assert r.returncode == 2 and "init process" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "0", "0.0", "0x0", "00", "[::0]", "[0:0:0:0:0:0:0:0]",
                                  "[::ffff:0.0.0.0]"])
def test_listening_on_every_interface_warns_and_says_how_to_restrict_it(host):
    # Every spelling of the unspecified address binds every interface: judged as resolved.
    from support.exporter import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "export", str(os.getpid()), "--listen",
                             f"{host}:{port}", "--no-stacks"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "every interface" in line and "127.0.0.1" in line
    finally:
        proc.kill()
        proc.wait()


# --- the exporter ------------------------------------------------------------------------------


class _FlakySampler:
    """A sampler whose second tick raises: sampling must go on."""

    def __init__(self) -> None:
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("boom")
        return snapshot(self.ticks, [trainer()])

    def close(self) -> None:
        pass


def _text(exporter) -> str:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return generate_latest(registry).decode()


def test_an_exporter_tick_that_fails_is_counted_and_sampling_goes_on(capsys):
    from loadertop.outputs.export import Exporter

    exporter = Exporter(_FlakySampler(), interval_s=1.0)
    for _ in range(3):
        exporter.sample_once()
    text = _text(exporter)
    assert "loadertop_sample_errors_total 1.0" in text
    assert "loadertop_last_sample_timestamp_seconds" in text and "loadertop_trainer_up" in text
    assert "sampling goes on" in capsys.readouterr().err


def test_a_stale_snapshot_is_not_served_as_current(monkeypatch):
    from loadertop.outputs import export

    exporter = export.Exporter(_FlakySampler(), interval_s=1.0)
    exporter.sample_once()
    assert "loadertop_trainer_up{" in _text(exporter)
    monkeypatch.setattr(export.time, "time", lambda: exporter.last_sample_at + 60)
    text = _text(exporter)
    assert "loadertop_trainer_up{" not in text and "loadertop_last_sample_timestamp_seconds" in text


def test_worker_series_are_labelled_by_worker_id_not_pid():
    from loadertop.outputs.export import Exporter

    exporter = Exporter(_FlakySampler(), interval_s=1.0)
    exporter.sample_once()
    text = _text(exporter)
    cpu = [line for line in text.splitlines() if line.startswith("loadertop_cpu_percent{")]
    assert cpu and not any(re.search(r'[{,]pid="', line) for line in cpu)
    assert 'worker_id="0"' in text and 'loadertop_process_info{' in text and 'pid="4001"' in text


def test_the_exporter_caps_connections_and_silent_ones_give_way(monkeypatch):
    from support.exporter import free_port, scrape

    from loadertop.outputs import export

    monkeypatch.setattr(export, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(export, "IDLE_TIMEOUT_S", 30.0)
    port = free_port()
    sampler = SimpleNamespace(tick=lambda: snapshot(0, [trainer()]), close=lambda: None)
    thread = threading.Thread(target=export.serve, args=(sampler, f"127.0.0.1:{port}", 0.5), daemon=True)
    thread.start()
    wait_for(lambda: _connects(port), 10, what="the server")
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # slowloris: say nothing
    try:
        time.sleep(0.3)
        # The cap is full of connections that said nothing: a scrape takes the oldest one's place
        # at once (not after the 30 s idle timeout), and that one is closed.
        assert "loadertop_trainer_up" in scrape(port)
        silent[0].settimeout(5)
        assert silent[0].recv(1) == b""
        # Where every held connection has asked, one more is closed at once rather than queued.
        with export._Server(("127.0.0.1", 0), export.BaseHTTPRequestHandler) as server:
            busy = [socket.socket() for _ in range(2)]
            for b in busy:
                assert server._take(b, "10.0.0.1")
                server.asked(b)
            extra = socket.socket()
            assert not server._take(extra, "10.0.0.2")
            for b in (*busy, extra):
                b.close()
    finally:
        for s in silent:
            s.close()


def test_silent_connections_from_many_loopback_addresses_keep_no_scrape_out(monkeypatch):
    # The fourth review: 4 loopback addresses x 4 silent connections filled the 16 slots; 7 of
    # 100 scrapes got through. Every 127.x address is one client, and silent ones give way.
    from support.exporter import free_port, scrape

    from loadertop.outputs import export

    monkeypatch.setattr(export, "IDLE_TIMEOUT_S", 30.0)
    assert export.client_of("127.0.0.3") == export.client_of("127.9.9.9") == export.client_of("::1") \
        == export.client_of("::ffff:127.0.0.1") == "loopback"
    assert export.client_of("2001:db8::1") == export.client_of("2001:db8::2") != export.client_of("2001:db9::1")
    port = free_port()
    sampler = SimpleNamespace(tick=lambda: snapshot(0, [trainer()]), close=lambda: None)
    threading.Thread(target=export.serve, args=(sampler, f"127.0.0.1:{port}", 0.5), daemon=True).start()
    wait_for(lambda: _connects(port), 10, what="the server")
    idle = [socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.0.{2 + i % 4}", 0))
            for i in range(export.MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        served = sum("loadertop_trainer_up" in scrape(port) for _ in range(20))
        assert served == 20
    finally:
        for s in idle:
            s.close()


def test_idle_clients_of_one_address_cannot_take_every_slot(monkeypatch):
    # 16 idle clients that reconnect held the 16 connections: most scrapes were refused.
    from loadertop.outputs import export

    monkeypatch.setattr(export, "IDLE_TIMEOUT_S", 30.0)
    from support.exporter import free_port

    port = free_port()
    sampler = SimpleNamespace(tick=lambda: snapshot(0, [trainer()]), close=lambda: None)
    threading.Thread(target=export.serve, args=(sampler, f"127.0.0.1:{port}", 0.5), daemon=True).start()
    wait_for(lambda: _connects(port), 10, what="the server")
    time.sleep(0.5)  # the probe's own connection gives its slot back
    idle = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
            for _ in range(export.MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        # Past its share, the idle host's oldest silent connections gave way to its newer ones.
        idle[0].settimeout(2)
        assert idle[0].recv(1) == b""
        # Another address (Prometheus) still scrapes.
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            body = b""
            while chunk := s.recv(65536):
                body += chunk
        assert b"200 OK" in body.split(b"\r\n")[0] and b"loadertop_trainer_up" in body
    finally:
        for s in idle:
            s.close()


def test_clients_that_drip_a_request_hold_their_slots_only_until_its_deadline(monkeypatch):
    # A byte every 0.6 s beats a per-recv timeout of 1 s for ever; the request's deadline
    # ends them. Meanwhile a real scrape takes a dripper's place (it has not asked yet).
    from support.exporter import free_port, scrape

    from loadertop.outputs import export

    monkeypatch.setattr(export, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(export, "IDLE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(export, "REQUEST_DEADLINE_S", 2.0)
    port = free_port()
    sampler = SimpleNamespace(tick=lambda: snapshot(0, [trainer()]), close=lambda: None)
    threading.Thread(target=export.serve, args=(sampler, f"127.0.0.1:{port}", 0.5), daemon=True).start()
    wait_for(lambda: _connects(port), 10, what="the server")
    time.sleep(0.5)  # the probe's own connection gives its slot back
    stop = threading.Event()
    cut = []

    def drip() -> None:
        s = socket.create_connection(("127.0.0.1", port))
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                if stop.is_set():
                    return
                s.sendall(bytes([byte]))
                time.sleep(0.6)
        except OSError:
            cut.append(True)  # the server shut the connection
        finally:
            s.close()

    drips = [threading.Thread(target=drip, daemon=True) for _ in range(2)]
    for t in drips:
        t.start()
    try:
        time.sleep(1.0)
        # Both slots held by drippers that have not finished asking: a scrape displaces one.
        assert "loadertop_trainer_up" in scrape(port)
        # Each dripper learns of its cut (displaced, or past its request's deadline) at its next
        # byte (up to 0.6 s later, more on a busy host).
        wait_for(lambda: len(cut) == 2, 10, what="both drippers cut")
        assert "loadertop_trainer_up" in scrape(port)
    finally:
        stop.set()


def test_a_client_that_hangs_up_leaves_no_traceback():
    from support.exporter import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadertop", "export", str(os.getpid()), "--listen",
                             f"127.0.0.1:{port}", "--no-stacks", "--interval", "0.5"], cwd=REPO,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: _connects(port), 20, what="the exporter")
        for _ in range(20):  # ask, then hang up hard (RST) before reading the answer
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        time.sleep(1.0)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


# --- the picker --------------------------------------------------------------------------------


async def test_the_picker_shows_a_command_line_with_markup_as_it_is(monkeypatch):
    from loadertop.candidates import Candidate
    from loadertop.tui import app as tui_app
    from loadertop.tui.screens import picker

    monkeypatch.setattr(picker, "find_trainers",
                        lambda gpu: [Candidate(4242, 2, False, "me", "python train.py --tag [/x] [b]bold")])
    app = tui_app.LoadertopApp(None)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        table = app.screen.query_one("#trainers")
        assert "[/x] [b]bold" in str(table.get_row_at(0)[4])


# --- /proc that refuses us ---------------------------------------------------------------------


def test_proc_entries_we_may_not_read_are_gone_to_us_not_a_crash(tmp_path, monkeypatch):
    from loadertop.probes import procfs

    fake = tmp_path / "proc"
    (fake / "77" / "task" / "77").mkdir(parents=True)
    (fake / "77" / "stat").write_text("77 (python) S 1 " + "0 " * 48)
    (fake / "77" / "task" / "77" / "children").write_text("78")

    def refuse(path, *a, **kw):
        if path.startswith(str(fake)):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **kw)

    real_open = os.open
    monkeypatch.setattr(procfs, "PROC", str(fake))
    monkeypatch.setattr(procfs.os, "open", refuse)
    assert procfs.read_stat(77) is None
    assert procfs.children(77) == []
    assert procfs.hidden(77)


# --- process names anyone can set ------------------------------------------------------------


def test_a_pt_data_worker_name_counts_only_under_a_python_trainer_with_torch():
    # Anyone can name a process pt_data_worker, and a binary python: under a shell, or under
    # a Python that has no torch loaded, it must not pose as a loader (the CPU split would
    # shrink other jobs' share, and the picker would list it). Under a Python that loaded
    # torch it is one.
    from loadertop.probes import host, procfs

    forking = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    open('/proc/self/comm', 'w').write('pt_data_worker')\n"
               "time.sleep(60)\n")
    shell = subprocess.Popen(["sh", "-c", "(printf pt_data_worker > /proc/self/comm; sleep 60; :); :"])
    bare = subprocess.Popen([sys.executable, "-c", forking])
    real = subprocess.Popen([sys.executable, "-c", "import torch\n" + forking])

    def named(parent: int) -> bool:
        return any((st := procfs.read_stat(c)) and st.comm == "pt_data_worker" for c in procfs.children(parent))

    try:
        wait_for(lambda: named(shell.pid) and named(bare.pid) and named(real.pid), 60)
        owners = host.dataloader_owners()
        assert owners.get(real.pid) == 1
        assert shell.pid not in owners and bare.pid not in owners
    finally:
        for p in (shell, bare, real):
            subprocess.run(["pkill", "-KILL", "-P", str(p.pid)], check=False)
            p.kill()
            p.wait()


def test_the_demos_images_go_only_into_a_folder_of_the_users_own(tmp_path):
    # Another user made the shared folder first and planted a link where an image goes:
    # the demo (run as root) turned a root-only file into a JPEG.
    pytest.importorskip("PIL")
    from loadertop.demo.images import UnsafeFolder, private_folder, write_images

    victim = tmp_path / "victim"
    victim.write_text("root's own")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    (shared / "img-500x375-00000.jpg.1234.tmp").symlink_to(victim)
    with pytest.raises(UnsafeFolder, match="only it may write to"):
        write_images(str(shared), 1)
    linked = tmp_path / "linked"
    linked.symlink_to(shared)
    with pytest.raises(UnsafeFolder):
        private_folder(str(linked))
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, 65534)
        with pytest.raises(UnsafeFolder):
            private_folder(str(other))
    own = tmp_path / "own"
    paths = write_images(str(own), 2, 64, 48)
    assert [os.path.basename(p) for p in paths] == ["img-64x48-00000.jpg", "img-64x48-00001.jpg"]
    assert os.stat(own).st_mode & 0o777 == 0o700 and victim.read_text() == "root's own"
    assert sorted(os.listdir(own)) == ["img-64x48-00000.jpg", "img-64x48-00001.jpg"]  # no temp file left


def test_a_cpu_line_cut_short_in_proc_stat_is_skipped_not_a_crash(tmp_path, monkeypatch):
    # The suite's random-fault test found an IndexError here with one seed.
    from loadertop.probes import procfs

    fake = tmp_path / "proc"
    fake.mkdir()
    (fake / "stat").write_text("cpu  10 0 10 80 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0\ncpu1 5 0\ncpu2\nintr 1\n")
    monkeypatch.setattr(procfs, "PROC", str(fake))
    assert procfs.read_per_cpu_times() == {0: (10, 50)}


def test_other_users_job_names_are_served_masked_unless_asked():
    # The fourth review: the node agent (root) served every local user the job ids it read from
    # other users' owner-only /proc/PID/environ. Masked, they still join a job across nodes.
    from loadertop.outputs.export import Exporter
    from loadertop.probes.launch import masked

    theirs = trainer(pid=4000, job_id="run:exp7@uid65534", owner_uid=65534)
    mine = trainer(pid=5000, job_id="run:mine@uid0", owner_uid=os.geteuid())
    sampler = SimpleNamespace(tick=lambda: snapshot(0, [theirs, mine]), close=lambda: None)
    for job_names, shown in ((False, masked("run:exp7@uid65534")), (True, "run:exp7@uid65534")):
        exporter = Exporter(sampler, interval_s=1.0, job_names=job_names)
        exporter.sample_once()
        text = _text(exporter)
        assert f'train_job="{shown}"' in text and ("exp7" in text) == job_names
        assert 'train_job="run:mine@uid0"' in text  # this user's own: as is
    assert masked("run:exp7@uid65534") == masked("run:exp7@uid65534") != masked("run:exp8@uid65534")
    assert masked("run:exp7@uid65534").endswith("@uid65534") and masked("node-a/77") == "node-a/77"
