"""Rules on synthetic histories: each fires, stays quiet just below its threshold, holds and
clears with hysteresis, and says nothing (without crashing) when data is missing. What the
plan proposes, and why, is tests/test_plan.py's."""

from __future__ import annotations

import pytest
from support.synth import T0, TRAINER, data_wait, gpu, host, process, replace, snapshot, story, trainer, worker_exit

from loadertop.model import ShmSnapshot
from loadertop.rules import Diagnoser, diagnose
from loadertop.rules import thresholds as T


def ids(findings) -> list[str]:
    return [f.id for f in findings]


def only(findings, rule_id):
    matching = [f for f in findings if f.id == rule_id]
    assert len(matching) == 1, ids(findings)
    return matching[0]


def _with_workers(t, **worker_kw):
    return replace(t, workers=tuple(replace(w, **worker_kw) for w in t.workers))


# --- input_bound -------------------------------------------------------------------


def test_input_bound_cpu_bound_workers_with_idle_cpus_gets_more_workers():
    h = story(30, lambda t: snapshot(t, [trainer(workers=1, worker_cpu=97.0, wait=0.8)], host(cpu=20.0)))
    f = only(diagnose(h), "input_bound")
    assert f.severity == "critical"
    assert f.change["DataLoader"]["num_workers"] > 1 and f.change["dataset"] == "D"
    assert "num_workers=1 -> " in f.suggestion and "steps/s" in f.suggestion
    assert f.evidence["worker_cpu_percent"] == 97.0 and f.evidence["cause"] == "loader_cpu"


@pytest.mark.parametrize("wait,expected", [(T.DATA_WAIT_WARNING - 0.01, None), (T.DATA_WAIT_WARNING + 0.001, "warning"),
                                           (T.DATA_WAIT_CRITICAL - 0.01, "warning"), (T.DATA_WAIT_CRITICAL + 0.001, "critical")])
def test_input_bound_thresholds(wait, expected):
    # With plenty of samples the thresholds are exact...
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(wait, samples=10**7))], host(cpu=20.0)))
    found = [f.severity for f in diagnose(h) if f.id == "input_bound"]
    assert found == ([expected] if expected else [])


def test_a_share_within_its_sampling_error_is_not_evidence():
    # ...with 100 samples, 5.5% is well within the sampling error (2.3 pts) of 5%: no alarm.
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.055, samples=100))], host(cpu=20.0)))
    assert diagnose(h) == []
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.087, samples=69))], host(cpu=20.0)))
    assert diagnose(h) == []  # the healthy demo's borderline reading: not an alarm
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.15, samples=100))], host(cpu=20.0)))
    assert [f.severity for f in diagnose(h)] == ["warning"]


def test_input_bound_needs_enough_samples_and_data():
    few = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.9, samples=T.MIN_STACK_SAMPLES - 1))]))
    assert "input_bound" not in ids(diagnose(few))
    missing = story(30, lambda t: snapshot(t, [trainer(wait=None)]))
    assert diagnose(missing) == []
    unknown_cpu = story(30, lambda t: snapshot(t, [trainer(worker_cpu=None, wait=0.5)], host(cpu=None)))
    assert ids(diagnose(unknown_cpu)) == ["input_bound"]  # still said


def test_hysteresis_holds_before_raising_and_before_clearing():
    def make(t):
        wait = 0.5 if 0 <= t < 40 else 0.01
        return snapshot(t, [trainer(wait=data_wait(wait, window=1.0))], host(cpu=20.0))

    d = Diagnoser()
    raised_at = cleared_at = None
    for t in range(80):
        active = "input_bound" in ids(d.feed(make(t)))
        if active and raised_at is None:
            raised_at = t
        if raised_at is not None and not active and cleared_at is None:
            cleared_at = t
    assert raised_at is not None and raised_at >= T.HOLD_S - 1
    assert cleared_at is not None and cleared_at >= 40 + T.CLEAR_S


