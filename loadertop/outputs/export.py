"""Prometheus exporter: the latest snapshot and findings as `loadertop_*` metrics.

Sampling runs on its own thread at the interval; a scrape only reads the latest snapshot,
so scrapes never wait for /proc or py-spy and never sample twice. A tick that fails is
counted and sampling goes on; a snapshot older than a few intervals is not served as if it
were current. Metric names and help text come from loadertop.fields. The HTTP server binds to
127.0.0.1 unless told otherwise, and caps its connections and their idle time.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..fields import (
    EXPORTED,
    FINDING_METRIC,
    LAST_SAMPLE,
    PROCESS_INFO,
    SAMPLE_ERRORS,
    STRAGGLER_METRIC,
    TRAINER_INFO,
    TUNE_DECISIONS,
    TUNE_EXPORTED,
    TUNE_STATE,
    VERDICT_METRIC,
    worker_id_text,
)
from ..model import Snapshot, TrainerSnapshot
from ..probes.host import job_roots
from ..probes.launch import masked
from ..rules import Diagnoser
from ..rules.diagnosis import Diagnosis
from ..rules.ranks import Attribution, rank_figures

# A scrape holds a connection for milliseconds: a few at once is plenty, and a client that
# opens connections and sends nothing (slowloris) must not hold threads for long.
MAX_CONNECTIONS = 16
# Of those, one client (a host: client_of) may hold this many: 16 idle clients of one host
# that reconnect no longer block the scrapes of the others (Prometheus holds one connection a
# target).
MAX_PER_CLIENT = 4
# A connection past a cap waits this long for a silent one it displaced to go.
EVICT_WAIT_S = 1.0
IDLE_TIMEOUT_S = 10.0
REQUEST_DEADLINE_S = 10.0  # a whole request, however slowly its bytes come
# A snapshot older than this many intervals (at least STALE_MIN_S) means sampling stopped.
STALE_INTERVALS = 5
STALE_MIN_S = 10.0


@dataclass(frozen=True)
class RankView:
    """A rank's figures as exported: how its job's ranks are compared (rules/ranks.py)."""

    sync_frames: float | None
    sync_blocked: float | None
    wait_for_ranks: float | None
    frames_error: float | None = None
    blocked_error: float | None = None


def rank_views(snap: Snapshot, recent, compared: Mapping[str, Attribution]) -> dict[int, RankView]:
    """Each rank of the snapshot by pid, with its wait for the other ranks of its job seen here
    (`compared`: the diagnosis's jobs)."""
    out = {}
    for t in snap.trainers:
        job = compared.get(t.job)
        # The job's comparison holds its ranks' figures already; a rank alone is read here.
        figures = next((r for r in job.ranks if r.pid == t.pid), None) if job is not None else None
        figures = figures or rank_figures(snap, t, recent)
        if figures is None:
            continue
        out[t.pid] = RankView(figures.sync_frames, figures.sync_blocked,
                              job.wait_of(figures.rank) if job is not None else None,
                              figures.frames_error if figures.sync_frames is not None else None,
                              figures.blocked_error if figures.sync_blocked is not None else None)
    return out


def trainer_labels(t: TrainerSnapshot, node: str, job_names: bool = True) -> list[str]:
    """node, train_job, rank, local_rank, world_size, namespace, pod (fields.TRAINER_LABELS).
    Without `job_names`, a job named from another user's environment is served masked."""
    def text(x: int | str | None) -> str:
        return "" if x is None else str(x)
    job = t.job if job_names or t.owner_uid in (None, os.geteuid()) else masked(t.job)
    return [node, job, text(t.rank), text(t.local_rank), text(t.world_size), text(t.namespace), text(t.pod)]


class Exporter:
    def __init__(self, sampler, interval_s: float = 1.0, workers: bool = True, job_names: bool = False) -> None:
        self.sampler = sampler
        self.workers = workers  # per-worker series
        # Job names read from other users' environments (owner-only, /proc/PID/environ) are
        # served as digests unless asked (`--job-names`): every local user can scrape.
        self.job_names = job_names
        self.interval_s = interval_s
        self.diagnoser = Diagnoser()
        self.latest: tuple[Snapshot, Diagnosis, dict[int, RankView]] | None = None
        self.last_sample_at: float | None = None
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadertop-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample_once(self) -> None:
        """One tick; a failure is counted and told once, never the end of sampling."""
        try:
            snap = self.sampler.tick()
            self.diagnoser.feed(snap)
            diagnosis = self.diagnoser.diagnosis
            ranks = rank_views(snap, self.diagnoser.recent, diagnosis.jobs)
        except Exception as e:  # noqa: BLE001 (whatever broke, the next tick may work)
            with self._lock:
                self.errors += 1
                first = self.last_error is None
                self.last_error = f"{type(e).__name__}: {e}"
            if first:
                print(f"loadertop: a sample failed ({self.last_error}); sampling goes on", file=sys.stderr)
            return
        with self._lock:
            self.latest = (snap, diagnosis, ranks)
            self.last_sample_at = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sampler.close()

    def stale(self, last_at: float | None, now: float | None = None) -> bool:
        """A snapshot sampled at last_at is too old to serve as current."""
        now = time.time() if now is None else now
        limit = max(STALE_MIN_S, STALE_INTERVALS * self.interval_s)
        return last_at is None or now - last_at > limit

    # prometheus_client's custom collector protocol
    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            latest, last_at, errors = self.latest, self.last_sample_at, self.errors
        sampled = GaugeMetricFamily(LAST_SAMPLE.name, LAST_SAMPLE.help)
        if last_at is not None:
            sampled.add_metric([], last_at)
        yield sampled
        failed = CounterMetricFamily(SAMPLE_ERRORS.name, SAMPLE_ERRORS.help)
        failed.add_metric([], errors)
        yield failed
        if latest is None or self.stale(last_at):  # the same reading as `latest`, under one lock
            return  # no figures rather than old ones that look current
        snap, diagnosis, ranks = latest
        host = snap.host.hostname
        families = {}
        for metric in EXPORTED:
            families[metric.name] = GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)
        info = GaugeMetricFamily(PROCESS_INFO.name, PROCESS_INFO.help, labels=list(PROCESS_INFO.labels))
        trainer_info = GaugeMetricFamily(TRAINER_INFO.name, TRAINER_INFO.help, labels=list(TRAINER_INFO.labels))
        labels_of = {t.pid: trainer_labels(t, host, self.job_names) for t in snap.trainers}
        for t in snap.trainers:
            trainer_labels_ = labels_of[t.pid]
            trainer_info.add_metric([*trainer_labels_, str(t.pid), str(t.job_pid)], 1.0)
            for metric in EXPORTED:
                if metric.scope in ("trainer", "rank"):
                    of = t if metric.scope == "trainer" else ranks.get(t.pid)
                    value = metric.value(of) if of is not None else None
                    if value is not None:
                        families[metric.name].add_metric(trainer_labels_, float(value))
            processes = [("main", "", t.main)]
            for i, w in enumerate(t.workers if self.workers else ()):
                # Until py-spy reads a worker's id, its place among the workers stands in:
                # series stay distinct and stable when workers are re-created.
                processes.append(("worker", worker_id_text(w.worker_id, i), w))
            for role, wid, p in processes:
                labels = [*trainer_labels_, wid, role]
                info.add_metric([*labels, str(p.pid)], 1.0)
                for metric in EXPORTED:
                    if metric.scope == "process":
                        value = metric.value(p)
                        if value is not None:
                            families[metric.name].add_metric(labels, float(value))
        yield from self._tune(snap, labels_of)
        for metric in EXPORTED:
            if metric.scope == "host":
                value = metric.value(snap.host)
                if value is not None:
                    families[metric.name].add_metric([host], float(value))
        yield from families.values()
        yield trainer_info
        yield info
        active = GaugeMetricFamily(FINDING_METRIC.name, FINDING_METRIC.help, labels=list(FINDING_METRIC.labels))
        for f in diagnosis.findings:
            at = labels_of.get(f.trainer_pid or 0, [host, "", "", "", ""])
            active.add_metric([*at, f.id, f.severity], 1.0)
        yield active
        # What the node judged, as its live view says it: the fleet shows it, never judges it again.
        said = GaugeMetricFamily(VERDICT_METRIC.name, VERDICT_METRIC.help, labels=list(VERDICT_METRIC.labels))
        waited = GaugeMetricFamily(STRAGGLER_METRIC.name, STRAGGLER_METRIC.help, labels=list(STRAGGLER_METRIC.labels))
        for t in snap.trainers:
            v = diagnosis.verdict(t)
            said.add_metric([*labels_of[t.pid], v.text, "1" if v.provisional else "0"], 1.0)
            job = diagnosis.job(t.job)
            if job is not None and job.straggler is not None and job.straggler.pid == t.pid:
                waited.add_metric([*labels_of[t.pid], job.straggler.cause], 1.0)
        yield said
        yield waited


    @staticmethod
    def _tune(snap: Snapshot, labels_of: dict[int, list[str]]):
        """Each tuned loader's in-place tuner: its setting, state and decisions."""
        from prometheus_client.core import GaugeMetricFamily

        families = [GaugeMetricFamily(m.name, m.help, labels=m.labels) for m in TUNE_EXPORTED]
        state = GaugeMetricFamily(TUNE_STATE.name, TUNE_STATE.help, labels=list(TUNE_STATE.labels))
        decisions = GaugeMetricFamily(TUNE_DECISIONS.name, TUNE_DECISIONS.help, labels=list(TUNE_DECISIONS.labels))
        for t in snap.trainers:
            for loader in t.loaders:
                tune = loader.tune
                if tune is None:
                    continue
                at = [*labels_of[t.pid], loader.label]
                for metric, family in zip(TUNE_EXPORTED, families, strict=True):
                    value = metric.value(tune)
                    if value is not None:
                        family.add_metric(at, float(value))
                state.add_metric([*at, tune.state], 1.0)
                for action in ("try", "keep", "revert", "settle", "off"):
                    decisions.add_metric([*at, action], float(sum(d.action == action for d in tune.decisions)))
        yield from (*families, state, decisions)


