"""`loadertop tune`: the plan on its own, then real tunes of the built-in datasets (each in
fresh trial processes), the errors a user's factory can cause, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest
from support.jobs import PYTHON, REPO, descendants, loadertop, state, wait_for

from loadertop.probes.host import usable_cpus
from loadertop.started import can_unshare_shm, shm_wrapper
from loadertop.tune import grid as plan
from loadertop.tune.grid import Config, Trial

# --- the plan (pure) ------------------------------------------------------------------


def test_default_workers_go_past_the_cores_for_io_bound_loaders():
    assert plan.default_workers(2) == [0, 1, 2, 4]
    assert plan.default_workers(8) == [0, 1, 2, 4, 7, 8, 16]
    assert plan.default_workers(64)[-1] == plan.MAX_WORKERS


def test_grid_has_no_prefetch_without_workers():
    configs = plan.grid([0, 2], [2, 4], [False])
    assert configs == [Config(0, None, False), Config(2, 2, False), Config(2, 4, False)]


def _summary(config: Config, *rates: float, shm=None) -> plan.Summary:
    trials = [Trial(config, rate=r, chunk_rates=[r * 0.98, r, r * 1.02]) for r in rates]
    for t in trials:
        if shm:
            t.shm_peak_bytes, t.shm_total_bytes = shm
    return plan.summarize(config, trials, memory_available=2**34)


def test_recommend_the_cheapest_setting_within_a_few_percent_of_the_best():
    s = [_summary(Config(1, 2, False), 100), _summary(Config(2, 2, False), 180),
         _summary(Config(4, 2, False), 196), _summary(Config(8, 2, False), 199)]
    rec = plan.recommend(s, cpu_share=8)
    assert rec.best.config == Config(8, 2, False)
    assert rec.chosen.config == Config(4, 2, False)  # 196 is within 5% of 199; 180 is not
    assert "within" in rec.reasons[0]


def test_noisy_repeats_make_settings_indistinguishable():
    a, b = _summary(Config(2, 2, False), 100, 140), _summary(Config(4, 2, False), 125, 126)
    assert plan.indistinguishable(a, b)
    c, d = _summary(Config(2, 2, False), 100, 101), _summary(Config(4, 2, False), 125, 126)
    assert not plan.indistinguishable(c, d)


def test_settings_over_the_shm_limit_are_never_recommended():
    s = [_summary(Config(2, 2, False), 100), _summary(Config(4, 8, False), 300, shm=(60 * 2**20, 64 * 2**20))]
    rec = plan.recommend(s, cpu_share=2)
    assert rec.chosen.config == Config(2, 2, False)
    assert any("left out" in r and "/dev/shm" in r for r in rec.reasons)


def _with_cpu(summary: plan.Summary, cpu: float) -> plan.Summary:
    for t in summary.trials:
        t.worker_cpu_percent = cpu
    return summary


def test_reasons_tell_io_bound_from_cpu_saturated_and_a_curve_still_climbing():
    io = [_summary(Config(2, 2, False), 100), _with_cpu(_summary(Config(8, 2, False), 390), 6.0)]
    rec = plan.recommend(io, cpu_share=2)
    assert any("mostly wait (I/O)" in r for r in rec.reasons)
    assert any("more may help" in r for r in rec.reasons)  # 390 against 100: still climbing
    cpu = [_summary(Config(2, 2, False), 100), _with_cpu(_summary(Config(4, 2, False), 108), 48.0)]
    rec = plan.recommend(cpu, cpu_share=2)
    assert rec.chosen.config.num_workers == 4
    assert any("keep the CPUs busy" in r for r in rec.reasons)
    assert not any("more may help" in r for r in rec.reasons)  # +8%: flat


def test_outputs_render_the_table_the_line_and_a_well_formed_chart():
    import xml.etree.ElementTree as ET

    from loadertop.tune import output
    from loadertop.tune.result import Machine, TuneResult, TuneSpec

    summaries = [_summary(Config(0, None, False), 50), _summary(Config(2, 2, False), 100),
                 _summary(Config(2, 4, False), 101), _summary(Config(4, 2, False), 120)]
    result = TuneResult(TuneSpec("pkg.data:make"), Machine(4, 0, 4, 2**34), summaries,
                        plan.recommend(summaries, 4), 32, "Faces", ("collate_fn",), False, 30.0, False, "samples/s")
    text = output.to_text(result)
    line = ("DataLoader(dataset, batch_size=32, num_workers=4, prefetch_factor=2, persistent_workers=True, "
            "pin_memory=False, collate_fn=...)")
    assert f"use: {line}" in text and "<- recommended" in text
    assert output.to_dict(result)["recommendation"]["dataloader"] == line
    assert "| workers=4 prefetch=2 |" in output.to_markdown(result)
    page = output.to_html(result)
    svg = page[page.index("<svg"):page.index("</svg>") + 6]
    root = ET.fromstring(svg)
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 2  # prefetch 2 and prefetch 4, each from workers=0


# --- real tunes ---------------------------------------------------------------------


def tune(*args: str, timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    return loadertop("tune", *args, timeout=timeout, **kw)


def tune_json(tmp_path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "tune.json"
    r = tune(*args, "-o", str(out))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r


def free_cpus(seconds: float = 1.0) -> float:
    """CPUs no one used over the last `seconds`, from /proc/stat (what other work leaves)."""
    def times() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, all

    idle0, total0 = times()
    time.sleep(seconds)
    idle1, total1 = times()
    return (os.cpu_count() or 1) * (idle1 - idle0) / max(1, total1 - total0)


def rates(result: dict) -> dict[int, float]:
    return {c["num_workers"]: c["rate"] for c in result["configs"]}


@pytest.mark.live
def test_sleeping_dataset_gets_more_workers_than_cores_and_the_emulated_step_its_data_wait(tmp_path):
    result, r = tune_json(tmp_path, "loadertop.tune.examples:sleepy", "--workers", "1,2,8", "--prefetch", "2",
                          "--per-step-ms", "20", "--budget", "16")
    got = rates(result)
    cpus = usable_cpus(0)
    # Items wait 4 ms each: eight workers overlap eight waits, whatever the core count. One
    # worker makes a batch of 16 in ~70 ms against the 20 ms step, eight keep up with it.
    assert got[8] > 2.5 * got[1], got
    rec = result["recommendation"]
    assert rec["num_workers"] > cpus, (rec, got)
    assert rec["dataloader"] == (f"DataLoader(dataset, batch_size=16, num_workers={rec['num_workers']}, "
                                 "prefetch_factor=2, persistent_workers=True, pin_memory=False)")
    assert f"use: {rec['dataloader']}" in r.stdout
    assert "tune [" in r.stderr  # progress lines where stderr is not a terminal
    assert all(c["first_batch_s"] is not None and c["worker_cpu_percent"] is not None for c in result["configs"])
    # The emulated step: the loop mostly waits with one worker, far less with eight.
    waits = {c["num_workers"]: c["data_wait_fraction"] for c in result["configs"]}
    assert waits[1] > 0.4 and waits[8] < waits[1] - 0.2, waits
    assert result["metric"] == "steps/s"
    assert "data wait" in r.stdout


@pytest.mark.live
def test_cpu_bound_dataset_saturates_at_the_usable_cpus(tmp_path, monkeypatch):
    from loadertop.demo.job import calibrate

    # Timed once here: every trial's items then do the same loop count (a trial that timed
    # itself on a busy moment made its items cheaper, and 4 workers on 2 CPUs look faster).
    monkeypatch.setenv("LOADERTOP_WORK_PER_MS", f"{calibrate():.3f}")
    cpus = usable_cpus(0)
    many = 2 * cpus
    free = free_cpus()
    result, _ = tune_json(tmp_path, "loadertop.tune.examples:cpu_bound", "--workers", f"1,{cpus},{many}",
                          "--prefetch", "2", "--budget", "20")
    got = rates(result)
    # Rising up to the CPUs, then flattening: past them, workers queue for the same CPUs.
    # Some is still won there (extra workers take the CPUs from the trial's main process and
    # fill them while others hand batches over), and this VM's speed drifts by 10-20%
    # between settings, so the bounds compare each worker's yield, not exact linearity.
    # Beside other work the CPUs free are fewer: beside two busy loops on 2 CPUs 1, 2 and 4
    # workers ran alike (459, 461, 450 items/s), as they should. The rise is asked for only
    # where the CPUs were free.
    # Past the CPUs each worker yields less, where they were free: beside busy loops more
    # workers take a larger share of the CPUs from them (1, 2, 4 workers: 329, 361, 668 items/s).
    if free >= cpus - 0.5:
        below = (got[cpus] - got[1]) / (cpus - 1)
        assert below > 0.35 * got[1], (got, free)
        assert got[many] / many < 0.8 * got[cpus] / cpus, got
        assert got[many] < 1.5 * got[cpus], got
    busy = [c["worker_cpu_percent"] for c in result["configs"] if c["num_workers"] == 1]
    assert busy[0] > 50, "a CPU-bound worker computes most of the time"


@pytest.mark.live
@pytest.mark.skipif(not can_unshare_shm(), reason="unshare of a mount namespace is not permitted here")
def test_settings_that_overflow_a_small_dev_shm_are_left_out(tmp_path):
    out = tmp_path / "tune.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 4 MiB samples in batches of 4: 16 MiB a batch; 4 workers x prefetch 4 hold 16 batches.
    r = subprocess.run(
        [*shm_wrapper("64m"), PYTHON, "-m", "loadertop", "tune",
         "loadertop.tune.examples:large", "--workers", "1,4", "--prefetch", "1,4", "--budget", "24",
         "--first-batch-timeout", "20", "-o", str(out)],
        capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    big = next(c for c in result["configs"] if c["num_workers"] == 4 and c["prefetch_factor"] == 4)
    assert "/dev/shm" in big["excluded"], big  # it crashed (full) or came within a batch of doing so
    rec = result["recommendation"]
    assert (rec["num_workers"], rec["prefetch_factor"]) != (4, 4)
    chosen = next(c for c in result["configs"] if c["recommended"])
    assert chosen["shm_peak_bytes"] <= 0.8 * 64 * 2**20 and chosen["shm_total_bytes"] == 64 * 2**20


def test_a_batch_lost_to_a_full_dev_shm_is_seen_on_the_trials_stderr(tmp_path):
    from loadertop.tune.runner import _StderrWatch

    # What torch prints when a worker's queue feeder cannot put a batch in /dev/shm: the
    # batch is dropped and the loader then waits for it forever.
    lines = ["Traceback (most recent call last):",
             '  File "/usr/lib/python3.11/multiprocessing/queues.py", line 244, in _feed',
             "RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)"]
    with open(tmp_path / "stderr", "w+b") as f:
        watch = _StderrWatch(f)
        f.write(b"UserWarning: This DataLoader will create 4 worker processes\n")
        f.flush()
        assert watch.shm_full() is None
        f.write(("\n".join(lines) + "\n").encode())
        f.flush()
        offset = f.tell()
        found = watch.shm_full()
        assert found == "RuntimeError: unable to allocate shared memory(shm): No space left on device (28)"
        assert f.tell() == offset  # the trial keeps writing where it was


# --- the user's mistakes ------------------------------------------------------------


def _user_module(tmp_path, body: str) -> str:
    (tmp_path / "mydata.py").write_text(textwrap.dedent(body))
    return str(tmp_path)


def test_a_factory_that_raises_is_one_line_with_where(tmp_path):
    cwd = _user_module(tmp_path, """
        def make():
            raise FileNotFoundError("/data/train.csv")
    """)
    r = tune("mydata:make", "--workers", "0", "--budget", "5", cwd=cwd)
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]  # after the progress lines
    assert line.startswith("loadertop: ") and "Traceback" not in r.stderr
    assert "FileNotFoundError: /data/train.csv" in line and "mydata.py:3 in make" in line


def test_not_a_dataset_and_missing_names_are_one_line(tmp_path):
    cwd = _user_module(tmp_path, """
        def make():
            return 42
    """)
    r = tune("mydata:make", "--budget", "5", cwd=cwd)
    assert r.returncode == 2 and "returned int, not a Dataset" in r.stderr.strip().splitlines()[-1]
    r = tune("mydata:nothing", "--budget", "5", cwd=cwd)
    assert r.returncode == 2 and "has no 'nothing'" in r.stderr
    r = tune("nosuchmodule:make", "--budget", "5", cwd=cwd)
    assert r.returncode == 2 and "No module named 'nosuchmodule'" in r.stderr
    r = tune("mydata", cwd=cwd)
    assert r.returncode == 2 and "MODULE:FACTORY" in r.stderr
    r = tune("mydata:make", "--workers", "two", cwd=cwd)
    assert r.returncode == 2 and "comma-separated" in r.stderr


def test_a_failing_item_in_workers_ends_that_setting_only(tmp_path):
    cwd = _user_module(tmp_path, """
        import torch
        from torch.utils.data import Dataset

        class Flaky(Dataset):
            def __len__(self):
                return 10_000
            def __getitem__(self, i):
                if i == 40:
                    raise ValueError("corrupt record 40")
                return torch.zeros(8)

        def make():
            return Flaky(), {"batch_size": 4, "shuffle": False}
    """)
    r = tune("mydata:make", "--workers", "0,2", "--prefetch", "2", "--budget", "12", cwd=cwd)
    assert r.returncode == 1, (r.stdout, r.stderr)  # nothing could be measured, each setting said why
    assert r.stdout.count("ValueError: corrupt record 40") == 2, r.stdout
    assert "mydata.py" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_a_hanging_factory_times_out(tmp_path):
    cwd = _user_module(tmp_path, """
        import time

        def make():
            time.sleep(600)
    """)
    started = time.monotonic()
    r = tune("mydata:make", "--workers", "0", "--budget", "5", "--first-batch-timeout", "3", cwd=cwd, timeout=60)
    assert r.returncode == 2 and "did not return within 3 s" in r.stderr, r.stderr
    assert time.monotonic() - started < 30


@pytest.mark.live
def test_ctrl_c_stops_early_reports_and_leaves_nothing_running(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([PYTHON, "-m", "loadertop", "tune", "loadertop.tune.examples:sleepy",
                             "--workers", "1,2,4,8", "--prefetch", "2", "--budget", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # Wait until the first setting is measured and the second is running.
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "workers=2 prefetch=2 (2/" in line:
                break
        assert any("workers=1 prefetch=2:" in ln for ln in lines), lines
        wait_for(lambda: len(descendants(proc.pid)) >= 2, what="the second trial and its workers")
        trial_procs = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "stopped early" in out and "workers=1 prefetch=2" in out
    wait_for(lambda: not [p for p in trial_procs if state(p) not in (None, "Z")], timeout=10,
             what="trial processes gone")


def test_a_hanging_dataset_ends_its_setting_and_the_budget_bounds_the_rest(tmp_path):
    cwd = _user_module(tmp_path, """
        import time
        import torch
        from torch.utils.data import Dataset

        class Stuck(Dataset):
            def __len__(self):
                return 100
            def __getitem__(self, i):
                time.sleep(600)

        def make():
            return Stuck()
    """)
    started = time.monotonic()
    r = tune("mydata:make", "--workers", "0,1,2", "--prefetch", "2", "--budget", "2", "--first-batch-timeout", "3",
             cwd=cwd, timeout=90)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no first batch within 3 s" in r.stdout
    assert "not run, the budget was overrun" in r.stdout and "workers=2 prefetch=2" in r.stdout
    assert time.monotonic() - started < 45
