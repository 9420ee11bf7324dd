"""Small pure pieces: /proc parsing, the bounded history. Redaction: tests/test_redact.py."""

import pytest

from loadertop.notices import describe_exit
from loadertop.probes import procfs
from loadertop.sampler import History


def test_parse_stat_with_hostile_comm():
    fields = ["S", "1", "1", "1", "0", "-1", "4194560"] + ["0"] * 4 + ["7", "5"] + ["0"] * 4
    fields += ["3", "0", "12345", "100", "50"] + ["0"] * 27 + ["9"]  # field 52: exit code
    st = procfs.parse_stat(("42 (evil) (name ) " + " ".join(fields)).encode())
    assert st.pid == 42 and st.comm == "evil) (name "
    assert st.state == "S" and st.ppid == 1 and st.cpu_ticks == 12
    assert st.num_threads == 3 and st.start_ticks == 12345
    assert st.rss_bytes == 50 * procfs.PAGE_SIZE and st.exit_code is None  # only a zombie's counts
    zombie = procfs.parse_stat(("42 (evil) (name ) Z " + " ".join(fields[1:])).encode())
    assert zombie.state == "Z" and zombie.exit_code == 9 and zombie.rss_bytes == st.rss_bytes


def test_read_stat_of_self_matches_os():
    import os

    st = procfs.read_stat(os.getpid())
    assert st.pid == os.getpid() and st.ppid == os.getppid() and st.state == "R"
    assert procfs.read_stat(999_999_999) is None


def test_files_kept_open_read_fresh_figures_and_close_with_their_process():
    import os
    import subprocess
    import time

    busy = subprocess.Popen(["python3", "-c", "while True: pass"])
    files = procfs.ProcFiles()
    try:
        first = procfs.read_stat(busy.pid, files=files)
        assert files.open_count() == 1
        deadline = time.monotonic() + 20
        while (later := procfs.read_stat(busy.pid, files=files)).cpu_ticks == first.cpu_ticks:
            assert time.monotonic() < deadline, "the kept-open stat never showed new CPU time"
            time.sleep(0.05)
        assert later.start_ticks == first.start_ticks and files.open_count() == 1
        assert procfs.read_ctx_switches(busy.pid, files) is not None and files.open_count() == 2
        files.sweep()  # both read since the last sweep: kept
        assert files.open_count() == 2
        busy.kill()
        busy.wait()
        # Reaped: the open file answers ESRCH, is closed, and the pid reads as gone.
        assert procfs.read_stat(busy.pid, files=files) is None
        assert procfs.read_ctx_switches(busy.pid, files) is None
        files.sweep()
        files.sweep()  # not read since: closed
        assert files.open_count() == 0
        # Over the limit, files are read the plain way and nothing more is kept open.
        small = procfs.ProcFiles(limit=1)
        assert procfs.read_stat(os.getpid(), files=small).pid == os.getpid()
        assert procfs.read_stat(os.getppid(), files=small).pid == os.getppid()
        assert small.open_count() == 1
        small.close()
        assert small.open_count() == 0
    finally:
        busy.kill()
        busy.wait()
        files.close()


def test_history_is_bounded():
    h = History(maxlen=5)
    for i in range(100):
        h.append(i)  # type: ignore[arg-type]
    assert len(h) == 5 and list(h) == [95, 96, 97, 98, 99]


def test_describe_exit():
    assert describe_exit(9) == "killed by SIGKILL"
    assert describe_exit(1 << 8) == "exit status 1"
    assert describe_exit(None) == ""


def test_a_sampled_process_is_the_same_frozen_sample_as_one_built_by_its_constructor():
    import dataclasses
    import os

    from loadertop.model import ProcessSample
    from loadertop.probes import procfs
    from loadertop.probes.processes import ProcessSampler

    sampler = ProcessSampler()
    st = procfs.read_stat(os.getpid())
    sampler.sample(st, 1.0)
    got = sampler.sample(procfs.read_stat(os.getpid()), 2.0, worker_id=3)
    names = {f.name for f in dataclasses.fields(ProcessSample)}
    assert set(vars(got)) == names  # every field, nothing else
    assert got == ProcessSample(**{n: getattr(got, n) for n in names}) and hash(got) is not None
    assert got.worker_id == 3 and got.cpu_percent is not None and got.doing is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.pid = 1
    assert dataclasses.replace(got, doing="x").doing == "x"