def test_a_finding_clears_when_nothing_supports_it_any_more():
    # The data wait goes missing (py-spy refused, the hook gone): "cannot tell" clears too,
    # after CLEAR_S, instead of keeping a finding on screen forever.
    def make(t):
        wait = data_wait(0.5, window=1.0) if t < 30 else None
        return snapshot(t, [trainer(wait=wait)], host(cpu=20.0))

    d = Diagnoser()
    states = {t: "input_bound" in ids(d.feed(make(t))) for t in range(80)}
    assert states[29] and states[30 + T.CLEAR_S - 1]
    assert not states[30 + T.CLEAR_S]


def test_a_gap_in_the_evidence_does_not_restart_the_hold():
    def make(t):
        wait = None if t in (3, 4) else data_wait(0.5, window=1.0)
        return snapshot(t, [trainer(wait=wait)], host(cpu=20.0))

    d = Diagnoser()
    first = next(t for t in range(40) if "input_bound" in ids(d.feed(make(t))))
    assert first == T.HOLD_S - 1


def test_no_flapping_on_a_noisy_signal_around_the_threshold():
    def make(t):
        wait = 0.5 if t % 2 else 0.01  # a flapping signal never holds for HOLD_S
        return snapshot(t, [trainer(wait=data_wait(wait, window=1.0))], host(cpu=20.0))

    d = Diagnoser()
    states = [("input_bound" in ids(d.feed(make(t)))) for t in range(60)]
    assert not any(states)


def test_a_py_spy_window_counts_as_held_time():
    # A snapshot report's single 30 s window is enough evidence on its own.
    h = [snapshot(0, [trainer(wait=None)]), snapshot(1, [trainer(wait=data_wait(0.5, window=30.0))], host(cpu=20.0))]
    assert "input_bound" in ids(diagnose(h))


def test_a_held_finding_speaks_with_the_latest_plan():
    # The window changes while a finding is held: its change follows the plan, so it never
    # disagrees with a finding raised later.
    def make(t):
        cpu = 20.0 if t < 20 else 97.0
        return snapshot(t, [trainer(workers=1, worker_cpu=cpu, wait=0.8)], host(cpu=20.0))

    d = Diagnoser()
    for t in range(40):
        found = d.feed(make(t))
    f = only(found, "input_bound")
    plan = d.plan(TRAINER, T0 - 200)
    assert f.change == plan.change("workers")


# --- main_process_bound --------------------------------------------------------------


def test_main_process_bound_with_num_workers_0():
    h = story(30, lambda t: snapshot(t, [trainer(workers=0, wait=data_wait(0.6, main=0.58),
                                                 main=process(TRAINER, 95.0))]))
    found = diagnose(h)
    f = only(found, "main_process_bound")
    assert f.change["DataLoader"]["num_workers"] > 0 and f.change["DataLoader"]["persistent_workers"] is True
    assert "input_bound" not in ids(found)


def test_main_process_bound_quiet_when_workers_are_the_wait():
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.6, main=0.04))], host(cpu=20.0)))
    assert "main_process_bound" not in ids(diagnose(h))


def test_workers_with_batches_ready_mean_the_wait_is_receiving_them():
    # What CI saw on a busy 2-core machine: 16% data wait, workers at 3% CPU, every worker
    # waiting for indices. More workers would not help; the hand-over is the cost.
    def make(t):
        tr = _with_workers(trainer(workers=2, worker_cpu=3.0, wait=0.16, usable=2), doing="waiting for indices",
                           doing_at=T0 + t)
        return snapshot(t, [tr], host(2))

    found = diagnose(story(30, make))
    assert "input_bound" not in ids(found)
    f = only(found, "main_process_bound")
    assert f.evidence["main_process_fraction"] == 0.16 and f.evidence["workers_waiting_for_indices"] is True
    assert "more workers will not help" in f.suggestion and f.change is None


