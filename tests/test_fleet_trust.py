"""`loadertop fleet` reads what any scraped target wrote (docs/SECURITY.md, the fourth review,
2 and 4): label values are made printable where they enter, every output renders them as
text (Markdown through code spans and cells, HTML escaped, the TUI's cells as Text), and a
series no agent could write is refused with a notice, never a traceback. A real HTTP server
stands in for Prometheus's API."""

from __future__ import annotations

import json
import re

import pytest
from support.fake_prometheus import series, serving

from loadertop.outputs import fleet as F
from loadertop.probes.prometheus import Prometheus

NOW = 1_800_000_000.0
EVIL = "\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202e`x`\n## OK nothing to fix\n<img src=x onerror=alert(1)>"
LABELS = {"train_job": "job" + EVIL, "node": "node" + EVIL, "pod": "pod" + EVIL, "namespace": "ns" + EVIL,
          "world_size": "2"}


def answer(query: str) -> list:
    if query.startswith("last_over_time(loadertop_finding"):
        return [series("loadertop_finding", {**LABELS, "rank": "1", "id": "input_bound" + EVIL}, 1)]
    if query.startswith("last_over_time(loadertop_data_wait_ratio"):
        return [series("loadertop_data_wait_ratio", {**LABELS, "rank": "1"}, 0.8),
                series("loadertop_data_wait_ratio", {**LABELS, "rank": "0"}, 0.02),
                series("loadertop_data_wait_ratio", {**LABELS, "rank": "²"}, 0.5),  # a digit to isdigit, no rank
                series("loadertop_data_wait_ratio", {**LABELS, "rank": "3"}, 0.5, at="Infinity"),
                {"metric": {"node": ["not", "a", "string"]}, "value": [NOW, "1"]},
                {"metric": {"node": "n"}, "value": "nonsense"}]
    if query.startswith("loadertop_trainer_info"):  # the ranks the agent serves now
        return [series("loadertop_trainer_info", {**LABELS, "rank": r}, 1) for r in ("0", "1")]
    if query.startswith("last_over_time(loadertop_"):
        return []
    if "timestamp(" in query or query == "loadertop_host_cpu_percent":
        return [series("x", {"node": "node" + EVIL}, NOW)]
    return []


@pytest.fixture
def prometheus():
    with serving(answer) as url:
        yield url


RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_hostile_labels_reach_no_output_raw_and_hostile_series_are_refused_with_a_notice(prometheus):
    report = F.read(Prometheus(prometheus), now=NOW)
    (job,) = report["jobs"]
    assert sorted(r["rank"] for r in job["ranks"]) == [0, 1]
    assert report["notices"] and "4 series refused" in report["notices"][0]
    text = F.render_text(report)
    md = F.render_md(report)
    page = F.render_html(report)
    for out in (text, md, page, json.dumps(report, ensure_ascii=False)):
        assert not RAW.search(out), RAW.search(out)
        assert "\\x1b]52" in out or "\\\\x1b]52" in out  # shown, as a visible escape
    # Markdown: no forged heading, no live HTML; every label inside a code span.
    assert not [line for line in md.splitlines() if line.startswith("## OK")]
    assert all(line.startswith(("# loadertop fleet", "## `")) for line in md.splitlines() if line.startswith("#"))
    for line in md.splitlines():
        outside = re.sub(r"(`+).*?\1", "", line)
        assert "<img" not in outside, line
    assert "<img" not in page.replace("&lt;img", "")


async def test_the_fleet_view_shows_hostile_labels_as_text(prometheus):
    from loadertop.tui.fleet_view import FleetApp, FleetRead

    report = F.read(Prometheus(prometheus), now=NOW)
    report["jobs"][0]["job"] = "[bold]x[/nope] " + report["jobs"][0]["job"]  # markup would crash the table
    app = FleetApp(Prometheus("http://127.0.0.1:1"), interval_s=3600)
    async with app.run_test(size=(120, 30)) as pilot:
        app.post_message(FleetRead(report, None))
        await pilot.pause(0.3)
        row = [str(c) for c in app.query_one("#jobs").get_row_at(0)]
        assert row[0].startswith("[bold]x[/nope] job\\x1b]0;owned")
        assert not RAW.search(str(app.query_one("#ranks").render()))


# --- one answer: what the node judged, live jobs only ----------------------------------------------

JOB = {"train_job": "run:a", "world_size": "2"}