def test_busy_threads_come_from_a_second_reading_of_the_threads_alone():
    import subprocess
    import time

    from loadertop.probes.processes import ProcessSampler

    busy = subprocess.Popen(["python3", "-c", "while True: pass"])
    sampler = ProcessSampler(slow_interval_s=60.0, slow_budget_s=1.0)
    try:
        st = procfs.read_stat(busy.pid)
        first = time.time()
        sampler.begin_tick()
        sampler.refresh_slow([st], first)
        sample = sampler.sample(st, first)
        assert sample.memory_sampled_at == first and sample.uss_bytes is not None
        assert sample.busy_threads is None  # one reading of the threads tells no rate
        deadline = time.monotonic() + 20
        while (sample := sampler.sample(st, time.time())).busy_threads is None:
            assert time.monotonic() < deadline, "busy threads never came"
            time.sleep(0.1)
            sampler.begin_tick()
            sampler.refresh_slow([st], time.time())
        assert sample.busy_threads == 1  # its one spinning thread
        # That reading was the threads alone: smaps waits for its own interval.
        assert sample.memory_sampled_at == first
    finally:
        busy.kill()
        busy.wait()


def test_a_trainers_main_thread_is_read_every_tick_on_a_cpu_and_sleeping():
    # The ranks of a job are compared by their main threads tick by tick: a loop that spins
    # reads ~1 CPU, one that sleeps ~0, each from the tick before, with no slow reading.
    import subprocess
    import time

    from loadertop.probes.processes import ProcessSampler

    spin = subprocess.Popen(["python3", "-c", "while True: pass"])
    sleep = subprocess.Popen(["python3", "-c", "import time; time.sleep(60)"])
    sampler = ProcessSampler(slow_interval_s=3600.0)
    try:
        def read(p):
            return sampler.sample(procfs.read_stat(p.pid), time.monotonic(), main_thread=True)
        deadline = time.monotonic() + 20
        while procfs.read_stat(sleep.pid).state != "S":  # past its start-up, asleep
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert read(spin).main_thread_cpu is None  # one reading tells no rate
        read(sleep)
        time.sleep(0.5)
        spinning, sleeping = read(spin), read(sleep)
        # A spinning thread is on a CPU or queued for one, whatever else runs: beside a CPU hog
        # it read 0.41 on a CPU and 0.59 queued.
        assert spinning.main_thread_cpu + spinning.main_thread_runqueue_s_per_s > 0.8, spinning
        assert sleeping.main_thread_cpu < 0.1
        # A worker (main_thread=False) waits for the slow cadence's thread readings.
        assert sampler.sample(procfs.read_stat(spin.pid), time.monotonic()).main_thread_cpu is None
    finally:
        for p in (spin, sleep):
            p.kill()
            p.wait()


def test_the_markdown_report_says_the_verdict_and_the_change_first_and_stays_short():
    # What gets pasted into an issue: one trainer with 8 workers fits in 60 lines, and the
    # verdict, the change and its predicted gain come before any detail.
    from support.synth import host, snapshot, story, trainer

    from loadertop.outputs.report import build_report
    from loadertop.outputs.report_md import render
    from loadertop.rules import diagnosed

    snaps = story(20, lambda t: snapshot(t, [trainer(workers=8, worker_cpu=97.0, wait=0.62, usable=16)],
                                         host(cpu_count=16, cpu=60.0)))
    plans = diagnosed(snaps).plans
    lines = render(build_report(snaps)).splitlines()
    assert len(lines) < 60
    assert lines[0] == "# loadertop report: INPUT-BOUND 62%"
    plan = next(iter(plans.values()))
    assert plan.chosen.num_workers > 8 and plan.gain > 0.3  # 16 free CPUs: more workers
    summary = lines[4]
    assert f"num_workers={plan.chosen.num_workers})" in summary
    assert f"predicted {plan.gain:+.0%} steps/s" in summary
    # The same predicted gain in the finding as in the summary: one plan, one figure.
    assert any(f"~{plan.gain:+.0%} steps/s" in line for line in lines[5:])


