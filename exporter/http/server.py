"""The HTTP endpoint: /metrics, /healthz, /readyz and the pages it is given (the status page).

It runs on Tornado's event loop in one thread, because connections must be cheap: a client
that sends half a request (slowloris) or reads its answer slowly holds a socket, not a thread,
and is cut when its `request_timeout` runs out (to send the request's headers, and again to
take the response). The listen backlog is BACKLOG, and at most `max_connections` are open at
once: more are closed on arrival. Scrapes render and compress on SCRAPE_THREADS threads of
their own and bcrypt checks on AUTH_THREADS others, so the loop only parses, routes and
writes: /healthz and /readyz answer at once however busy /metrics is.

With a web config file (exporter/http/web_config.py) it speaks TLS, checks client certificates and
basic auth, and adds the configured headers. Basic auth covers every path but two, so that
Kubernetes probes need no secret in the pod spec: /healthz (its body is "ok") and /readyz,
which without credentials answers its status code and {"ready": ...} only; the source
details need credentials like /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import SecretStr
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

from exporter import __version__
from exporter.core.logs import LogLimiter
from exporter.http.access import FailureLimiter, describe, exposure_warning, parse_basic_auth
from exporter.http.config import HttpConfig
from exporter.output import exposition
from exporter.output.health import HealthBoard

if TYPE_CHECKING:
    from exporter.http.web_config import LoadedWebConfig, WebConfigWatcher

log = logging.getLogger(__name__)

BACKLOG = 1024  # connections the kernel queues before accept (stdlib http.server: 5)
SCRAPE_THREADS = 2  # renders at once: more would only share the same cores and the GIL
AUTH_THREADS = 2  # bcrypt checks at once (bcrypt releases the GIL), at a lower CPU priority
# Checks queued or running at most: guessers from many addresses cannot queue up seconds of
# bcrypt ahead of a real login; beyond it, logins are refused unchecked (rate_limited).
MAX_PENDING_CHECKS = 4 * AUTH_THREADS
# accept() failing for want of descriptors or memory: the listener is left alone this long (a
# ready listener polled again at once would spin the loop at 100% CPU), then accepting resumes.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BACKOFF = 0.5
GZIP_LEVEL = 1  # the cheapest level: about 10x smaller already, at a fraction of the render
UNAUTHORIZED_HEADER = 'Basic realm="queue-exporter", charset="UTF-8"'

# The exposition, uncompressed (OpenMetrics when the argument is True, Prometheus text
# otherwise), with the right to send it (Rendered.still_served, asked right before the write).
Render = Callable[[bool], exposition.Rendered]
# Renders of one scrape at most, each made because the last one's lease passed before it was
# sent: beyond them the scrape is answered 503 rather than with series of a passed lease.
RENDER_ATTEMPTS = 3
# A page: its content type and body, built per request (exporter/http/status_page.py).
Page = Callable[[], tuple[str, bytes]]
# Counts a refused login by its reason (catalog.AUTH_FAILURE_REASONS).
CountAuthFailure = Callable[[str], None]
_T = TypeVar("_T")


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        render: Render,
        health: HealthBoard,
        web_config_file: Path | None = None,
        settings: HttpConfig | None = None,
        pages: Mapping[str, Page] | None = None,
        count_auth_failure: CountAuthFailure = lambda reason: None,
    ) -> None:
        """Raises WebConfigError for a web config file that does not load (before binding).
        `pages` are served by path behind the same TLS and auth as /metrics. A render's
        still_served() is asked on the loop, right before its body is written."""
        self.host = host
        self.web: WebConfigWatcher | None = None
        if web_config_file is not None:  # its models, bcrypt and ssl contexts load only then
            from exporter.http.web_config import WebConfigWatcher

            self.web = WebConfigWatcher(web_config_file)
        self.settings = settings or HttpConfig()
        self.render = render
        self.compress = SharedCompression()
        self.pages = dict(pages or {})
        self.health = health
        self.count_auth_failure = count_auth_failure
        self.auth_failures = FailureLimiter()
        self.pending_checks = 0  # bcrypt checks queued or running (read on the loop only)
        self.scrape_pool = ThreadPoolExecutor(SCRAPE_THREADS, thread_name_prefix="scrape")
        # Pages build on a thread of their own: pollers of /status.json never hold a scrape's.
        self.page_pool = ThreadPoolExecutor(1, thread_name_prefix="page")
        self.auth_pool = ThreadPoolExecutor(
            AUTH_THREADS, thread_name_prefix="auth", initializer=_yield_cpu
        )
        self._sockets = bind_sockets(port, address=host, backlog=BACKLOG)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._running = threading.Event()

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

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
        self._running.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: stopped already
                self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=5)
        else:  # never started
            for sock in self._sockets:
                sock.close()
        self.scrape_pool.shutdown(wait=False, cancel_futures=True)
        self.page_pool.shutdown(wait=False, cancel_futures=True)
        self.auth_pool.shutdown(wait=False, cancel_futures=True)

    async def run_blocking(self, pool: ThreadPoolExecutor, work: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(pool, work)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        application = Application(
            [(r".*", _Handler, {"front": self})],
            log_function=_log_request,
            compress_response=False,  # gzip is done here, at GZIP_LEVEL, off the loop
        )
        server = _Server(
            application,
            idle_connection_timeout=self.settings.request_timeout,
            body_timeout=self.settings.request_timeout,
            max_body_size=64 * 1024,  # GET only: nothing worth a larger body
            front=self,
            max_connections=self.settings.max_connections,
            handshake_timeout=self.settings.request_timeout,
        )
        server.add_sockets(self._sockets)
        self._running.set()
        await self._stopping.wait()
        server.stop()
        await server.close_all_connections()


class _Server(HTTPServer):
    """Tornado's server, with a bound on open connections and TLS under the web config current
    when each connection arrives (rotated certificates need no restart)."""

    def initialize(  # type: ignore[override]  # Tornado's Configurable passes our own arguments
        self,
        *args: Any,
        front: MetricsServer,
        max_connections: int,
        handshake_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().initialize(*args, **kwargs)
        self.front = front
        self.web = front.web
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout
        self.open_connections = 0
        self.refusals = LogLimiter(log, period=60.0)
        self._handshakes: set[asyncio.Task[None]] = set()

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        """Tornado's, with an accept loop that backs off when the process is out of file
        descriptors (Tornado's raises on EMFILE at every poll: a busy loop of tracebacks)."""
        for sock in sockets:
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = self._accept_from(sock)

    def _accept_from(self, sock: socket.socket) -> Callable[[], None]:
        """Accept on `sock` from the loop; returns what stops it (TCPServer.stop calls it)."""
        loop = IOLoop.current()
        paused: list[object] = []  # the pending resume while backing off
        removed = False

        def accept(_fd: object, _events: int) -> None:
            for _ in range(BACKLOG):
                if removed:
                    return
                try:
                    connection, address = sock.accept()
                except BlockingIOError:
                    return
                except ConnectionAbortedError:
                    continue
                except OSError as error:
                    if error.errno not in OUT_OF_RESOURCES:
                        raise
                    self._back_off(error)
                    loop.remove_handler(sock)
                    paused.append(loop.call_later(ACCEPT_BACKOFF, resume))
                    return
                self._handle_connection(connection, address)

        def resume() -> None:
            paused.clear()
            if not removed:
                loop.add_handler(sock, accept, IOLoop.READ)

        def remove() -> None:
            nonlocal removed
            removed = True
            if paused:
                loop.remove_timeout(paused.pop())
            else:
                loop.remove_handler(sock)

        loop.add_handler(sock, accept, IOLoop.READ)
        return remove

    def _back_off(self, error: OSError) -> None:
        self.refusals.warning(
            ("accept", error.errno),
            "cannot accept connections (%s): %d open; accepting again in %.1f s, "
            "connections wait in the listen backlog meanwhile",
            os.strerror(error.errno or 0),
            self.open_connections,
            ACCEPT_BACKOFF,
        )

    def handle_stream(self, stream: IOStream, address: tuple[Any, ...]) -> None:
        if self.open_connections >= self.max_connections:
            self.refusals.warning(
                "max_connections",
                "refused a connection from %s: %d open, http.max_connections",
                address[0],
                self.open_connections,
            )
            stream.close()
            return
        self.open_connections += 1
        if self.web is None or not self.web.tls_enabled:
            super().handle_stream(stream, address)
            return
        task = asyncio.ensure_future(self._serve_tls(stream, address))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _serve_tls(self, stream: IOStream, address: tuple[Any, ...]) -> None:
        from exporter.http.web_config import client_san_allowed  # loaded with the file (self.web)

        assert self.web is not None
        loaded = self.web.current()
        try:
            # A cancelled start_tls (the timeout) closes the new stream and its socket.
            tls = await asyncio.wait_for(
                stream.start_tls(server_side=True, ssl_options=loaded.ssl_context),
                self.handshake_timeout,
            )
        except (TimeoutError, StreamClosedError, OSError, ValueError) as error:
            log.debug("TLS handshake with %s failed: %s", address[0], error or type(error).__name__)
            self.open_connections -= 1
            return
        if not client_san_allowed(loaded.tls, tls.socket.getpeercert()):
            log.debug("client certificate of %s has no allowed SAN", address[0])
            self.front.count_auth_failure("client_certificate")
            tls.close()
            self.open_connections -= 1
            return
        super().handle_stream(tls, address)

    def on_close(self, server_conn: object) -> None:
        self.open_connections -= 1
        super().on_close(server_conn)


class _Handler(RequestHandler):
    front: MetricsServer

    def initialize(self, front: MetricsServer) -> None:
        self.front = front

    def set_default_headers(self) -> None:
        self.set_header("Server", f"queue-exporter/{__version__}")
        self.set_header("Content-Type", "text/plain; charset=utf-8")

    def compute_etag(self) -> None:
        return None  # hashing every scrape's body would cost more than it could save

    async def get(self) -> None:
        path = self.request.path
        web = self.front.web
        loaded = web.current() if web is not None else None
        if loaded is not None:
            for name, value in loaded.config.http_server_config.headers.items():
                if value:  # "unset if blank", as in the toolkit
                    self.set_header(name, value)
            if web is not None and not web.allow_request():
                await self._send(429, b"too many requests\n")
                return
        if path == "/healthz":
            await self._send(200, b"ok\n")
            return
        if path == "/readyz":  # details for a client with credentials, the status for anyone
            has_credentials = "Authorization" in self.request.headers
            await self._readyz(detailed=has_credentials and await self._refusal(loaded) is None)
            return
        refusal = await self._refusal(loaded, path)
        if refusal == "rate_limited":
            self.set_header("Retry-After", str(round(FailureLimiter.TARPIT)))
            await self._send(429, b"too many failed logins\n")
            return
        if refusal is not None:
            self.set_header("WWW-Authenticate", UNAUTHORIZED_HEADER)
            await self._send(401, b"unauthorized\n")
            return
        if path in self.front.pages:
            await self._page(self.front.pages[path])
            return
        route: Callable[[], Awaitable[None]] | None = {
            "/metrics": self._metrics,
        }.get(path)
        if route is None:
            await self._send(404, b"not found\n")
        else:
            await route()

    async def _metrics(self) -> None:
        openmetrics = _wants_openmetrics(self.request.headers.get("Accept", ""))
        gzipped = wants_gzip(self.request.headers.get("Accept-Encoding", ""))
        render, compress = self.front.render, self.front.compress

        def rendered() -> tuple[exposition.Rendered, bytes]:
            raw = render(openmetrics)
            return raw, compress(raw.body) if gzipped else raw.body

        for _ in range(RENDER_ATTEMPTS):
            try:
                raw, body = await self.front.run_blocking(self.front.scrape_pool, rendered)
            except Exception:
                log.exception("rendering /metrics failed")
                await self._send(500, b"rendering metrics failed\n")
                return
            # Asked here, on the loop, with nothing but the write after it: a body rendered
            # before the process was stopped is not sent once its lease has passed.
            if raw.still_served():
                break
        else:
            await self._send(503, b"the leader lease changed during every render\n")
            return
        if gzipped:
            self.set_header("Content-Encoding", "gzip")
        await self._send(200, body, exposition.content_type(openmetrics))

    async def _readyz(self, detailed: bool) -> None:
        statuses = self.front.health.snapshot()
        reason = self.front.health.not_ready_reason()
        ready = reason is None
        document: dict[str, object] = {"ready": ready}
        if reason is not None:
            document["reason"] = reason
        if detailed:
            document["sources"] = {
                name: {"up": status.up, "error": status.last_error}
                for name, status in statuses.items()
            }
        await self._send(200 if ready else 503, json.dumps(document).encode(), "application/json")

    async def _page(self, page: Page) -> None:
        content_type, body = await self.front.run_blocking(self.front.page_pool, page)
        await self._send(200, body, content_type)

    async def _refusal(self, loaded: LoadedWebConfig | None, path: str = "") -> str | None:
        """None when the request may go on, else why not (catalog.AUTH_FAILURE_REASONS)."""
        web = self.front.web
        users = loaded.config.basic_auth_users if loaded is not None else {}
        if web is None or loaded is None or not users:
            return None
        if path in loaded.config.auth_excluded_paths:
            return None
        reason = await self._check_credentials(web, users)
        if reason is not None:
            self.front.count_auth_failure(reason)
        return reason

    async def _check_credentials(
        self, web: WebConfigWatcher, users: dict[str, SecretStr]
    ) -> str | None:
        header = self.request.headers.get("Authorization")
        if header is None:
            return "missing"
        credentials = parse_basic_auth(header)
        if credentials is None:
            return "malformed"
        authenticator = web.authenticator
        if authenticator.remembered(users, credentials):
            return None
        client = self.request.remote_ip or ""
        front = self.front
        if front.pending_checks >= MAX_PENDING_CHECKS or not front.auth_failures.take(client):
            # Held a while, so that a connection guessing in a loop costs a request a second.
            await asyncio.sleep(FailureLimiter.TARPIT)
            return "rate_limited"
        started = time.monotonic()
        front.pending_checks += 1
        try:
            reason, floor = await front.run_blocking(
                front.auth_pool,
                lambda: (
                    authenticator.verify(users, credentials),
                    authenticator.failure_floor(users),
                ),
            )
        finally:
            front.pending_checks -= 1
        if reason is None:
            front.auth_failures.give_back(client)
        else:  # a refusal takes as long whoever the user: times tell no user names
            await asyncio.sleep(started + floor - time.monotonic())
        return reason

    async def _send(self, code: int, body: bytes, content_type: str | None = None) -> None:
        """Answer, and cut the connection if the client does not take the answer in time."""
        self.set_status(code)
        if content_type is not None:
            self.set_header("Content-Type", content_type)
        try:
            await asyncio.wait_for(self.finish(body), self.front.settings.request_timeout)
        except TimeoutError:
            log.debug("%s did not take its response in time", self.request.remote_ip)
            self.request.connection.close()  # type: ignore[union-attr]
        except StreamClosedError:
            pass  # the client left


def _yield_cpu() -> None:
    """Lowers the calling thread's CPU priority (on Linux nice is per thread), so that a flood
    of password guesses keeps bcrypt busy without starving the loop and the samplers."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, 10)


def _wants_openmetrics(accept: str) -> bool:
    return any(
        part.split(";", 1)[0].strip() == "application/openmetrics-text"
        for part in accept.split(",")
    )


def wants_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header (RFC 9110 12.5.3) accepts gzip: named, or covered by
    `*`, with a q-value above 0. `gzip;q=0` refuses it; an unreadable q-value counts as 0."""
    weights: dict[str, float] = {}
    for part in accept_encoding.split(","):
        coding, *parameters = (piece.strip() for piece in part.split(";"))
        weight = 1.0
        for parameter in parameters:
            name, _, text = parameter.partition("=")
            if name.strip().lower() == "q":
                weight = _q_value(text.strip())
        if coding:
            weights[coding.lower()] = weight
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def _q_value(text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        return 0.0
    return weight if 0.0 <= weight <= 1.0 else 0.0


class SharedCompression:
    """gzip of a body, shared by the scrapes answered with that same body.

    Concurrent scrapes share one render (Telemetry.render_fenced hands each the same body),
    so they can share its compression as well: fifty scrapes of a large exposition cost one
    gzip, not fifty. The body is let go when no scrape is using it any more.
    """

    def __init__(self) -> None:
        self._compress_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._users = 0
        self._body: bytes | None = None
        self._compressed = b""

    def __call__(self, body: bytes) -> bytes:
        with self._count_lock:
            self._users += 1
        try:
            with self._compress_lock:
                if body is not self._body:
                    self._body, self._compressed = body, gzip.compress(body, GZIP_LEVEL)
                return self._compressed
        finally:
            with self._count_lock:
                self._users -= 1
                if not self._users:
                    self._body, self._compressed = None, b""


def _log_request(handler: RequestHandler) -> None:
    request = handler.request
    log.debug(
        "http: %s %s %s %d",
        request.remote_ip,
        request.method,
        request.path,
        handler.get_status(),
    )
