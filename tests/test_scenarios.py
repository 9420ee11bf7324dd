"""The replay tier (issue 42): the advice, diagnosis and threads of real jobs, read from their
recordings (tests/support/scenarios.py; re-recorded by tests/record_scenarios.py when a probe
changes). Each test judges what `loadertop snapshot` sampled of the job, in-process, exactly
as the snapshot judged it; deterministic, whatever the host running the suite is doing.

Then, of every recording: each tick's stored judgement is what the figures give when judged
again (the judgement is a function of what was sampled, nothing else), and every view of it
(the live header, `replay`, `snapshot --from`, the summary, `diff`, the exporter) gives one
answer. The live tier keeps one canary per probe path that these recordings came through."""

from __future__ import annotations

import json

import pytest
from support.reports import (
    assert_busy_host_advice,
    busy_host,
    findings,
    merged_change,
    only_trainer,
    texts,
    validated,
)
from support.scenarios import SCENARIOS, meta, recording, snapshot_report
from support.synth import Replayed

pytestmark = pytest.mark.replay


def rep_of(name: str, k: int = 0) -> dict:
    return validated(snapshot_report(name, k))


# --- the advice -------------------------------------------------------------------------------


def test_one_worker_beside_a_light_main_process_gets_a_second_one():
    # A Lightning/Accelerate loop's shape: 1 worker at ~95% CPU, the loop at ~25% CPU (~3 ms of
    # its own work a step), most of the step waiting, 2 CPUs. Measured there: 2 workers +52%
    # steps/s, 3 +68%; "more workers will not help" was wrong.
    rep = rep_of("one_worker_light_main")
    if busy_host(rep):  # the expected advice follows what the host had, not an idle one
        assert_busy_host_advice(rep, workers=1)
        return
    assert merged_change(rep) == {"DataLoader": {"num_workers": 2}, "dataset": "MapData"}
    plan = only_trainer(rep)["plan"]
    assert plan["cause"] == "loader_cpu" and 0.3 <= plan["predicted_gain"] <= 1.2
    assert "will not help" not in texts(rep)


def test_a_cpu_quota_is_named_and_gets_fewer_workers_not_more():
    # 3 CPU-bound workers throttled by a 1-CPU quota were called I/O-bound ("3 -> 4,
    # prefetch_factor=4") and, in the same report, oversubscribed ("3 -> 1"). Fewer workers
    # keep the quota as busy; how many fewer depends on how long each waited for the quota.
    rep = rep_of("quota")
    change = merged_change(rep)
    assert change.keys() == {"DataLoader", "dataset"} and change["DataLoader"].keys() == {"num_workers"}
    assert change["DataLoader"]["num_workers"] in (1, 2)
    trainer = only_trainer(rep)
    assert trainer["verdict"] == "THROTTLED" and trainer["plan"]["cause"] == "quota"
    assert trainer["cpu_quota"] == 1.0 and trainer["usable_cpus"] == 1
    assert "I/O" not in texts(rep) and "quota" in texts(rep)


def test_a_busy_host_is_named_and_gets_no_more_workers():
    # Other processes keep both CPUs busy; the job's 2 CPU-bound workers get ~40% each. They
    # are starved of CPU, not waiting on I/O, and more of them would only take CPU from the others.
    rep = rep_of("busy_host")
    assert merged_change(rep) == {}
    trainer = only_trainer(rep)
    assert trainer["plan"]["cause"] == "busy_host" and trainer["verdict"] == "BUSY HOST"
    assert "I/O" not in texts(rep)


def test_stopped_workers_are_a_hang_within_a_ten_second_snapshot():
    # SIGSTOPped workers, a 10 s snapshot: it was "input_bound ... 2 -> 8".
    rep = rep_of("stopped")
    assert [f["id"] for f in rep["findings"]] == ["loader_stalled"]
    stalled = rep["findings"][0]
    assert stalled["severity"] == "critical" and stalled["evidence"]["how"] == "stopped"
    workers = {w["pid"] for w in only_trainer(rep)["workers"]}
    assert len(workers) == 2 and set(map(int, stalled["evidence"]["workers"])) == workers
    assert merged_change(rep) == {} and only_trainer(rep)["verdict"] == "STALLED"


def test_ranks_pinned_to_their_own_cpu_are_not_divided_again():
    # Ranks pinned to their own CPUs were divided by the rank count again. Two ranks on one
    # CPU each, 2 CPU-bound workers each: one worker keeps a rank's CPU as busy, nothing more.
    rep = rep_of("pinned_ranks")
    assert len(rep["trainers"]) == 2
    for t in rep["trainers"]:
        assert len(t["cpu_set"]) == 1 and t["plan"]["evidence"]["cpu_set"] == 1
        assert t["plan"]["evidence"]["cpus"] >= 0.5  # its own CPU, not half of it
    assert merged_change(rep) == {"DataLoader": {"num_workers": 1}, "dataset": "MapData"}


def test_a_small_dev_shm_caps_the_workers_it_proposes():
    # /dev/shm nearly full in a 64 MB container was told "4 -> 10 workers, prefetch_factor=4".
    # Here 1 worker of 6 MiB batches would gain from a second, and 80 % of a 32 MiB /dev/shm
    # holds 4 batches: 2 workers with 1 batch each in flight, the batch the loop trains on and
    # the next it receives meanwhile.
    rep = rep_of("small_shm_advice")
    size, batch = 32 * 2**20, 6 * 2**20
    change = merged_change(rep)
    workers = change.get("DataLoader", {}).get("num_workers", 1)
    prefetch = change.get("DataLoader", {}).get("prefetch_factor", 2)
    assert (workers * prefetch + 2) * batch <= 0.8 * size, change
    assert only_trainer(rep)["shm"]["total_bytes"] == size
    if busy_host(rep):
        assert_busy_host_advice(rep, workers=1)
        return
    assert change == {"DataLoader": {"num_workers": 2, "prefetch_factor": 1}, "dataset": "MapData"}


def test_consecutive_snapshots_beside_a_load_that_comes_and_goes_keep_one_verdict():
    # On a host that others use, the verdict flipped between BUSY HOST, INPUT-BOUND and
    # OVERSUBSCRIBED in consecutive snapshots of an unchanged job. Another process took one CPU
    # 1 s of every 3 s: each snapshot measures it over its own whole window.
    reps = [rep_of("duty_load", k) for k in range(SCENARIOS["duty_load"].snapshots)]
    verdicts = [only_trainer(r)["verdict"].split()[0] for r in reps]
    found = [sorted(f["id"] for f in r["findings"]) for r in reps]
    assert len(set(verdicts)) == 1 and len({tuple(f) for f in found}) == 1, (verdicts, found)
    for r in reps:  # what it measured of the others: some, never more than the host has
        others = only_trainer(r)["plan"]["evidence"]["other_processes_cpus"]
        assert 0.1 <= others <= r["host"]["cpu_count"], others


# --- the diagnosis ----------------------------------------------------------------------------


def test_healthy_job_has_no_findings():
    # Batches are ready long before the 150 ms step ends; what is left of data wait is the
    # hand-over of each batch (~2-3 ms here, more when the machine is busy).
    rep = rep_of("healthy")
    assert rep["findings"] == [], rep["findings"]
    assert rep["trainers"][0]["data_wait_fraction"] < 0.15


def test_a_starved_job_reads_higher_than_a_healthy_one_and_its_worker_is_read_from_its_stack():
    # py-spy's reading (the data wait's nearness to the job's own: below, for every scenario).
    s, h = only_trainer(rep_of("one_worker_light_main")), only_trainer(rep_of("healthy"))
    assert s["data_wait"]["source"] == h["data_wait"]["source"] == "py-spy"
    assert s["data_wait_fraction"] > h["data_wait_fraction"] + 0.3
    assert s["data_wait"]["samples"] >= 40
    assert s["data_wait"]["worker_wait_fraction"] > s["data_wait"]["main_process_fraction"]
    # The starved job's worker is busy in the dataset; the loader's arguments are read.
    assert any("MapData.__getitem__" in (w["doing"] or "") for w in s["workers"])
    assert [w["worker_id"] for w in s["workers"]] == [0]
    assert s["loaders"] == [{"dataset_class": "MapData", "num_workers": 1, "persistent_workers": True,
                             "worker_pids": [s["workers"][0]["pid"]]}]