def client_of(address: str) -> str:
    """The client a connection counts against: one host, where one host may hold many
    addresses (every 127.x.y.z is this host's, an IPv6 host its /64)."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _Open:
    """A connection held: whose, since when, and whether it has asked for anything yet."""

    client: str
    since: float
    asked: bool = False


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS of them and MAX_PER_CLIENT from one
    client (client_of: many loopback addresses are one client). A connection past either cap
    takes the place of the longest-held one that has not asked for anything yet (its cap's);
    where every held one has, it is closed at once rather than queued. So connections that
    say nothing, from however many addresses, never keep a scrape out."""

    daemon_threads = True

    def __init__(self, address, handler) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self._open: dict[socket.socket, _Open] = {}
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def _full(self, client: str) -> list[socket.socket] | None:
        """The connections among which one must give way for `client`'s; None if none must."""
        mine = [s for s, o in self._open.items() if o.client == client]
        if len(mine) >= MAX_PER_CLIENT:
            return mine
        if len(self._open) >= MAX_CONNECTIONS:
            return list(self._open)
        return None

    def _take(self, request: socket.socket, client: str) -> bool:
        deadline = time.monotonic() + EVICT_WAIT_S
        with self._lock:
            while (among := self._full(client)) is not None:
                silent = [s for s in among if not self._open[s].asked]
                if not silent:
                    return False
                oldest = min(silent, key=lambda s: self._open[s].since)
                self._open[oldest].asked = True  # evicted once: not chosen again
                try:
                    oldest.shutdown(socket.SHUT_RDWR)  # its blocked read ends, and its thread
                except OSError:
                    pass
                left = deadline - time.monotonic()
                if left <= 0 or not self._freed.wait(left):
                    return False
            self._open[request] = _Open(client, time.monotonic())
            return True

    def asked(self, request: socket.socket) -> None:
        with self._lock:
            if request in self._open:
                self._open[request].asked = True

    def _give_back(self, request: socket.socket) -> None:
        with self._lock:
            self._open.pop(request, None)
            self._freed.notify_all()

    def process_request(self, request, client_address) -> None:
        if not self._take(request, client_of(str(client_address[0]))):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request)

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up or dawdles is its own fault: no traceback on our stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError, OSError)):
            return
        print(f"loadertop: a scrape from {client_address[0]} failed: {type(error).__name__}: {error}", file=sys.stderr)


