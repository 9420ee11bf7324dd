"""One answer per job (issue 41): the diagnoser judges each tick once (rules/diagnosis.py), and
the verdict it says keeps its invariants whatever the snapshots hold: no HEALTHY before a
DataLoader was seen, a confirmed verdict never provisional again, an exited trainer never
provisional, a confirmed class replaced only once the new one held. Every view shows that one
judgement: the live header, the report (JSON, Markdown) and the exporter."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from support.synth import TRAINER, Replayed, data_wait, host, snapshot, story, trainer

from loadertop.model import Finding
from loadertop.rules import Diagnoser, diagnosed
from loadertop.rules.diagnosis import VERDICT_HOLD_S, Verdicts, kind_of, loader_seen


def finding(id_: str, severity: str = "critical", **evidence) -> Finding:
    return Finding(id_, severity, TRAINER, f"{id_} title", evidence, suggestion=f"{id_} advice")


INPUT = finding("input_bound")
BUSY = finding("cpu_oversubscribed", "warning", cause="busy_host")
DIED = finding("worker_died")


def bare(**kw):
    """The trainer as first seen: no worker, no loader from the hook, py-spy's first look."""
    return trainer(workers=0, wait=replace(data_wait(0.0, window=3.0), first_look=True), **kw)


def test_no_healthy_before_a_dataloader_is_seen():
    # The review: "HEALTHY provisional data wait 0%" beside "no DataLoader workers (yet)".
    v = Verdicts()
    first = v.say(0.0, bare(), [], [], None)
    assert (first.text, first.measuring, first.provisional) == ("WATCHING", True, False)
    assert not loader_seen(bare())
    # Its workers appear: now a figure can be judged (a first look, so provisional).
    later = v.say(1.0, trainer(workers=1, wait=replace(data_wait(0.0, window=3.0), first_look=True)), [], [], None)
    assert later.text == "HEALTHY" and later.provisional
    # Seen once is seen: a tick between epochs with no worker alive is no new "not seen".
    again = v.say(2.0, trainer(workers=0, wait=0.0), [], [], None)
    assert again.text == "HEALTHY" and not again.measuring


def test_a_loader_seen_by_py_spy_alone_counts():
    # A loader without workers (num_workers=0) loads in the loop: py-spy sees its frames.
    assert loader_seen(trainer(workers=0, wait=0.3))
    assert not loader_seen(trainer(workers=0, wait=None))


def test_a_confirmed_verdict_is_never_provisional_again():
    # The review at 80x24: a confirmed INPUT-BOUND 26% turned back into "BUSY HOST provisional".
    v = Verdicts()
    t = trainer(workers=1, wait=0.26)
    assert v.say(0.0, t, [INPUT], [], None).text == "INPUT-BOUND 26%"
    for now in (1.0, 2.0, 3.0):
        said = v.say(now, replace(t, data_wait=replace(t.data_wait, first_look=True)), [INPUT], [BUSY], None)
        assert said.text == "INPUT-BOUND 26%" and not said.provisional, said


def test_an_exited_trainer_is_never_provisional():
    v = Verdicts()
    t = replace(bare(), status="exited", workers=trainer(workers=1).workers)
    said = v.say(0.0, t, [], [INPUT], None)
    assert (said.text, said.provisional, said.measuring) == ("EXITED", False, False)


def test_a_confirmed_class_gives_way_only_once_the_new_one_held():
    v = Verdicts()
    t = trainer(workers=1, wait=0.6)
    assert v.say(0.0, t, [INPUT], [], None).text == "INPUT-BOUND 60%"
    # The figure moves with the load: the class stays, the figure is the latest.
    assert v.say(1.0, replace(t, data_wait=data_wait(0.55)), [INPUT], [], None).text == "INPUT-BOUND 55%"
    # Another class for less than the hold: the confirmed verdict stays.
    for now in range(2, 2 + int(VERDICT_HOLD_S)):
        assert v.say(float(now), t, [BUSY], [], None).text == "INPUT-BOUND 55%", now
    assert v.say(2.0 + VERDICT_HOLD_S, t, [BUSY], [], None).text == "BUSY HOST"
    # A death cannot wait.
    assert v.say(13.0 + VERDICT_HOLD_S, t, [DIED], [], None).text == "WORKER DIED"


def test_a_cause_found_or_cleared_is_said_at_once():
    # Its finding held (or cleared) over its own hold already: no second wait.
    v = Verdicts()
    t = trainer(workers=1, wait=0.6)
    assert v.say(0.0, t, [], [], None).text == "DATA WAIT 60%"
    assert v.say(1.0, t, [INPUT], [], None).text == "INPUT-BOUND 60%"
    assert v.say(2.0, replace(t, data_wait=data_wait(0.02)), [], [], None).text == "HEALTHY"