def test_batches_of_many_small_tensors_are_slow_to_receive_not_to_load():
    # Each of the 256 tensors in a batch is its own shared-memory hand-over: the workers sit
    # waiting for indices while the loop waits receiving. More workers would not help, and
    # the workers' busy feeder/sharer threads are not a thread pool.
    f = findings(rep_of("small_tensors"))
    assert set(f) == {"main_process_bound"}, f
    assert f["main_process_bound"]["evidence"]["workers_waiting_for_indices"] is True
    assert f["main_process_bound"]["evidence"]["main_process_fraction"] >= 0.05


def test_workers_with_intra_op_thread_pools():
    rep = rep_of("worker_threads")
    f = findings(rep)
    assert "worker_threads" in f, (f, [w["busy_threads"] for w in rep["trainers"][0]["workers"]])
    assert f["worker_threads"]["change"]["env"]["OMP_NUM_THREADS"] == "1"
    assert f["worker_threads"]["evidence"]["busy_threads_per_worker"] >= 2


def test_workers_recreated_every_epoch():
    f = findings(rep_of("respawn"))
    assert "worker_respawn" in f, f
    assert f["worker_respawn"]["change"] == {"DataLoader": {"persistent_workers": True}}


def test_copy_on_read_memory_growth():
    rep = rep_of("copy_on_read")
    f = findings(rep)
    assert "worker_memory_growth" in f, (f, [w["uss_bytes"] for w in rep["trainers"][0]["workers"]])
    assert "numpy" in f["worker_memory_growth"]["suggestion"]


def test_small_dev_shm_fills():
    # 2 workers x prefetch_factor 4 = 8 batches of 1 MiB in flight (9 with the one in use) in a
    # 9.5 MiB /dev/shm: 84-95 % full, below the crash.
    rep = rep_of("small_shm_fills")
    f = findings(rep)
    assert "shm_pressure" in f, (f, rep["trainers"][0]["shm"])
    assert f["shm_pressure"]["evidence"]["shm_total_bytes"] == 19 * 2**19
    assert f["shm_pressure"]["change"]["docker"]["shm_size"].endswith("m")


def test_two_jobs_sharing_two_cores():
    rep = rep_of("two_jobs")
    pids = {t["pid"] for t in rep["trainers"]}
    found = [f for f in rep["findings"] if f["id"] in ("too_many_workers", "cpu_oversubscribed")]
    assert len(pids) == 2 and {f["trainer_pid"] for f in found} == pids, rep["findings"]
    for f in found:
        assert f["change"]["DataLoader"]["num_workers"] < 2


# --- the training loop's threads ----------------------------------------------------------------


