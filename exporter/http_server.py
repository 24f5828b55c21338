"""The HTTP endpoint: /metrics, /healthz, /readyz and a landing page.

With a web config file (exporter/web_config.py) it speaks TLS, checks client certificates and
basic auth, and adds the configured headers. Basic auth covers every path but two, so that
Kubernetes probes need no secret in the pod spec: /healthz (its body is "ok") and /readyz,
which without credentials answers its status code and {"ready": ...} only; the source
details need credentials like /metrics.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter import __version__
from exporter.health import HealthBoard
from exporter.web_config import (
    LoadedWebConfig,
    WebConfigWatcher,
    client_san_allowed,
    describe,
    exposure_warning,
)

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


HANDSHAKE_TIMEOUT = 10.0  # seconds a client may take over the TLS handshake
REQUEST_TIMEOUT = 30.0  # seconds a connection may sit idle: slow clients cannot pin threads
UNAUTHORIZED_HEADER = 'Basic realm="queue-exporter", charset="UTF-8"'


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: HealthBoard,
        web_config_file: Path | None = None,
    ) -> None:
        """Raises WebConfigError for a web config file that does not load (before binding)."""
        self.host = host
        self.web = WebConfigWatcher(web_config_file) if web_config_file is not None else None
        handler = _handler_class(registry, health, self.web)
        self.httpd = _Server((host, port), handler, self.web)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self.web is not None and self.web.tls_enabled else "http"

    def start(self) -> None:
        loaded = self.web.current() if self.web is not None else None
        log.info("%s", describe(loaded))
        warning = exposure_warning(self.host, loaded)
        if warning is not None:
            log.warning("%s", warning)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Server(ThreadingHTTPServer):
    """Plain HTTP, or TLS with the handshake in the connection's own thread (never the
    accept loop's), under the certificate current at that moment (rotation needs no restart)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        web: WebConfigWatcher | None,
    ) -> None:
        self.web = web
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.web is None or not self.web.tls_enabled:
            super().finish_request(request, client_address)
            return
        loaded = self.web.current()
        if loaded is None or loaded.ssl_context is None:
            return  # the file no longer loads: no handshake, nothing served
        try:
            request.settimeout(HANDSHAKE_TIMEOUT)
            connection = loaded.ssl_context.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            log.debug("TLS handshake with %s failed: %s", client_address[0], error)
            return
        try:
            if not client_san_allowed(loaded.tls, connection.getpeercert()):
                log.debug("client certificate of %s has no allowed SAN", client_address[0])
                return
            super().finish_request(connection, client_address)
        finally:
            _close(connection)


def _close(connection: ssl.SSLSocket) -> None:
    with contextlib.suppress(OSError):  # the client may be gone already
        connection.shutdown(socket.SHUT_RDWR)
    connection.close()


def _handler_class(
    registry: CollectorRegistry, health: HealthBoard, web: WebConfigWatcher | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"queue-exporter/{__version__}"
        timeout = REQUEST_TIMEOUT
        extra_headers: dict[str, str] = {}

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            loaded = web.current() if web is not None else None
            if web is not None:
                if loaded is None:  # fail closed: the file on disk is broken
                    self._send(500, "text/plain; charset=utf-8", b"web config does not load\n")
                    return
                self.extra_headers = {
                    name: value
                    for name, value in loaded.config.http_server_config.headers.items()
                    if value  # "unset if blank", as in the toolkit
                }
                if not web.allow_request():
                    self._send(429, "text/plain; charset=utf-8", b"too many requests\n")
                    return
            if path == "/healthz":
                self._healthz()
                return
            authorized = self._authorized(loaded, path)
            if path == "/readyz":
                self._readyz(detailed=authorized)
                return
            if not authorized:
                self._unauthorized()
                return
            route: Callable[[], None] | None = {
                "/metrics": self._metrics,
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

        def _readyz(self, detailed: bool) -> None:
            statuses = health.snapshot()
            ready = all(status.up for status in statuses.values())
            document: dict[str, object] = {"ready": ready}
            if detailed:
                document["sources"] = {
                    name: {"up": status.up, "error": status.last_error}
                    for name, status in statuses.items()
                }
            payload = json.dumps(document).encode()
            self._send(200 if ready else 503, "application/json", payload)

        def _authorized(self, loaded: LoadedWebConfig | None, path: str) -> bool:
            users = loaded.config.basic_auth_users if loaded is not None else {}
            if web is None or loaded is None or not users:
                return True
            if path in loaded.config.auth_excluded_paths:
                return True
            return web.authenticator.check(users, self.headers.get("Authorization"))

        def _unauthorized(self) -> None:
            self.extra_headers = {**self.extra_headers, "WWW-Authenticate": UNAUTHORIZED_HEADER}
            self._send(401, "text/plain; charset=utf-8", b"unauthorized\n")

        def _landing(self) -> None:
            self._send(200, "text/html; charset=utf-8", LANDING_PAGE)

        def _send(self, code: int, content_type: str, body: bytes, gzipped: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            for name, value in self.extra_headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler
