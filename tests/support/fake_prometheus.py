"""A stand-in for Prometheus's HTTP query API on loopback: `answer(query) -> list` of series
(the `result` of an instant query). The fleet reader talks to it over real HTTP."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def series(metric: str, labels: dict, value: float = 1.0, at: float | str = 1_800_000_000.0) -> dict:
    return {"metric": {"__name__": metric, **labels}, "value": [at, str(value)]}


@contextmanager
def serving(answer):
    class Api(BaseHTTPRequestHandler):
        def do_GET(self):
            q = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": answer(q)}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