def test_a_rival_class_that_comes_and_goes_never_takes_over():
    v = Verdicts()
    t = trainer(workers=1, wait=0.6)
    said = [v.say(float(now), t, [BUSY] if now % 3 else [INPUT], [], None).kind for now in range(60)]
    assert set(said) == {"INPUT-BOUND"}, said


def test_the_change_comes_with_the_verdict_and_a_critical_finding_never_says_no_change():
    v = Verdicts()
    said = v.say(0.0, trainer(workers=1, wait=0.6), [finding("loader_stalled")], [], None)
    assert said.change == "" and said.why_no_change == "loader_stalled advice"


# --- properties over generated histories ------------------------------------------------------

tick = st.fixed_dictionaries({
    "workers": st.integers(0, 3),
    "wait": st.one_of(st.none(), st.floats(0.0, 1.0)),
    "first_look": st.booleans(),
    "exited": st.booleans(),
    "cpu": st.floats(1.0, 100.0),
})


def history_of(ticks: list[dict]):
    out = []
    ended = False
    for i, k in enumerate(ticks):
        ended = ended or k["exited"]  # an exited trainer does not come back
        k = {**k, "exited": ended}
        dw = None if k["wait"] is None else replace(data_wait(k["wait"], window=3.0 if k["first_look"] else 30.0),
                                                     first_look=k["first_look"])
        t = trainer(workers=k["workers"], worker_cpu=k["cpu"], wait=dw, status="exited" if k["exited"] else "running")
        if k["wait"] is None:
            t = replace(t, data_wait=None)
        out.append(snapshot(i, [t], host(cpu=k["cpu"])))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(tick, min_size=1, max_size=25))
def test_the_verdicts_invariants_hold_over_any_history(ticks):
    d = Diagnoser()
    seen_loader = confirmed = False
    for snap in history_of(ticks):
        d.feed(snap)
        t = snap.trainers[0]
        said = d.diagnosis.verdict(t)
        seen_loader = seen_loader or loader_seen(t)
        if t.status == "exited":
            assert said.text == "EXITED" and not said.provisional
            continue
        if said.text == "HEALTHY":
            assert seen_loader and t.data_wait is not None and t.data_wait.fraction is not None
        if confirmed:
            assert not said.provisional, said
        confirmed = confirmed or (not said.provisional and not said.measuring)
        if said.measuring:
            assert said.kind == "WATCHING" and not said.provisional
        # The header's change is the plan's change, or a finding's own; never one without a finding.
        if said.change:
            assert d.diagnosis.findings or d.diagnosis.pending


def test_kind_drops_the_figures():
    assert kind_of("INPUT-BOUND 62%") == "INPUT-BOUND"
    assert kind_of("INPUT-BOUND 30-33% on every rank") == "INPUT-BOUND on every rank"


# --- one judgement, every view -----------------------------------------------------------------


def starved_history():
    return story(25, lambda s: snapshot(s, [trainer(workers=1, worker_cpu=97.0, wait=0.62, usable=2)],
                                        host(cpu_count=2, cpu=60.0)))


def test_the_report_shows_the_verdict_the_diagnoser_said():
    from loadertop.outputs.report import build_report
    from loadertop.outputs.report_md import render

    history = starved_history()
    diagnosis = diagnosed(history).diagnosis
    said = diagnosis.verdict(history[-1].trainers[0])
    report = build_report(history, diagnosis)
    assert report["verdict"] == report["trainers"][0]["verdict"] == report["jobs"][0]["verdict"] == said.text
    assert render(report).splitlines()[0] == f"# loadertop report: {said.text}"


def test_the_exporter_serves_the_verdict_the_diagnoser_said():
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from loadertop.outputs.export import Exporter

    history = starved_history()

    exporter = Exporter(Replayed(history))
    for _ in history:
        exporter.sample_once()
    registry = CollectorRegistry()
    registry.register(exporter)
    text = generate_latest(registry).decode()
    said = exporter.diagnoser.diagnosis.verdict(history[-1].trainers[0]).text
    line = next(line for line in text.splitlines() if line.startswith("loadertop_verdict{"))
    assert f'verdict="{said}"' in line and 'provisional="0"' in line


# --- a gain follows the figure it comes from ---------------------------------------------------

loads = st.fixed_dictionaries({
    "workers": st.integers(0, 8),
    "wait": st.floats(0.0, 0.95),
    "worker_cpu": st.floats(5.0, 100.0),
    "usable": st.integers(1, 32),
    "host_cpu": st.floats(5.0, 100.0),
})