def test_the_loops_default_threads_are_limited_and_not_given_more_workers():
    # A small CPU model at torch's default threads (one per CPU) beside 2 workers of 5 ms
    # items: the loop's pool spins between tiny ops and takes the workers' CPUs. The advice is
    # OMP_NUM_THREADS=1 (1.5x faster, docs/BENCHMARKS.md), not more workers.
    rep = rep_of("main_threads_default")
    (trainer,) = rep["trainers"]
    assert trainer["usable_cpus"] >= 2, "recorded on one CPU: torch's default is one thread there"
    found = findings(rep)
    assert "main_threads" in found, (trainer["verdict"], list(found), trainer["main"])
    assert found["main_threads"]["change"] == {"env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    assert found["main_threads"]["evidence"]["main_busy_threads"] >= 1.5
    assert trainer["plan"]["cause"] == "main_threads" and trainer["verdict"] == "OVERSUBSCRIBED"
    more = [f for f in rep["findings"] if (f["change"] or {}).get("DataLoader", {}).get("num_workers", 0) > 2]
    assert not more, more


def test_a_loop_on_one_thread_gets_no_thread_advice():
    rep = rep_of("main_threads_one")
    assert "main_threads" not in findings(rep)
    assert rep["trainers"][0]["plan"]["cause"] != "main_threads"


# --- every recording: one judgement, one answer ---------------------------------------------------

EVERY = [(name, k) for name, s in SCENARIOS.items() for k in range(s.snapshots)]


@pytest.mark.parametrize(("name", "k"), EVERY, ids=[f"{n}-{k}" for n, k in EVERY])
def test_each_ticks_stored_judgement_is_what_its_figures_give(name, k):
    from loadertop.outputs import judgement
    from loadertop.rules import Diagnoser

    rec = recording(name, k)
    assert len(rec.judged) == len(rec.snapshots) and all(j is not None for j in rec.judged)
    again = Diagnoser()
    for i, snap in enumerate(rec.snapshots):
        again.feed(snap)
        redone = json.loads(json.dumps(judgement.encode(again.diagnosis)))
        assert judgement.decode(rec.judged[i]) is not None, f"tick {i} of {name}: its judgement does not read back"
        # A field added to the judgement since the recording is not in it: the rest must agree.
        assert _as_stored(redone, rec.judged[i]) == rec.judged[i], \
            f"tick {i} of {name}: judged otherwise from the same figures"


def _as_stored(redone, stored):
    """`redone` with only the fields `stored` has (recursively)."""
    if isinstance(redone, dict) and isinstance(stored, dict):
        return {k: _as_stored(v, stored[k]) for k, v in redone.items() if k in stored}
    if isinstance(redone, list) and isinstance(stored, list) and len(redone) == len(stored):
        return [_as_stored(a, b) for a, b in zip(redone, stored, strict=True)]
    return redone


@pytest.fixture
def python_ignores_sigpipe():
    """`cli.main` restores SIGPIPE's default for the command line; not in the test process."""
    import signal

    yield
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


@pytest.mark.parametrize(("name", "k"), EVERY, ids=[f"{n}-{k}" for n, k in EVERY])
def test_every_view_of_a_recording_gives_one_answer(name, k, tmp_path, capsys, python_ignores_sigpipe):
    from support.scenarios import path_of

    from loadertop import cli
    from loadertop.outputs import judgement, summary
    from loadertop.outputs.export import Exporter
    from loadertop.tui.source import ScriptedSource

    rec = recording(name, k)
    path = str(path_of(name, k))
    at_work = summary.while_running(rec.snapshots)
    last = at_work[-1]
    stored = judgement.at(rec.judged, len(at_work) - 1)
    assert stored is not None

    def answer(diagnosis, t) -> str:
        """The header's answer: a job of several ranks by its job's verdict, else the trainer's."""
        job = diagnosis.job_verdicts.get(t.job)
        return job.text if job is not None else diagnosis.verdict(t).text

    # Each view once; then each trainer's answer in it.
    _, replayed = ScriptedSource(rec.snapshots, judged=rec.judged).seek(len(at_work))
    assert cli.main(["snapshot", "--from", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    text = summary.render(cli.report_of_recording(rec.snapshots, rec.judged), summary.ended(rec.snapshots))
    assert f"**{answer(stored, last.trainers[0])}**" in text, "the summary"
    out = tmp_path / "diff.json"
    assert cli.main(["diff", path, path, "-o", str(out)]) == 0
    compared = json.loads(out.read_text())["trainers"]
    exporter = Exporter(Replayed(at_work))
    for _ in at_work:
        exporter.sample_once()
    for t in last.trainers:
        assert answer(replayed, t) == answer(stored, t), "replay"
        row = next(r for r in report["trainers"] if r["pid"] == t.pid)
        assert row["verdict"] == stored.verdict(t).text, "snapshot --from, the trainer's row"
        rows = [r for r in compared if r.get("pid_after") == t.pid]
        assert rows and rows[0]["verdict_before"] == rows[0]["verdict_after"] == stored.verdict(t).text, "diff"
        assert exporter.diagnoser.diagnosis.verdict(t).text == stored.verdict(t).text, "the exporter"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_data_wait_read_is_near_the_jobs_own(name):
    # The job measures the seconds it spends blocked in next(loader) itself (loadertop/demo/job.py --truth);
    # the snapshot's reading over the same window is within sampling error of it.
    for k, window in enumerate(meta(name)["windows"]):
        rep = rep_of(name, k)
        for t in rep["trainers"]:
            truth = window["data_wait"].get(str(t["pid"]))
            if truth is None or t["data_wait_fraction"] is None or t["verdict"] == "STALLED":
                continue
            assert abs(t["data_wait_fraction"] - truth) <= WAIT_ERROR, (name, k, t["pid"], t["data_wait_fraction"], truth)


WAIT_ERROR = 0.1  # a 10 s window of py-spy samples at ~10 Hz, or the loop's own hook


def test_the_scenarios_were_recorded_on_the_host_they_claim():
    # What the replay tests assume of the recordings: 2 CPUs or more, each scenario's ticks.
    for name in SCENARIOS:
        m = meta(name)
        assert m["host"]["cpus"] >= 2 and all(w["ticks"] >= 5 for w in m["windows"]), (name, m)


# --- jobs of two ranks --------------------------------------------------------------------------


def by_rank(rep: dict) -> dict[int, dict]:
    return {t["rank"]: t for t in rep["trainers"]}


def findings_of(rep: dict, trainer: dict) -> dict[str, dict]:
    return {f["id"]: f for f in rep["findings"] if f["trainer_pid"] == trainer["pid"]}


@pytest.mark.parametrize("probe", ["py-spy", "hook"])
def test_the_rank_that_waits_for_a_slow_shard_is_told_so_and_the_shard_is_named(probe):
    rep = rep_of(f"ranks_slow_shard_{probe}")
    ranks = by_rank(rep)
    assert set(ranks) == {0, 1}
    assert ranks[0]["verdict"] == "WAITS FOR RANK 1", (ranks[0]["verdict"], rep["findings"])
    assert ranks[1]["verdict"].startswith("INPUT-BOUND")
    waits = findings_of(rep, ranks[0])
    assert set(waits) >= {"waits_for_rank"} and waits["waits_for_rank"]["change"] is None
    assert waits["waits_for_rank"]["evidence"]["straggler_rank"] == 1
    # How the rank's time in the sync was read: py-spy's frames, else /proc's blocked share.
    assert waits["waits_for_rank"]["evidence"]["method"] == ("blocked" if probe == "hook" else "frames")
    assert "input_bound" not in waits  # rank 0's own loader is not the problem
    slow = findings_of(rep, ranks[1])
    assert slow["input_bound"]["change"]["DataLoader"]["num_workers"] > 1
    (job,) = rep["jobs"]
    assert job["verdict"] == "INPUT-BOUND on rank 1 of 2"
    assert job["straggler"]["rank"] == 1 and job["straggler"]["cause"] == "input"
    assert job["straggler"]["pid"] == ranks[1]["pid"] and job["ranks"][0]["rank"] == 1
    assert job["job"].startswith("run:")  # torchrun --standalone names its run


@pytest.mark.parametrize("probe", ["py-spy", "hook"])
def test_a_slow_step_on_one_rank_is_named_and_no_loader_is_changed(probe):
    rep = rep_of(f"ranks_slow_step_{probe}")
    ranks = by_rank(rep)
    assert ranks[1]["verdict"] == "SLOWEST RANK", (ranks[1]["verdict"], rep["findings"])
    assert ranks[0]["verdict"] == "WAITS FOR RANK 1"
    assert "rank_straggler" in findings_of(rep, ranks[1])
    changed = [(f["id"], f["trainer_pid"], f["change"]) for f in rep["findings"] if f["change"]]
    assert not any("DataLoader" in change for _, _, change in changed), changed
    (job,) = rep["jobs"]
    assert job["verdict"] == "SLOW STEP on rank 1 of 2" and job["straggler"]["cause"] == "step"


@pytest.mark.parametrize("probe", ["py-spy", "hook"])
def test_balanced_ranks_wait_for_no_one(probe):
    rep = rep_of(f"ranks_balanced_{probe}")
    assert not {"waits_for_rank", "rank_straggler"} & {f["id"] for f in rep["findings"]}, rep["findings"]
    (job,) = rep["jobs"]
    assert job["straggler"] is None and job["ranks_seen"] == 2
    assert all(not t["verdict"].startswith("WAITS") for t in rep["trainers"])


async def test_the_live_view_shows_the_job_with_the_straggler_first():
    from support.tui import text_of, wait_until

    from loadertop.tui.app import LoadertopApp
    from loadertop.tui.source import ScriptedSource
    from loadertop.tui.widgets.overview import OverviewPanel

    rec = recording("ranks_slow_shard_hook")
    app = LoadertopApp(ScriptedSource(rec.snapshots, judged=rec.judged, interval_s=0.01))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.ended and app.ticks_shown > 0, timeout=30)
        lines = text_of(app, OverviewPanel).splitlines()
        assert "INPUT-BOUND on rank 1 of 2" in lines[0], lines
        assert lines[1].startswith("▶1 rank 1") and lines[2].startswith(" 2 rank 0"), lines
        assert "WAITS FOR RANK 1" in text_of(app, OverviewPanel)


# --- before and after: diff ----------------------------------------------------------------------


def _diff(capsys, *args: str) -> tuple[int, str, str]:
    from loadertop import cli

    rc = cli.main(["diff", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_one_worker_then_two_what_changed_and_what_it_did(tmp_path, capsys, python_ignores_sigpipe):
    from support.scenarios import path_of

    from loadertop import cli

    one_rec, two_rec = str(path_of("diff_one_worker")), str(path_of("diff_two_workers"))
    one, two = str(tmp_path / "w1.json"), str(tmp_path / "w2.json")
    for rec, report in ((one_rec, one), (two_rec, two)):
        assert cli.main(["snapshot", "--from", rec, "-o", report]) == 0
    capsys.readouterr()
    for before, after in ((one, two), (one_rec, two_rec)):
        rc, out, err = _diff(capsys, before, after, "--json")
        assert rc == 0, err
        d = json.loads(out)
        assert d["schema"] == "loadertop.diff/1"
        (t,) = d["trainers"]
        settings = {s["name"]: (s["before"], s["after"]) for s in t["settings"]}
        assert settings["train: num_workers"] == (1, 2), settings  # the loader as watch() names it
        figures = {f["name"]: f for f in t["figures"]}
        steps = figures["steps_per_s"]
        # Twice the workers on 2 CPUs: far more steps, past the noise both runs measured.
        assert steps["stderr_before"] is not None and steps["stderr_after"] is not None
        assert steps["state"] == "better" and steps["change_fraction"] > 0.3, steps
        assert figures["workers_cpu_percent"]["state"] == "up"
    rc, out, _ = _diff(capsys, one, two)
    assert rc == 0 and "num_workers" in out and "1 -> 2" in out and "steps/s" in out and "better" in out, out
    for ext in ("md", "html", "json"):
        target = tmp_path / f"diff.{ext}"
        assert _diff(capsys, one, two, "-o", str(target))[0] == 0 and target.stat().st_size > 200
    assert "| `train: num_workers` | `1` | `2` |" in (tmp_path / "diff.md").read_text()
    # For CI: the change made it faster, so it passes; the other way round fails, in one line.
    assert _diff(capsys, one, two, "--fail-if-slower", "10")[0] == 0
    rc, _, err = _diff(capsys, two, one, "--fail-if-slower", "10")
    assert rc == 1 and "steps/s fell" in err and "Traceback" not in err, err
