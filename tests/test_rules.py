"""Rules on synthetic histories: each fires, stays quiet just below its threshold, holds and
clears with hysteresis, and says nothing (without crashing) when data is missing."""

from __future__ import annotations

import pytest
from synth import T0, TRAINER, data_wait, gpu, host, process, replace, snapshot, story, trainer, worker_exit

from loadertop.model import ShmSnapshot
from loadertop.rules import Diagnoser, diagnose
from loadertop.rules import thresholds as T
from loadertop.rules.base import predicted_wait


def ids(findings) -> list[str]:
    return [f.id for f in findings]


def only(findings, rule_id):
    matching = [f for f in findings if f.id == rule_id]
    assert len(matching) == 1, ids(findings)
    return matching[0]


# --- input_bound -------------------------------------------------------------------


def test_input_bound_cpu_bound_workers_with_idle_cpus_gets_more_workers():
    # 1 worker at 97% CPU, 8 usable CPUs, host mostly idle: the issue's own example.
    h = story(30, lambda t: snapshot(t, [trainer(workers=1, worker_cpu=97.0, wait=0.8)], host(cpu=20.0)))
    f = only(diagnose(h), "input_bound")
    assert f.severity == "critical"
    assert f.change == {"DataLoader": {"num_workers": 7}}  # 8 usable CPUs, one for the main process
    assert "num_workers=1 -> 7" in f.suggestion and "80%" in f.suggestion
    assert f.evidence["worker_cpu_percent"] == 97.0


def test_input_bound_share_of_cpus_with_several_trainers():
    two = [trainer(workers=1, worker_cpu=97.0, wait=0.8), trainer(workers=1, worker_cpu=97.0, wait=0.8, pid=5000)]
    h = story(30, lambda t: snapshot(t, two, host(cpu=20.0)))
    changes = {f.trainer_pid: f.change for f in diagnose(h) if f.id == "input_bound"}
    assert changes == {TRAINER: {"DataLoader": {"num_workers": 3}}, 5000: {"DataLoader": {"num_workers": 3}}}


def test_input_bound_on_two_cpus_counts_what_the_main_process_really_needs():
    # The starved demo on a 2-CPU machine: one worker at 100%, a main process that mostly waits
    # (6% CPU at 60% wait: ~0.15 CPU once it stops waiting), ~0.9 CPU idle. A second worker
    # doubles the loader's throughput; "the main process needs a whole CPU" would forbid it.
    def make(main_cpu, start_up_until=0):
        def at(t):
            cpu = 100.0 if t < start_up_until else main_cpu  # importing torch, building the loader
            return snapshot(t, [trainer(workers=1, worker_cpu=100.0, wait=0.6, usable=2,
                                        main=process(TRAINER, cpu, threads=2))], host(2, cpu=57.0))

        return story(30, at)

    f = only(diagnose(make(6.0)), "input_bound")
    assert f.change == {"DataLoader": {"num_workers": 2}}
    assert "num_workers=1 -> 2" in f.suggestion
    assert f.evidence["main_process_cpus"] == pytest.approx(0.15)
    # Its start-up still in the 10 s window (3 of 10 ticks at 100%) does not hide the idle CPU.
    assert only(diagnose(make(6.0, start_up_until=23)), "input_bound").change == {"DataLoader": {"num_workers": 2}}
    # A main process that keeps a CPU busy leaves no room for a second worker: said plainly.
    f = only(diagnose(make(60.0)), "input_bound")
    assert f.change is None
    assert "taken by its 1 worker and its main process (~1.0 CPUs)" in f.suggestion


def test_input_bound_without_cpu_left_says_so():
    h = story(30, lambda t: snapshot(t, [trainer(workers=7, worker_cpu=99.0, wait=0.5)], host(cpu=99.0)))
    f = only(diagnose(h), "input_bound")
    assert f.change is None and "more workers will not help" in f.suggestion
    assert "D.__getitem__" in f.suggestion


def test_input_bound_io_bound_workers_get_more_workers_than_cores_and_prefetch():
    h = story(30, lambda t: snapshot(t, [trainer(workers=4, worker_cpu=10.0, wait=0.6, usable=2)], host(2)))
    f = only(diagnose(h), "input_bound")
    assert f.change["DataLoader"]["prefetch_factor"] == 4
    assert f.change["DataLoader"]["num_workers"] > 2  # more workers than the 2 cores


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
    assert ids(diagnose(unknown_cpu)) == ["input_bound"]  # still said, with a cautious change


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


