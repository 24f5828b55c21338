"""Wiring: configuration in, sources running on their intervals, telemetry served over HTTP."""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from types import FrameType

from exporter import inventory
from exporter.config import Config
from exporter.events.config import EventsSourceConfig
from exporter.events.consumer import build_consumers
from exporter.events.metrics import EventMetrics
from exporter.health import HealthBoard
from exporter.http_server import MetricsServer
from exporter.leader import Leadership, lease_connection, register_leader_gauge
from exporter.sources import native
from exporter.sources.base import Source, SourceRunner
from exporter.sources.redis_keys import redis_samplers
from exporter.status_page import StatusPage
from exporter.telemetry import Telemetry

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


def build_sources(
    config: Config, telemetry: Telemetry, event_metrics: EventMetrics | None
) -> list[Source]:
    sources: list[Source] = list(
        redis_samplers(config.sources.redis, telemetry, config.sample_interval)
    )
    postgres_config = config.sources.postgres
    if postgres_config is not None and postgres_config.collectors:
        from exporter.sources import postgres  # psycopg loads only when PostgreSQL is sampled

        sources.extend(postgres.build_sources(postgres_config, telemetry, config.sample_interval))
    if event_metrics is not None:
        sources.extend(
            native.build_sources(
                config.sources.native,
                config.sources.default_redis(),
                event_metrics,
                config.sample_interval,
            )
        )
    return sources


def build_event_metrics(config: Config, telemetry: Telemetry) -> EventMetrics | None:
    """The one EventMetrics that event streams and native readers feed, when any is on."""
    events, readers = config.sources.events, config.sources.native
    if not (events is not None and events.streams) and not (readers and readers.enabled()):
        return None
    return EventMetrics(telemetry, (events or EventsSourceConfig()).buckets())


class App:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.health = HealthBoard()
        self.telemetry = Telemetry(self.health, config.limits, config.otlp)
        self.stopping = threading.Event()
        self._shutdown_lock = threading.Lock()
        self._shut_down = False
        self.leadership = _leadership(config)
        register_leader_gauge(self.telemetry, self.leadership)
        event_metrics = build_event_metrics(config, self.telemetry)
        self.runners = [
            SourceRunner(source, self.telemetry, self.stopping, self.leadership)
            for source in build_sources(config, self.telemetry, event_metrics)
        ]
        self.event_consumers = build_consumers(
            config.sources.events, config.sources.default_redis(), self.telemetry, event_metrics
        )
        host, port = config.host_port
        status = StatusPage(
            self.health, lambda: self.telemetry.render(False), self.telemetry.store.snapshot_series
        )
        self.server = MetricsServer(
            host,
            port,
            self.telemetry.render,
            self.health,
            config.web_config_file,
            config.http,
            count_auth_failure=self.telemetry.count_auth_failure,
            pages={
                "/": lambda: ("text/html; charset=utf-8", status.html()),
                "/status.json": lambda: ("application/json", status.json()),
            },
        )

    def start(self) -> None:
        for line in inventory.take(self.config).lines():
            log.info("%s", line)
        # What start-up built (modules, models, the configuration) lives as long as the process:
        # frozen, the cyclic GC never walks it again, so the collections that a cycle's or a
        # batch's short-lived objects trigger stay cheap. Threads start after, so none of their
        # work is frozen. (No process-wide GC switch: gc.disable() in one thread would hold
        # collection off for all of them, across their network waits.)
        gc.freeze()
        self.server.start()
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
        def on_signal(signum: int, _: FrameType | None) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            self.stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        self.stopping.wait()
        self.shutdown()


def _leadership(config: Config) -> Leadership | None:
    election = config.leader_election
    if not election.enabled:
        return None
    events = config.sources.events
    connection = lease_connection(
        election, config.sources.default_redis(), events.redis if events is not None else None
    )
    return Leadership(election, connection)