def _handler(registry):
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    class Handler(BaseHTTPRequestHandler):
        timeout = IDLE_TIMEOUT_S  # the socket's: a silent client is dropped

        def setup(self) -> None:
            super().setup()
            # The socket's timeout applies to each recv: a client sending a byte at a time
            # would hold its slot for ever. The whole request has a deadline; past it the
            # connection is shut, and the blocked read ends.
            self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._cut)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self) -> None:
            self._deadline.cancel()
            try:
                super().finish()
            except OSError:
                pass  # the client went away while we wrote

        def parse_request(self) -> bool:
            if isinstance(self.server, _Server):
                self.server.asked(self.connection)  # it asked: no longer a silent one to displace
            return super().parse_request()

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
            pass  # a scrape a second is not news

    return Handler


class NodeAgent:
    """`loadertop export --all`: every training job on this host. Before each tick it drops
    the jobs that ended (their series go with them) and adds the jobs that started (found
    within an interval: probes.host.job_roots); the rest is the exporter's, as for PIDs."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.gpu_pids: frozenset[int] = frozenset()
        self.own = os.getpid()

    @property
    def interval_s(self) -> float:
        return self.sampler.interval_s

    def tick(self) -> Snapshot:
        self.sampler.drop_ended()
        for pid in sorted(job_roots(self.gpu_pids) - {self.own}):
            self.sampler.add_job(pid)
        snap = self.sampler.tick()
        self.gpu_pids = frozenset(p for g in snap.gpus for p in g.process_pids)
        return snap

    def close(self) -> None:
        self.sampler.close()


def serve(sampler, listen: str, interval_s: float, workers: bool = True, job_names: bool = False) -> None:
    """Serve until interrupted. listen is HOST:PORT. workers: per-worker series (off for a
    large node: the trainers' and main processes' series stay). job_names: other users' job
    names as read (else masked: probes/launch.masked)."""
    from prometheus_client.core import CollectorRegistry

    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    exporter = Exporter(sampler, interval_s, workers=workers, job_names=job_names)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    try:
        server = _Server((host, int(port)), _handler(registry))
    except OSError:
        sampler.close()
        raise
    threading.Thread(target=server.serve_forever, name="loadertop-http", daemon=True).start()
    exporter.start()
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
        server.server_close()
        exporter.close()


# --- where it listens ------------------------------------------------------------------------


def serves_every_interface(host: str) -> bool:
    """The host as the socket will bind it is the unspecified address (0.0.0.0, ::): every
    spelling of it (0, 0.0, 0x0, 00, [::0], [0:0:0:0:0:0:0:0]) resolves to that."""
    import ipaddress

    name = host.strip("[]")
    if not name:
        return True  # an empty host binds every interface too
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        try:
            return _unspecified(ipaddress.ip_address(name))
        except ValueError:
            return False  # a host name: it resolves to its own addresses
    return any(_unspecified(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos)


def _unspecified(address) -> bool:
    """The unspecified address, also as IPv4 mapped into IPv6 (::ffff:0.0.0.0 binds every IPv4
    interface)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_unspecified or (mapped is not None and mapped.is_unspecified)