def test_the_html_report_draws_one_series_per_worker_and_a_single_point_as_a_dot():
    import re
    from dataclasses import replace

    from support.synth import host, snapshot, story, trainer

    from loadertop.outputs.report import build_report
    from loadertop.outputs.report_html import render

    def make(t):
        tr = trainer(workers=3, wait=0.6)
        if t < 5:  # the stacks have not read the worker ids yet
            tr = replace(tr, workers=tuple(replace(w, worker_id=None) for w in tr.workers))
        return snapshot(t, [tr], host())

    snaps = story(10, make)
    page = render(build_report(snaps), snaps)
    assert page.index('class="summary"') < page.index("<h2>Findings")
    cpu_chart = page[page.index("Worker CPU"):page.index("Worker private memory")]
    assert re.findall(r"&#9632;</span> (w\S+)", cpu_chart) == ["w0", "w1", "w2"]
    assert " s</text>" in cpu_chart and 'class="grid"' in cpu_chart  # a time axis, gridlines
    assert "prefers-color-scheme: dark" in page
    one = render(build_report(snaps[-1:]), snaps[-1:])
    wait_chart = one[one.index("Data wait"):one.index("GPU utilization")]
    assert "<circle" in wait_chart and "<polyline" not in wait_chart
    # A 15 s snapshot whose first py-spy window closed at 10 s: its reading covers those 10 s.
    from loadertop.model import DataWait

    short = story(15, lambda t: snapshot(t, [trainer(wait=DataWait(None, None, None, (), 0, 10.0, 0.0) if t < 10
                                                     else replace(trainer().data_wait, fraction=0.82,
                                                                  window_s=10.0))], host()))
    page = render(build_report(short), short)
    wait_chart = page[page.index("Data wait"):page.index("GPU utilization")]
    assert "<polyline" in wait_chart and "<circle" not in wait_chart


def test_every_rule_has_a_verdict_word():
    # A new rule that the verdict forgets would leave its trainer HEALTHY on the header.
    from loadertop.rules import RULES
    from loadertop.rules.verdict import ORDER

    ids = [i for rule_ids, _, _ in ORDER for i in rule_ids]
    assert sorted(ids) == sorted(RULES)


def test_a_proc_file_longer_than_a_page_is_read_whole():
    # /proc/<pid>/maps hands over about a page a read: reading once kept the first ~4 KiB,
    # so libraries mapped further down (torch's, the thread pools) were never seen.
    import os

    from loadertop.probes import procfs

    with open(f"/proc/{os.getpid()}/maps") as f:
        whole = f.read()
    assert len(whole) > 8192  # this interpreter maps far more than a page's worth
    import re

    libraries = set(re.findall(r"/\S+\.so\S*", whole))
    read = procfs.read_maps(os.getpid())
    assert libraries and all(lib in read for lib in libraries)


def test_the_report_schema_lists_the_vocabulary_word_for_word():
    """Each closed set of words is defined once (vocabulary.py); the schema's enums are the same."""
    import json
    import typing
    from importlib.resources import files

    from loadertop import vocabulary as V
    from loadertop.rules import RULES

    schema = json.loads(files("loadertop").joinpath("schema/report-2.json").read_text())
    trainer = schema["properties"]["trainers"]["items"]["properties"]
    worker = trainer["workers"]["items"]["properties"]
    tune = trainer["loaders"]["items"]["properties"]["tune"]["properties"]
    finding = schema["properties"]["findings"]["items"]["properties"]
    pairs = [
        (trainer["status"], V.TrainerStatus), (trainer["main"]["properties"]["status"], V.ProcessStatus),
        (worker["status"], V.ProcessStatus), (worker["found_by"], V.FoundBy), (tune["state"], V.TunePhase),
        (tune["decisions"]["items"]["properties"]["action"], V.TuneAction),
        (trainer["plan"]["properties"]["cause"], V.Cause), (finding["severity"], V.Severity),
    ]
    for node, words in pairs:
        assert node["enum"] == list(typing.get_args(words)), words
    assert set(finding["id"]["enum"]) == set(RULES)


