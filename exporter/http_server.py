"""The HTTP endpoint: /metrics, /healthz, /readyz and a landing page."""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter import __version__
from exporter.health import HealthBoard

log = logging.getLogger(__name__)

LANDING_PAGE = f"""<!doctype html>
<html><head><title>queue-exporter</title></head>
<body><h1>queue-exporter {__version__}</h1>
<ul>
<li><a href="metrics">/metrics</a> (Prometheus text and OpenMetrics)</li>
<li><a href="healthz">/healthz</a> (process alive)</li>
<li><a href="readyz">/readyz</a> (every source reached and not failing)</li>
</ul></body></html>
""".encode()


class MetricsServer:
    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, health: HealthBoard
    ) -> None:
        handler = _handler_class(registry, health)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler_class(
    registry: CollectorRegistry, health: HealthBoard
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"queue-exporter/{__version__}"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            route: Callable[[], None] | None = {
                "/metrics": self._metrics,
                "/healthz": self._healthz,
                "/readyz": self._readyz,
                "/": self._landing,
            }.get(path)
            if route is None:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")
            else:
                route()

        def _metrics(self) -> None:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(registry)
            except Exception:
                log.exception("rendering /metrics failed")
                self._send(500, "text/plain; charset=utf-8", b"rendering metrics failed\n")
                return
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            self._send(200, content_type, gzip.compress(body) if gzipped else body, gzipped)

        def _healthz(self) -> None:
            self._send(200, "text/plain; charset=utf-8", b"ok\n")

        def _readyz(self) -> None:
            statuses = health.snapshot()
            body = {
                name: {"up": status.up, "error": status.last_error}
                for name, status in statuses.items()
            }
            ready = all(status.up for status in statuses.values())
            payload = json.dumps({"ready": ready, "sources": body}).encode()
            self._send(200 if ready else 503, "application/json", payload)

        def _landing(self) -> None:
            self._send(200, "text/html; charset=utf-8", LANDING_PAGE)

        def _send(self, code: int, content_type: str, body: bytes, gzipped: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler
