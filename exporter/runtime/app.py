"""Wiring: configuration in, sources running on their intervals, telemetry served over HTTP."""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING

from exporter.config import inventory
from exporter.config.settings import Config
from exporter.http.server import MetricsServer
from exporter.http.status_page import StatusPage
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry, release_free_heap
from exporter.runtime.signals import SignalInbox

if TYPE_CHECKING:
    from exporter.leader.election import Leadership
    from exporter.sources.runner import SourceRunner
    from exporter.sources.streams.consumer import StreamConsumer

log = logging.getLogger(__name__)

# Seconds shutdown waits for the threads in all. Cycles in progress are interrupted first and
# every backend call has a deadline, so this is only reached by a thread stuck elsewhere; it is
# abandoned then (docs/operations.md). With the lease release, the HTTP server's stop and the
# last OTLP push the process exits within 5 s, far inside Kubernetes' default 30 s grace period.
SHUTDOWN_BUDGET = 2.0
# Seconds an event consumer has to finish its read and ack it before a hung read is cut off:
# a healthy read takes milliseconds, an idle XREAD BLOCK at most block_ms (1 s by default).
CONSUMER_GRACE = 1.0
# Seconds releasing the lease may take (connect, then the command) once the threads are done.
LEASE_RELEASE_TIMEOUT = 0.5
# Seconds the last OTLP push may take at exit, when OTLP is enabled (abandoned after that).
OTLP_SHUTDOWN_TIMEOUT = 0.5