def test_help_shows_the_live_view_first_and_three_examples(capsys):
    from loadertop.cli import main

    with pytest.raises(SystemExit) as end:
        main(["--help"])
    assert end.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: loadertop [PID ...] [--interval S] [--no-stacks]\n")
    sections = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert sections == ["the live view (the main use):", "commands:", "other options:", "examples:"]
    examples = out.split("examples:\n")[1].splitlines()
    assert [e.split()[:2] for e in examples] == [["loadertop", "41822"], ["loadertop", "snapshot"],
                                                 ["loadertop", "demo"]]
    with pytest.raises(SystemExit):
        main(["snapshot", "--help"])
    assert capsys.readouterr().out.startswith("usage: loadertop snapshot ")


def test_the_hosts_per_cpu_load_is_known_a_second_after_the_first_reading(monkeypatch):
    # Issue 41: read every 5 s from the start, the host's load was unknown for the first 5 s; a
    # first verdict made without it (no other process seen) said INPUT-BOUND of a job beside a
    # CPU hog and held it, where every snapshot said BUSY HOST.
    from loadertop.probes import host, procfs

    ticks = iter([{0: (0, 100), 1: (0, 100)}, {0: (100, 200), 1: (50, 200)}, {0: (200, 300), 1: (60, 300)}])
    monkeypatch.setattr(procfs, "read_per_cpu_times", lambda: next(ticks))
    monkeypatch.setattr(host, "own_cpu_ticks", lambda jobs: 0)
    per_cpu = host._PerCpu()
    per_cpu.refresh(0.0)
    per_cpu.refresh(0.5)
    assert per_cpu.busy_cpus((0, 1)) is None  # one reading: nothing to compare yet
    per_cpu.refresh(1.0)
    assert per_cpu.busy_cpus((0, 1)) == pytest.approx(1.5)
    per_cpu.refresh(3.0)  # then every PERIOD_S
    assert per_cpu.busy_cpus((0, 1)) == pytest.approx(1.5)
    per_cpu.refresh(1.0 + host._PerCpu.PERIOD_S)
    assert per_cpu.busy_cpus((0, 1)) == pytest.approx(1.1)


def test_one_loaders_workers_are_one_loader_whatever_fetcher_each_dump_caught():
    # Issue 45: a webdataset loader of 4 workers was shown as two loaders (w0 and w3 beside w1
    # and w2): each worker's first dump caught it in the iterable fetcher or between batches,
    # and that reading was part of what told loaders apart.
    from support.synth import trainer

    from loadertop.probes.pyspy import WorkerInfo
    from loadertop.sampler import Sampler

    t = trainer(workers=4, loaders=())
    caught = {w.pid: WorkerInfo(k, 4, False, "WebDataset", None, iterable=True if k in (0, 3) else None)
              for k, w in enumerate(t.workers)}

    class Stacks:
        def worker(self, pid):
            return caught[pid]

        def data_wait(self, trainer_pid):
            return None

        def close(self):
            pass

    sampler = Sampler([], stacks=Stacks())
    try:
        (loader,) = sampler._with_stacks(t).loaders
    finally:
        sampler.close()
    assert loader.worker_pids == tuple(w.pid for w in t.workers) and loader.num_workers == 4
    assert loader.iterable is True  # as the fetchers said where a dump caught one


def test_a_proc_file_of_a_process_that_is_exiting_reads_as_gone(monkeypatch):
    # Found beside a CPU hog: `tune` read the mountinfo of a trial that was ending, the open
    # failed with EINVAL, and the user got a traceback instead of the factory's error.
    import errno
    import os

    from loadertop.probes import procfs

    for code in (errno.EINVAL, errno.ESRCH):
        def refuse(path, flags, code=code):
            raise OSError(code, os.strerror(code), path)

        monkeypatch.setattr(os, "open", refuse)
        assert procfs.mountinfo_line(1, "/dev/shm") is None
    monkeypatch.setattr(os, "open", lambda path, flags: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError):
        procfs.mountinfo_line(1, "/dev/shm")  # anything else is not an exit: said, not hidden