def test_predicted_wait():
    assert predicted_wait(0.8, 1, 4) == pytest.approx(0.2)
    assert predicted_wait(0.5, 2, 4) == 0.0
    assert predicted_wait(0.3, 2, 2) == pytest.approx(0.3)


# --- main_process_bound --------------------------------------------------------------


def test_main_process_bound_with_num_workers_0():
    h = story(30, lambda t: snapshot(t, [trainer(workers=0, wait=data_wait(0.6, main=0.58))]))
    found = diagnose(h)
    f = only(found, "main_process_bound")
    assert f.change == {"DataLoader": {"num_workers": 4, "persistent_workers": True}}
    assert "input_bound" not in ids(found)


def test_main_process_bound_quiet_when_workers_are_the_wait():
    h = story(30, lambda t: snapshot(t, [trainer(wait=data_wait(0.6, main=0.04))], host(cpu=20.0)))
    assert "main_process_bound" not in ids(diagnose(h))


def test_workers_with_batches_ready_mean_the_wait_is_receiving_them():
    # What CI saw on a busy 2-core machine: 16% data wait, workers at 3% CPU, every worker
    # waiting for indices. More workers would not help; the hand-over is the cost.
    ahead = story(30, lambda t: snapshot(t, [_with_workers(trainer(workers=2, worker_cpu=3.0, wait=0.16, usable=2),
                                                           doing="waiting for indices")], host(2)))
    found = diagnose(ahead)
    assert "input_bound" not in ids(found)
    f = only(found, "main_process_bound")
    assert f.evidence["main_process_fraction"] == 0.16 and f.evidence["workers_waiting_for_indices"] is True
    assert "more workers will not help" in f.suggestion and f.change is None


def test_one_straggler_still_makes_the_loop_input_bound():
    def make(t):
        tr = trainer(workers=4, worker_cpu=10.0, wait=0.3, usable=2)
        idle = [replace(w, doing="waiting for indices") for w in tr.workers[1:]]
        return snapshot(t, [replace(tr, workers=(tr.workers[0], *idle))], host(2))

    found = diagnose(story(30, make))
    assert "input_bound" in ids(found) and "main_process_bound" not in ids(found)


# --- worker_threads / cpu_oversubscribed / too_many_workers ---------------------------


def _with_workers(t, **worker_kw):
    return replace(t, workers=tuple(replace(w, **worker_kw) for w in t.workers))


def test_worker_threads_fires_on_busy_pools_not_on_thread_count():
    busy = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=8, threads=11)]))
    f = only(diagnose(busy), "worker_threads")
    assert f.change["env"]["OMP_NUM_THREADS"] == "1" and f.severity == "critical"  # 16 busy on 8 CPUs
    idle_pool = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=1, threads=11)]))
    assert diagnose(idle_pool) == []
    unknown = story(30, lambda t: snapshot(t, [_with_workers(trainer(wait=0.0), busy_threads=None)]))
    assert diagnose(unknown) == []


def test_cpu_oversubscribed():
    def make(t, rq):
        tr = _with_workers(trainer(workers=6, wait=0.0, usable=2), runqueue_wait_s_per_s=rq, busy_threads=2)
        return snapshot(t, [tr], host(2, cpu=100.0, load=9.0))

    f = only(diagnose(story(30, lambda t: make(t, 0.4))), "cpu_oversubscribed")
    assert f.change == {"DataLoader": {"num_workers": 1}, "env": {"OMP_NUM_THREADS": "1"}}
    assert "cpu_oversubscribed" not in ids(diagnose(story(30, lambda t: make(t, 0.05))))


