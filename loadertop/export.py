"""Prometheus exporter: the latest snapshot and findings as `loadertop_*` metrics.

Sampling runs on its own thread at the interval; a scrape only reads the latest snapshot,
so scrapes never wait for /proc or py-spy and never sample twice. Metric names and help
text come from loadertop.fields. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import threading
import time

from .fields import EXPORTED, FINDING_METRIC
from .model import Finding, Snapshot
from .rules import Diagnoser


class Exporter:
    def __init__(self, sampler, interval_s: float = 1.0) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.diagnoser = Diagnoser()
        self.latest: tuple[Snapshot, list[Finding]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadertop-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            snap = self.sampler.tick()
            findings = self.diagnoser.feed(snap)
            with self._lock:
                self.latest = (snap, findings)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sampler.close()

    # prometheus_client's custom collector protocol
    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            latest = self.latest
        if latest is None:
            return
        snap, findings = latest
        host = snap.host.hostname
        families = {}
        for metric in EXPORTED:
            families[metric.name] = GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)
        for t in snap.trainers:
            rank = "" if t.rank is None else str(t.rank)
            trainer_labels = [host, str(t.pid), rank]
            for metric in EXPORTED:
                if metric.scope == "trainer":
                    value = metric.value(t)
                    if value is not None:
                        families[metric.name].add_metric(trainer_labels, float(value))
                elif metric.scope == "process":
                    for role, p in [("main", t.main), *(("worker", w) for w in t.workers)]:
                        value = metric.value(p)
                        if value is not None:
                            wid = "" if p.worker_id is None else str(p.worker_id)
                            families[metric.name].add_metric([*trainer_labels, str(p.pid), wid, role], float(value))
        for metric in EXPORTED:
            if metric.scope == "host":
                value = metric.value(snap.host)
                if value is not None:
                    families[metric.name].add_metric([host], float(value))
        yield from families.values()
        active = GaugeMetricFamily(FINDING_METRIC.name, FINDING_METRIC.help, labels=FINDING_METRIC.labels)
        for f in findings:
            active.add_metric([host, str(f.trainer_pid or ""), f.id, f.severity], 1.0)
        yield active


def serve(sampler, listen: str, interval_s: float) -> None:
    """Serve until interrupted. listen is HOST:PORT."""
    from prometheus_client import start_http_server
    from prometheus_client.core import CollectorRegistry

    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    exporter = Exporter(sampler, interval_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    try:
        server, _ = start_http_server(int(port), addr=host, registry=registry)
    except OSError:
        sampler.close()
        raise
    exporter.start()
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
        exporter.close()