@settings(max_examples=80, deadline=None)
@given(loads)
def test_a_loader_change_never_promises_more_than_removing_the_wait(k):
    history = story(20, lambda s: snapshot(s, [trainer(workers=k["workers"], worker_cpu=k["worker_cpu"], wait=k["wait"],
                                                       usable=k["usable"])],
                                            host(cpu_count=k["usable"], cpu=k["host_cpu"])))
    d = diagnosed(history)
    for plan in d.plans.values():
        if plan.gain is None or plan.thread_change or plan.chosen.threads_per_worker or plan.wait_now is None:
            continue
        w = plan.wait_now
        assert plan.gain <= w / (1 - w) + 1e-9, (plan.gain, w, plan.cause)
        for f in d.findings():
            gain = f.evidence.get("predicted_gain")
            if gain is not None and f.id == "input_bound":
                assert gain <= w / (1 - w) + 1e-4  # evidence is rounded to 4 places


# --- every figure a reason quotes agrees with the snapshot -------------------------------------


def one_slow_worker(status: str, runqueue: float | None, main_cpu: float = 0.5, host_cpu: float = 95.0, busiest=(),
                    cpus_busy: float | None = 1.9):
    """The review's job on a busy 2-CPU host: 1 worker at 27 % CPU beside a loop at 0.5 %."""
    def make(s):
        t = trainer(workers=1, worker_cpu=27.0, wait=0.6, usable=2)
        t = replace(t, main=replace(t.main, cpu_percent=main_cpu), cpus_busy=cpus_busy,
                    workers=tuple(replace(w, status=status, runqueue_wait_s_per_s=runqueue) for w in t.workers))
        return snapshot(s, [t], host(cpu_count=2, cpu=host_cpu, busiest=tuple(busiest)))
    d = diagnosed(story(20, make))
    return next(iter(d.plans.values())), d.findings()


def test_workers_seen_runnable_are_not_said_to_wait_on_io():
    plan, findings = one_slow_worker("running", None)
    assert plan.cause != "loader_io"
    assert not any("I/O" in f.suggestion or "I/O" in f.title for f in findings)
    asleep, _ = one_slow_worker("sleeping", 0.0, host_cpu=20.0)
    assert asleep.cause == "loader_io"


def test_a_job_that_uses_few_of_its_cpus_is_not_said_to_keep_them_busy():
    for busy, figure in ((1.9, "other processes keep 1.6 of"), (None, "while it uses 0.3 of its 2 CPUs")):
        plan, findings = one_slow_worker("running", 0.7, cpus_busy=busy)
        assert plan.cause == "busy_host", (busy, plan.cause)
        said = " ".join(f.title + " " + f.suggestion for f in findings)
        assert "and the loop keep" not in said and figure in said, said


def test_the_processes_named_add_up_to_the_cpus_claimed_or_say_they_do_not():
    from loadertop.model import BusyProcess

    named = (BusyProcess(77, "python", "root", 0.4), BusyProcess(78, "pip", "root", 0.3))
    _, findings = one_slow_worker("running", 0.7, busiest=named)
    said = " ".join(f.suggestion for f in findings if f.id == "cpu_oversubscribed")
    assert "python of root 0.4 CPU, pip of root 0.3 CPU" in said
    assert "0.7 of the 1.6 together" in said, said


def test_the_invariants_catch_each_contradiction_the_review_saw():
    from loadertop.rules.diagnosis import Diagnosis, Verdict, frozen
    from loadertop.rules.invariants import violations

    t = bare()
    snap = snapshot(0, [t])
    key = (t.pid, t.started_at)
    healthy = Diagnosis(verdicts=frozen({key: Verdict("HEALTHY", "green", provisional=True)}))
    assert any("HEALTHY before a DataLoader" in v for v in violations(snap, healthy, None, set()))
    confirmed = Diagnosis(verdicts=frozen({key: Verdict("INPUT-BOUND 26%", "red")}))
    back = Diagnosis(verdicts=frozen({key: Verdict("BUSY HOST", "yellow", provisional=True)}), pending=(BUSY,))
    assert any("went back to provisional" in v for v in violations(snap, back, confirmed, {key}))
    asks = Diagnosis(verdicts=frozen({key: Verdict("HEALTHY", "green", change="DataLoader(num_workers=4)")}))
    assert any("no finding asks for" in v for v in violations(snap, asks, None, {key}))
    gone = snapshot(0, [replace(t, status="exited")])
    exited = Diagnosis(verdicts=frozen({key: Verdict("EXITED", "magenta", provisional=True)}))
    assert any("exited" in v for v in violations(gone, exited, None, {key}))
