"""Reading the fleet back from Prometheus: a source like the probes (it knows Prometheus's
HTTP API, not the screen). Every query has a timeout; every way it can fail is one line that
says what and how to fix it (FleetError).

Whatever Prometheus holds, any scraped target (any tenant's pod, a Pushgateway) may have
written: label values are made printable here, where they enter (an escape sequence in a
`node` label reached the terminal), and a series whose labels or figures are not ones an
agent writes is refused and counted (`refused`), never a traceback."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPMessage
from typing import IO

from ..text import printable

TIMEOUT_S = 5.0  # for one query, whole: a server that drips a byte every 2 s is cut off there
MAX_BYTES = 32 << 20  # an answer past this is not one loadertop asked for
# Series read from one answer: a fleet past this is read in part, with a notice naming the cap
# (200,000 series cost 80 s and 1.4 GiB when all were read; `--job` reads one job whole).
MAX_SERIES = 20_000
CHUNK = 1 << 16
MAX_LABEL = 256  # characters of a label value kept (an agent's are short: hosts, jobs, ranks)


class FleetError(Exception):
    """Prometheus cannot be read: the message says what and how to fix it."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (epoch seconds, value)


class Prometheus:
    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FleetError(f"--prometheus {url!r}: give its address, e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.refused = 0  # series refused so far (labels or figures no agent writes)
        self.capped = 0  # series left out past MAX_SERIES

    def query(self, promql: str) -> list[Sample]:
        """An instant query's samples (a vector); NaN values are left out."""
        out = []
        for item in self._get("query", {"query": promql}):
            labels = _labels(item)
            try:
                value = float(item["value"][1])
                at = float(item["value"][0])
            except (KeyError, TypeError, ValueError, IndexError, OverflowError):
                labels = None
            if labels is None or not math.isfinite(at):
                self.refused += 1
            elif math.isfinite(value):
                out.append(Sample(labels, value))
        return out

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query's series (a matrix), each its (time, value) points; NaN left out."""
        out = []
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(1.0, step_s):g}"}
        for item in self._get("query_range", params):
            labels = _labels(item)
            try:
                points = tuple((float(t), float(v)) for t, v in item["values"])
            except (KeyError, TypeError, ValueError, OverflowError):
                labels = None
            if labels is None or not all(math.isfinite(t) for t, _ in points):
                self.refused += 1
                continue
            out.append(Series(labels, tuple(p for p in points if math.isfinite(p[1]))))
        return out

    def _get(self, api: str, params: dict[str, str]) -> list:
        """The result list of one API call, or FleetError saying what went wrong. The whole
        call has one deadline (the socket's timeout holds only for one read: a server that
        answers a byte every 2 s kept `fleet` waiting for ever); a redirect is followed only
        within the given origin."""
        address = f"{self.url}/api/v1/{api}?{urllib.parse.urlencode(params)}"
        deadline = time.monotonic() + self.timeout_s
        late = FleetError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s (--timeout S "
                          "allows more)")
        # In a thread of its own, waited for until the deadline: a server that drips its headers
        # a byte at a time holds urllib's reads, never the caller.
        done: list = []
        reader = threading.Thread(target=lambda: done.append(self._read(address, deadline, late)), daemon=True,
                                  name="loadertop-prometheus")
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()) + 0.5)
        if not done:
            raise late
        body = done[0]
        if isinstance(body, BaseException):
            raise body
        if len(body) > MAX_BYTES:
            raise FleetError(f"{self.url} answered more than {MAX_BYTES >> 20} MiB to one query")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise FleetError(f"{self.url} did not answer as Prometheus does (no JSON): give the Prometheus "
                             "server's address") from None
        if not isinstance(data, dict) or data.get("status") != "success":
            error = data.get("error") if isinstance(data, dict) else None
            raise FleetError(f"Prometheus at {self.url} did not run the query ({error or 'not its answer'})")
        result = (data.get("data") or {}).get("result") if isinstance(data.get("data"), dict) else None
        if not isinstance(result, list):
            raise FleetError(f"{self.url} did not answer as Prometheus does (no result)")
        if len(result) > MAX_SERIES:
            self.capped += len(result) - MAX_SERIES
            del result[MAX_SERIES:]
        return result

    def _read(self, address: str, deadline: float, late: FleetError) -> bytes | BaseException:
        """The answer's body, or the error that says why there is none (returned: it runs in a
        thread of its own)."""
        try:
            with _OPENER.open(address, timeout=self.timeout_s) as r:
                _same_origin(self.url, r.geturl())
                parts = []
                size = 0
                while size <= MAX_BYTES:
                    if time.monotonic() > deadline:
                        return late
                    chunk = r.read1(CHUNK)
                    if not chunk:
                        break
                    parts.append(chunk)
                    size += len(chunk)
                return b"".join(parts)
        except FleetError as e:
            return e
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                return FleetError(f"Prometheus at {self.url} refused the query ({e.code}): give a URL that needs no "
                                  "credentials here, or one with them (http://user:password@host:9090)")
            if e.code == 404:
                api = urllib.parse.urlparse(address).path.rsplit("/", 1)[-1]
                return FleetError(f"{self.url} has no Prometheus query API (404 for /api/v1/{api}): give the "
                                  "Prometheus server's address, not an exporter's or a dashboard's")
            return FleetError(f"Prometheus at {self.url} answered {e.code} {e.reason}")
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return FleetError(f"cannot reach Prometheus at {self.url} ({reason}): is it running, and is the "
                              "address right?")


def _labels(item: object) -> dict[str, str] | None:
    """A series' labels, printable and bounded; None where they are not a flat map of strings."""
    metric = item.get("metric") if isinstance(item, dict) else None
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        return None
    return {printable(k)[:MAX_LABEL]: printable(v)[:MAX_LABEL] for k, v in metric.items()}


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the origin it was asked (scheme, host and port): a server
    that sends `fleet` elsewhere (another host, a metadata address) is refused."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: HTTPMessage, newurl: str) -> urllib.request.Request | None:
        _same_origin(req.full_url, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _same_origin(asked: str, got: str) -> None:
    a, b = urllib.parse.urlparse(asked), urllib.parse.urlparse(urllib.parse.urljoin(asked, got))
    if (a.scheme, a.hostname, a.port) != (b.scheme, b.hostname, b.port):
        raise FleetError(f"{a.scheme}://{a.netloc} redirected to {b.scheme}://{b.netloc}: loadertop follows a "
                         "redirect only within the address given; give the Prometheus server's own address")


_OPENER = urllib.request.build_opener(_SameOrigin)