def test_stale_or_contradicted_waiting_for_indices_does_not_decide():
    # A dump from minutes ago, or workers busy computing: the loader is not ahead.
    def make(t, doing_at, cpu):
        tr = _with_workers(trainer(workers=2, worker_cpu=cpu, wait=0.4, usable=8), doing="waiting for indices",
                           doing_at=doing_at)
        return snapshot(t, [tr], host(8, cpu=30.0))

    stale = diagnose(story(30, lambda t: make(t, T0 - 300, 10.0)))
    assert "input_bound" in ids(stale) and "main_process_bound" not in ids(stale)
    busy = diagnose(story(30, lambda t: make(t, T0 + t, 97.0)))
    assert "input_bound" in ids(busy) and "main_process_bound" not in ids(busy)


def test_one_straggler_still_makes_the_loop_input_bound():
    def make(t):
        tr = trainer(workers=4, worker_cpu=10.0, wait=0.3, usable=2)
        idle = [replace(w, doing="waiting for indices", doing_at=T0 + t) for w in tr.workers[1:]]
        return snapshot(t, [replace(tr, workers=(tr.workers[0], *idle))], host(2))

    found = diagnose(story(30, make))
    assert "input_bound" in ids(found) and "main_process_bound" not in ids(found)


# --- worker_threads / cpu_oversubscribed / too_many_workers ---------------------------


def test_worker_threads_fires_on_busy_pools_that_outnumber_the_cpus_not_on_thread_count():
    busy = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=8, threads=11)]))
    f = only(diagnose(busy), "worker_threads")
    assert f.change == {"env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    assert f.severity == "critical"  # 16 busy on 8 CPUs
    idle_pool = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=1, threads=11)]))
    assert diagnose(idle_pool) == []
    unknown = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=None)]))
    assert diagnose(unknown) == []
    fits = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0, usable=64), busy_threads=3)], host(64)))
    assert "worker_threads" not in ids(diagnose(fits))  # 6 busy threads on 64 CPUs: nothing to fix


def test_worker_threads_reads_what_is_already_set():
    # OMP_NUM_THREADS=1 is set and the pools still run: the environment cannot be the fix.
    def make(t, env, main_threads=1, pools=("OpenMP", "OpenCV")):
        tr = _with_workers(trainer(wait=0.0, env=env, main=process(TRAINER, 90.0, busy_threads=main_threads)),
                           busy_threads=8, thread_pools=pools)
        return snapshot(t, [tr])

    f = only(diagnose(story(30, lambda t: make(t, (("OMP_NUM_THREADS", "1"),)))), "worker_threads")
    assert f.change == {"DataLoader": {"worker_init_fn": "lambda _: (torch.set_num_threads(1), cv2.setNumThreads(0))"}}
    assert "already set" in f.suggestion and "OpenCV" in f.title
    # The main process computes on 4 threads: the limit goes in the workers only.
    f = only(diagnose(story(30, lambda t: make(t, (), main_threads=4, pools=("OpenMP",)))), "worker_threads")
    assert f.change == {"DataLoader": {"worker_init_fn": "lambda _: torch.set_num_threads(1)"}}