class App:
    def __init__(self, config: Config, *, listen_first: bool = False) -> None:
        """Build everything, or with `listen_first` only the store and the HTTP listener: then
        start() serves before it builds the sources (serve's start-up; see _build_sources)."""
        self.config = config
        self.health = HealthBoard()
        self.telemetry = Telemetry(
            self.health,
            config.limits,
            config.otlp,
            self_metrics_later=listen_first,
            messaging_conventions=config.messaging_conventions,
        )
        self.stopping = threading.Event()
        self._shutdown_lock = threading.Lock()
        self._shut_down = False
        self.leadership: Leadership | None = None
        self.runners: list[SourceRunner] = []
        self.event_consumers: list[StreamConsumer] = []
        self._sources_built = False
        self._listening = False
        host, port = config.host_port
        status = StatusPage(
            self.health,
            self.telemetry.own_samples,
            self.telemetry.store.snapshot_series,
            config.not_recorded,
        )
        self.server = MetricsServer(
            host,
            port,
            self.telemetry.render_fenced,
            self.health,
            config.web_config_file,
            config.http,
            count_auth_failure=self.telemetry.count_auth_failure,
            pages={
                "/": lambda: ("text/html; charset=utf-8", status.html()),
                "/status.json": lambda: ("application/json", status.json()),
            },
        )
        if not listen_first:
            self._build_sources()

    def _build_sources(self) -> None:
        """The self-metrics' SDK, then the samplers, consumers and lease of the configuration.
        Here the OpenTelemetry SDK, redis-py and the readers are imported: with `listen_first`
        the HTTP listener is up meanwhile, its /metrics carrying queue_exporter_build_info (then
        the rest of the exporter's own metrics) and /readyz answering 503 (not ready) until the
        sources are built and have each succeeded."""
        self.telemetry.build_self_metrics()
        from exporter.leader.election import register_leader_gauge
        from exporter.runtime import build
        from exporter.sources.runner import SourceRunner

        self.leadership = build.leadership(self.config)
        register_leader_gauge(self.telemetry, self.leadership)
        event_metrics = build.build_event_metrics(self.config, self.telemetry)
        built = build.build(self.config, self.telemetry, event_metrics, self.leadership)
        self.runners = [
            SourceRunner(source, self.telemetry, self.stopping, self.leadership, event_metrics)
            for source in built.sources
        ]
        self.event_consumers = built.consumers
        self._sources_built = True

    def listen(self) -> None:
        """Serve HTTP (once). With `listen_first` nothing is ready until start() has built the
        sources: /metrics carries queue_exporter_build_info, /readyz answers 503."""
        if self._listening:
            return
        self._listening = True
        for line in inventory.take(self.config).lines():
            log.info("%s", line)
        # What start-up built (modules, models, the configuration) lives as long as the process:
        # frozen, the cyclic GC never walks it again, so the collections that a cycle's or a
        # batch's short-lived objects trigger stay cheap. Threads start after, so none of their
        # work is frozen. (No process-wide GC switch once they run: gc.disable() in one thread
        # would hold collection off for all of them, across their network waits. serve's
        # start-up, one thread, ran without it: exporter/__main__.py; it is on from here.)
        gc.freeze()
        gc.enable()
        self.health.building(not self._sources_built)
        self.server.start()

    def start(self) -> None:
        self.listen()
        if not self._sources_built:  # listen first: the sources' imports and build come now
            self._build_sources()
            gc.freeze()  # the sources' build too (and the few objects of a request under way)
            self.health.building(False)
        release_free_heap()  # what start-up freed, before the samplers and consumers start
        if self.leadership is not None:
            self.leadership.start(self.stopping)
        for runner in self.runners:
            runner.start()
        for consumer in self.event_consumers:
            consumer.start(self.stopping)
        host, _ = self.config.host_port
        log.info(
            "serving on %s://%s:%d/metrics (status page at /) with %d sampler(s) and %d "
            "stream consumer(s)",
            self.server.scheme,
            host,
            self.server.port,
            len(self.runners),
            len(self.event_consumers),
        )

    def shutdown(self) -> None:
        """Stop everything within the budget; a second call (tests, signal races) does nothing."""
        with self._shutdown_lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.stopping.set()
        started = time.monotonic()
        deadline = started + SHUTDOWN_BUDGET
        for runner in self.runners:
            runner.interrupt()  # a cycle blocked on a hung backend fails now
        self._stop_consumers(started + CONSUMER_GRACE)
        threads = [runner.thread for runner in self.runners]
        # Consumers stop reading and ack what they applied; what a consumer could not ack stays
        # pending in the group, where another replica claims it after claim_idle.
        threads += [consumer.thread for consumer in self.event_consumers if consumer.thread]
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        if self.leadership is not None:  # after the samplers stopped: a follower takes over now
            if self.leadership.thread is not None:
                self.leadership.interrupt()
                self.leadership.thread.join(timeout=max(deadline - time.monotonic(), 0.1))
            self.leadership.release(timeout=LEASE_RELEASE_TIMEOUT)
        self.server.stop()
        self.telemetry.shutdown(timeout=OTLP_SHUTDOWN_TIMEOUT)
        log.info("stopped in %.1fs", time.monotonic() - started)

    def _stop_consumers(self, grace_end: float) -> None:
        """Let each consumer finish the read in progress and ack it (a read cut off would leave
        its entries pending for another replica to apply again); one still reading at
        `grace_end` waits on a hung Redis, and its read is cut off."""
        for consumer in self.event_consumers:
            consumer.stop_waiting()
        for consumer in self.event_consumers:
            if consumer.thread is not None and consumer.thread.ident is not None:
                consumer.thread.join(timeout=max(grace_end - time.monotonic(), 0.0))
        for consumer in self.event_consumers:
            if consumer.thread is not None and consumer.thread.is_alive():
                log.warning(
                    "%s: still waiting on Redis %.0f s into the shutdown, cut off: entries of a "
                    "group read cut off were not applied and stay pending (re-read by this "
                    "consumer name at its restart, or claimed)",
                    consumer.name,
                    CONSUMER_GRACE,
                )
            consumer.interrupt()

    def run_until_signalled(self) -> None:
        # SIGHUP too: its default action would end the process.
        inbox = SignalInbox(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        self.start()
        while (received := inbox.wait()) == signal.SIGHUP:
            log.warning(
                "received SIGHUP: ignored, nothing is reloaded (the configuration is read at "
                "start: restart to change it; the web config file is reloaded by itself when it "
                "changes, keeping the last good one)"
            )
        log.info("received %s, shutting down", received.name)
        self.shutdown()