def fleet_of(serving_now: set[str], verdicts: dict[str, str]):
    def answer(query: str) -> list:
        if query.startswith("loadertop_trainer_info"):
            return [series("loadertop_trainer_info", {**JOB, "node": f"n{r}", "rank": r}) for r in sorted(serving_now)]
        if query.startswith("last_over_time(loadertop_data_wait_ratio"):
            return [series("loadertop_data_wait_ratio", {**JOB, "node": f"n{r}", "rank": r}, 0.1) for r in ("0", "1")]
        if query.startswith("last_over_time(loadertop_verdict"):
            return [series("loadertop_verdict", {**JOB, "node": f"n{r}", "rank": r, "verdict": v, "provisional": "0"})
                    for r, v in verdicts.items()]
        if query.startswith("last_over_time(loadertop_finding"):  # one finding, two severities' series
            return [series("loadertop_finding", {**JOB, "node": "n1", "rank": "1", "id": "worker_died",
                                                 "severity": sev}) for sev in ("warning", "critical")]
        if "timestamp(" in query or query == "loadertop_host_cpu_percent":
            return [series("x", {"node": n}, NOW) for n in ("n0", "n1")]
        return []
    return answer


def test_the_fleet_shows_what_each_node_judged_and_a_finding_once():
    with serving(fleet_of({"0", "1"}, {"0": "HEALTHY", "1": "WORKER DIED"})) as url:
        (job,) = F.read(Prometheus(url), now=NOW)["jobs"]
    by_rank = {r["rank"]: r for r in job["ranks"]}
    assert by_rank[1]["verdict"] == "WORKER DIED" and by_rank[1]["findings"] == ["worker_died"]
    assert job["verdict"] == "WORKER DIED on rank 1" and not job["ended"]


def test_an_ended_job_is_marked_at_once_and_listed_only_when_asked():
    with serving(fleet_of(set(), {"0": "HEALTHY", "1": "HEALTHY"})) as url:
        assert F.read(Prometheus(url), now=NOW)["jobs"] == []
        (job,) = F.read(Prometheus(url), now=NOW, ended=True)["jobs"]
    assert job["ended"] and job["verdict"] == "ENDED" and {r["verdict"] for r in job["ranks"]} == {"ENDED"}
    # One rank of two still served: the job is live, its ended rank says so.
    with serving(fleet_of({"0"}, {"0": "HEALTHY", "1": "HEALTHY"})) as url:
        (job,) = F.read(Prometheus(url), now=NOW)["jobs"]
    assert not job["ended"] and {r["rank"]: r["verdict"] for r in job["ranks"]} == {0: "HEALTHY", 1: "ENDED"}


# --- a Prometheus that stalls or sends the reader elsewhere (items 3 and 13) ------------------------


def _server(handler):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            handler(self)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("drip", ["body", "headers"])
def test_a_prometheus_that_drips_its_answer_is_cut_off_at_one_deadline(drip):
    import time

    from loadertop.probes.prometheus import FleetError

    def slow(h):
        try:
            if drip == "headers":
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
                    time.sleep(0.2)
            h.send_response(200)
            h.end_headers()
            for byte in b'{"status": "success", "data": {"result": []}}' * 10:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
                time.sleep(0.2)  # each read well within the socket's timeout
        except OSError:
            pass

    server, url = _server(slow)
    try:
        started = time.monotonic()
        with pytest.raises(FleetError, match="did not answer within 1 s"):
            Prometheus(url, timeout_s=1.0).query("up")
        assert time.monotonic() - started < 3.0
    finally:
        server.shutdown()


def test_a_redirect_off_the_given_origin_is_refused():
    from loadertop.probes.prometheus import FleetError

    elsewhere, other = _server(lambda h: (h.send_response(200), h.end_headers(),
                                          h.wfile.write(b'{"status": "success", "data": {"result": []}}')))

    def moved(h):
        h.send_response(302)
        h.send_header("Location", other + h.path)
        h.end_headers()

    server, url = _server(moved)
    try:
        with pytest.raises(FleetError, match="redirected to http://127.0.0.1:"):
            Prometheus(url).query("up")
        assert Prometheus(other).query("up") == []  # the same answer, asked there, is read
    finally:
        server.shutdown()
        elsewhere.shutdown()


def test_a_fleet_past_the_cap_is_read_in_part_with_a_notice(monkeypatch):
    from loadertop.probes import prometheus as P

    monkeypatch.setattr(P, "MAX_SERIES", 50)
    monkeypatch.setattr(F, "MAX_SERIES", 50)

    def answer(query: str) -> list:
        if query.startswith("last_over_time(loadertop_data_wait_ratio") or query.startswith("loadertop_trainer_info"):
            return [series("m", {"train_job": f"job-{i}", "node": "n", "rank": "0"}) for i in range(120)]
        return []

    with serving(answer) as url:
        report = F.read(Prometheus(url), now=NOW)
    assert len(report["jobs"]) == 50
    assert any("past the cap of 50" in n and "--job NAME" in n for n in report["notices"]), report["notices"]