def test_cpu_oversubscribed_by_the_trainers_own_pools():
    def make(t, rq):
        tr = _with_workers(trainer(workers=6, wait=0.0, usable=2), runqueue_wait_s_per_s=rq, busy_threads=2)
        return snapshot(t, [tr], host(2, cpu=100.0, load=9.0))

    found = diagnose(story(30, lambda t: make(t, 0.4)))
    f = only(found, "cpu_oversubscribed")
    threads = only(found, "worker_threads")
    assert f.change["env"] == threads.change["env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert ids(found)[:2] == ["cpu_oversubscribed", "worker_threads"]  # the root cause first


def test_too_many_workers_across_trainers_on_the_host():
    def make(t):
        trainers = [_with_workers(trainer(workers=2, wait=0.0, usable=2, cpu_set=(0, 1)), runqueue_wait_s_per_s=0.5,
                                  cpu_percent=48.0),
                    _with_workers(trainer(workers=2, wait=0.0, usable=2, pid=5000, cpu_set=(0, 1)),
                                  runqueue_wait_s_per_s=0.5, cpu_percent=48.0)]
        return snapshot(t, trainers, host(2, cpu=98.0, dataloader_workers=4, dataloader_trainers=2))

    found = [f for f in diagnose(story(30, make)) if f.id == "too_many_workers"]
    assert {f.trainer_pid for f in found} == {TRAINER, 5000}
    assert all(f.change["DataLoader"] == {"num_workers": 1} for f in found)
    assert "cpu_oversubscribed" not in ids(diagnose(story(30, make)))  # one finding for one cause
    alone = story(30, lambda t: snapshot(t, [trainer(workers=4, wait=0.0, usable=2)],
                                         host(2, cpu=98.0, dataloader_workers=4, dataloader_trainers=1)))
    assert "too_many_workers" not in ids(diagnose(alone))


def test_a_job_whose_share_covers_its_worker_and_main_process_has_none_too_many():
    # Issue 35: "2 DataLoader jobs share 2 CPUs; this one's share is 0.9" for a job with one
    # worker, beside another job that took the rest.
    def make(t):
        light = _with_workers(trainer(workers=1, wait=0.0, usable=2, cpu_set=(0, 1), main=process(TRAINER, 20.0)),
                              runqueue_wait_s_per_s=0.1, cpu_percent=30.0)
        heavy = _with_workers(trainer(workers=3, wait=0.0, usable=2, pid=5000, cpu_set=(0, 1)),
                              runqueue_wait_s_per_s=0.5, cpu_percent=48.0)
        return snapshot(t, [light, heavy], host(2, cpu=98.0, dataloader_workers=4, dataloader_trainers=2))

    found = [f for f in diagnose(story(30, make)) if f.id == "too_many_workers"]
    assert TRAINER not in {f.trainer_pid for f in found}


# --- churn, deaths ---------------------------------------------------------------------


def test_worker_respawn():
    def make(t):
        tr = trainer(wait=0.0, worker_respawns=2 * (t // 10))
        return snapshot(t, [replace(tr, loaders=(replace(tr.loaders[0], persistent_workers=False),))])

    f = only(diagnose(story(40, make)), "worker_respawn")
    assert f.change == {"DataLoader": {"persistent_workers": True}}
    steady = story(40, lambda t: snapshot(t, [trainer(wait=0.0)]))
    assert diagnose(steady) == []


def test_worker_died_is_immediate_and_normal_exits_are_not_deaths():
    def make(t, code):
        return snapshot(t, [trainer(wait=0.0)], events=[worker_exit(t, TRAINER + 1, code)] if t == 3 else [])

    f = only(diagnose(story(5, lambda t: make(t, 9))), "worker_died")
    assert f.severity == "critical" and f.evidence["worker_pid"] == TRAINER + 1 and "OOM" in f.suggestion
    assert diagnose(story(5, lambda t: make(t, 0))) == []
    assert diagnose(story(5, lambda t: make(t, None))) == []


# --- memory and shm ----------------------------------------------------------------


def test_shm_pressure_suggests_a_size():
    def make(t, used):
        return snapshot(t, [trainer(wait=0.0, shm=ShmSnapshot("/proc/1/root/dev/shm", 64 << 20, used, 40 << 20))])

    f = only(diagnose(story(30, lambda t: make(t, 62 << 20))), "shm_pressure")
    assert f.severity == "critical" and f.change["docker"] == {"shm_size": "128m"}
    assert "--shm-size=128m" in f.suggestion
    assert diagnose(story(30, lambda t: make(t, 50 << 20))) == []  # 78%: just below
    assert diagnose(story(30, lambda t: snapshot(t, [trainer(wait=0.0, shm=None)]))) == []


def _growing(seconds, uss_per_s, rss_per_s=0.0, workers=2, shape=lambda t: t, available=32 << 30):
    def make(t):
        tr = trainer(wait=0.0, workers=workers)
        ws = tuple(replace(w, started_at=T0 - 60, uss_bytes=(20 << 20) + int(uss_per_s * shape(t)),
                           rss_bytes=(300 << 20) + int(rss_per_s * t), memory_sampled_at=T0 + t) for w in tr.workers)
        return snapshot(t, [replace(tr, workers=ws)], host(mem_available_bytes=available))

    return story(seconds, make)


def test_worker_memory_growth_copy_on_read():
    f = only(diagnose(_growing(60, 1 << 20, available=4 << 30)), "worker_memory_growth")  # 60 MiB/min, 4 GiB free
    assert "numpy" in f.suggestion and 0 < f.evidence["hours_to_oom"] < T.MEMORY_GROWTH_MATTERS_HOURS
    assert diagnose(_growing(60, 1 << 20, 1 << 20, available=4 << 30)) == []  # RSS too: not copy-on-read
    assert diagnose(_growing(60, 1 << 10, available=4 << 30)) == []  # too slow to matter
    assert diagnose(_growing(10, 1 << 20, available=4 << 30)) == []  # too short to tell


def test_worker_memory_warm_up_and_slow_growth_are_not_alarms():
    # The starved demo after 25 s: 4.7 MiB/min with R² 0.81, settling. Warm-up flattens;
    # and 5 MiB/min with 20 GiB free would take days to matter.
    settling = _growing(120, 200 << 10, shape=lambda t: 60 * (1 - 0.97 ** t), available=4 << 30)
    assert diagnose(settling) == []
    slow = _growing(300, 80 << 10, workers=1, available=20 << 30)  # 4.7 MiB/min, steady
    assert diagnose(slow) == []


# --- GPU and stalls ----------------------------------------------------------------


def test_pin_memory_off_needs_gpu_evidence():
    cpu_only = story(30, lambda t: snapshot(t, [trainer(wait=0.0)]))
    assert diagnose(cpu_only) == []
    on_gpu = story(30, lambda t: snapshot(t, [trainer(wait=0.0, gpus=(0,))], gpus=[gpu()]))
    f = only(diagnose(on_gpu), "pin_memory_off")
    assert f.change == {"DataLoader": {"pin_memory": True}} and f.severity == "warning"
    pinned = story(30, lambda t: snapshot(t, [trainer(wait=0.0, gpus=(0,), pin_memory_thread=True)], gpus=[gpu()]))
    assert diagnose(pinned) == []


def test_input_bound_carries_gpu_evidence_and_a_busy_gpu_lowers_it():
    def make(util, wait):
        return story(30, lambda t: snapshot(t, [trainer(workers=1, worker_cpu=97.0, wait=wait, gpus=(0,),
                                                        pin_memory_thread=True)], host(cpu=20.0), gpus=[gpu(util=util)]))

    f = only(diagnose(make(25.0, 0.6)), "input_bound")
    assert f.evidence["gpu_utilization_percent"] == 25.0 and "GPU utilization is 25%" in f.title
    assert f.severity == "critical"
    # The GPU busy 95% of the time with 25% host wait: still worth saying, one level lower.
    assert only(diagnose(make(95.0, 0.25)), "input_bound").severity == "warning"
    assert "input_bound" not in ids(diagnose(make(95.0, 0.1)))


def test_loader_stalled_when_workers_are_stopped_or_idle():
    def make(t, status, cpu, switches=0.0):
        tr = _with_workers(trainer(wait=data_wait(1.0, stalled=float(t))), status=status, cpu_percent=cpu,
                           ctx_switches_voluntary_per_s=switches, ctx_switches_involuntary_per_s=0.0)
        return snapshot(t, [tr])

    f = only(diagnose(story(12, lambda t: make(t, "stopped", 0.0))), "loader_stalled")
    assert f.severity == "critical" and "stopped" in f.title and f.change is None
    assert "loader_stalled" in ids(diagnose(story(12, lambda t: make(t, "sleeping", 0.1))))
    assert "loader_stalled" not in ids(diagnose(story(40, lambda t: make(t, "running", 90.0, 300.0))))
    # Idle workers are a hang after HANG_MIN_S of waiting; stopped ones, which deliver nothing
    # however short the wait, after HANG_STOPPED_MIN_S (py-spy's 3 s first look names it).
    assert "loader_stalled" not in ids(diagnose(story(4, lambda t: make(t, "sleeping", 0.1))))
    assert "loader_stalled" in ids(diagnose(story(4, lambda t: make(t, "stopped", 0.0))))
    assert "loader_stalled" not in ids(diagnose(story(2, lambda t: make(t, "stopped", 0.0))))
    # Never "add workers" to a hang.
    assert not any(f.change for f in diagnose(story(12, lambda t: make(t, "stopped", 0.0))))


def test_loader_stalled_when_every_stack_stays_on_one_frame():
    def make(t, frame):
        tr = _with_workers(trainer(wait=data_wait(1.0, stalled=float(t))), doing=frame(t), doing_at=T0 + t - t % 5,
                           cpu_percent=100.0, ctx_switches_voluntary_per_s=50.0)
        return snapshot(t, [tr])

    stuck = diagnose(story(30, lambda t: make(t, lambda _: "spin (lock.py:3)")))
    assert only(stuck, "loader_stalled").evidence["how"] == "one frame"
    moving = diagnose(story(30, lambda t: make(t, lambda t: f"decode (img.py:{t % 7})")))
    assert "loader_stalled" not in ids(moving)

    # A CPU-bound item's hot loop is one line too: two dumps on it are not yet a hang.
    def sparse(t):
        tr = _with_workers(trainer(wait=data_wait(1.0, stalled=float(t))), doing="work (items.py:3)",
                           doing_at=T0 + t - t % 15, cpu_percent=100.0, ctx_switches_voluntary_per_s=50.0)
        return snapshot(t, [tr])

    assert "loader_stalled" not in ids(diagnose(story(30, sparse)))


def test_healthy_job_has_no_findings_at_all():
    h = story(120, lambda t: snapshot(t, [trainer(workers=4, worker_cpu=60.0, wait=0.01, pin_memory_thread=True,
                                                  gpus=(0,))], host(cpu=55.0), gpus=[gpu(util=97.0)]))
    assert diagnose(h) == []


def test_a_broken_snapshot_never_raises():
    weird = trainer(wait=0.5, usable_cpus=None, workers=0)
    h = story(20, lambda t: snapshot(t, [replace(weird, main=process(TRAINER, None))], host(cpu=None)))
    diagnose(h)  # no exception


def _raising(ctx):
    raise KeyError("num_workers")


def test_a_rule_that_raises_is_a_notice_naming_it_not_a_quiet_job(monkeypatch):
    from loadertop.outputs.report import build_report
    from loadertop.rules import RAISE_RULE_ERRORS, RULES, diagnosed

    monkeypatch.delenv(RAISE_RULE_ERRORS)
    monkeypatch.setitem(RULES, "input_bound", _raising)
    snaps = story(30, lambda t: snapshot(t, [trainer(wait=0.6)], host()))
    d = diagnosed(snaps)
    assert "input_bound" not in {f.id for f in d.findings()}
    [notice] = d.notices()
    assert notice.id == "rule_failed" and notice.trainer_pid == TRAINER
    assert "rule input_bound failed" in notice.message and "KeyError" in notice.message
    report = build_report(snaps, d.diagnosis)
    assert [n["id"] for n in report["notices"]] == ["rule_failed"]
    # The other rules still judge the job.
    assert d.plans


def test_in_the_suite_a_rule_that_raises_fails_the_test(monkeypatch):
    from loadertop.rules import RULES, diagnosed

    monkeypatch.setitem(RULES, "input_bound", _raising)
    with pytest.raises(KeyError):
        diagnosed(story(5, lambda t: snapshot(t, [trainer(wait=0.6)], host())))


def test_one_workers_figures_are_said_of_the_worker_not_each():
    # A user read "the workers compute (92% CPU each ...)" of a job with one worker.
    from support.synth import host, snapshot, story, trainer

    from loadertop.rules import diagnosed

    for n, said, not_said in ((1, "the worker computes (", "CPU each"), (2, "the workers compute (", "the worker ")):
        h = story(30, lambda t, n=n: snapshot(t, [trainer(workers=n, worker_cpu=97.0, wait=0.8, usable=n, cpu_set=tuple(range(n)))],
                                               host(cpu_count=n, cpu=97.0)))
        text = " ".join(f.suggestion for f in diagnosed(h).diagnosis.findings if f.id == "input_bound")
        assert said in text and not_said not in text, text