def test_too_many_workers_across_trainers_on_the_host():
    def make(t):
        trainers = [trainer(workers=2, wait=0.0, usable=2), trainer(workers=2, wait=0.0, usable=2, pid=5000)]
        return snapshot(t, trainers, host(2, cpu=98.0, dataloader_workers=4, dataloader_trainers=2))

    found = [f for f in diagnose(story(30, make)) if f.id == "too_many_workers"]
    assert {f.trainer_pid for f in found} == {TRAINER, 5000}
    assert all(f.change == {"DataLoader": {"num_workers": 1}} for f in found)
    alone = story(30, lambda t: snapshot(t, [trainer(workers=4, wait=0.0, usable=2)],
                                         host(2, cpu=98.0, dataloader_workers=4, dataloader_trainers=1)))
    assert "too_many_workers" not in ids(diagnose(alone))


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
    assert f.severity == "critical" and f.change == {"docker": {"shm_size": "128m"}}
    assert "--shm-size=128m" in f.suggestion
    assert diagnose(story(30, lambda t: make(t, 50 << 20))) == []  # 78%: just below
    assert diagnose(story(30, lambda t: snapshot(t, [trainer(wait=0.0, shm=None)]))) == []


def test_worker_memory_growth_copy_on_read():
    def make(t, uss_growth, rss_growth):
        tr = trainer(wait=0.0)
        ws = tuple(replace(w, uss_bytes=(20 << 20) + int(uss_growth * t), rss_bytes=(300 << 20) + int(rss_growth * t),
                           memory_sampled_at=T0 + t) for w in tr.workers)
        return snapshot(t, [replace(tr, workers=ws)])

    f = only(diagnose(story(60, lambda t: make(t, 1 << 20, 0))), "worker_memory_growth")  # 60 MiB/min
    assert "numpy" in f.suggestion and f.evidence["hours_to_oom"] > 0
    assert diagnose(story(60, lambda t: make(t, 1 << 20, 1 << 20))) == []  # RSS too: not copy-on-read
    assert diagnose(story(60, lambda t: make(t, 1 << 10, 0))) == []  # too slow to matter
    assert diagnose(story(10, lambda t: make(t, 1 << 20, 0))) == []  # too short to tell


# --- GPU and stalls ----------------------------------------------------------------


def test_pin_memory_off_needs_gpu_evidence():
    cpu_only = story(30, lambda t: snapshot(t, [trainer(wait=0.0)]))
    assert diagnose(cpu_only) == []
    on_gpu = story(30, lambda t: snapshot(t, [trainer(wait=0.0, gpus=(0,))], gpus=[gpu()]))
    assert only(diagnose(on_gpu), "pin_memory_off").change == {"DataLoader": {"pin_memory": True}}
    pinned = story(30, lambda t: snapshot(t, [trainer(wait=0.0, gpus=(0,), pin_memory_thread=True)], gpus=[gpu()]))
    assert diagnose(pinned) == []


def test_input_bound_carries_gpu_evidence():
    h = story(30, lambda t: snapshot(t, [trainer(workers=1, worker_cpu=97.0, wait=0.6, gpus=(0,),
                                                 pin_memory_thread=True)], host(cpu=20.0), gpus=[gpu(util=25.0)]))
    f = only(diagnose(h), "input_bound")
    assert f.evidence["gpu_utilization_percent"] == 25.0 and "GPU utilization is 25%" in f.title


def test_loader_stalled_when_workers_are_stopped_or_idle():
    def make(t, status, cpu):
        tr = _with_workers(trainer(wait=data_wait(1.0, stalled=float(t))), status=status, cpu_percent=cpu)
        return snapshot(t, [tr])

    f = only(diagnose(story(40, lambda t: make(t, "stopped", 0.0))), "loader_stalled")
    assert f.severity == "critical" and "stopped" in f.title
    assert "loader_stalled" in ids(diagnose(story(40, lambda t: make(t, "sleeping", 0.1))))
    assert "loader_stalled" not in ids(diagnose(story(40, lambda t: make(t, "running", 90.0))))
    assert "loader_stalled" not in ids(diagnose(story(10, lambda t: make(t, "stopped", 0.0))))


def test_healthy_job_has_no_findings_at_all():
    h = story(120, lambda t: snapshot(t, [trainer(workers=4, worker_cpu=60.0, wait=0.01, pin_memory_thread=True,
                                                  gpus=(0,))], host(cpu=55.0), gpus=[gpu(util=97.0)]))
    assert diagnose(h) == []


def test_a_broken_snapshot_never_raises():
    weird = trainer(wait=0.5, usable_cpus=None, workers=0)
    h = story(20, lambda t: snapshot(t, [replace(weird, main=process(TRAINER, None))], host(cpu=None)))
    diagnose(h)  # no exception
