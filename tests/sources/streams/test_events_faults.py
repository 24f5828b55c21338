"""The consumer while Redis is away: marked down, errors counted, back without losing events."""

from __future__ import annotations

import logging
import time

from exporter.config.settings import from_dict
from exporter.lifecycle import wire
from exporter.runtime.app import SHUTDOWN_BUDGET, App
from exporter.sources.streams import consumer as consumer_module
from tests.conftest import REDIS_HOST, REDIS_PORT, scrape_series, value, wait_for
from tests.tcp_proxy import TcpProxy
from tests.timing import process_cost, wake_up_lag

STREAM = "faulty:events"


def _write(client, count: int) -> None:
    for _ in range(count):
        client.xadd(STREAM, wire.encode("enqueued", {"queue": "q"}))


def test_consumer_survives_redis_going_away(redis_client, redis_db, run_exporter):
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    try:
        app = run_exporter(
            {
                "sources": {
                    "events": {
                        "streams": [{"key": STREAM, "system": "app"}],
                        "redis": {
                            "url": f"redis://127.0.0.1:{proxy.port}/{redis_db}",
                            "socket_timeout": 1,
                        },
                        "block_ms": 50,
                    }
                }
            }
        )
        source = f"events:{STREAM}"
        wait_for(lambda: app.health.snapshot()[source].up)
        _write(redis_client, 5)

        def consumed(count: int):
            return wait_for(
                lambda: (
                    (s := scrape_series(app))
                    and value(s, "queue_exporter_events_total", stream=STREAM) == count
                    and s
                )
            )

        consumed(5)
        proxy.cut()
        wait_for(lambda: not app.health.snapshot()[source].up)
        _write(redis_client, 7)  # written while the exporter cannot read
        series = scrape_series(app)
        assert value(series, "queue_exporter_source_up", source=source) == 0
        errors = [
            v
            for (name, labels), v in series.items()
            if name == "queue_exporter_source_errors_total" and ("source", source) in labels
        ]
        assert errors and sum(errors) >= 1
        proxy.start()
        series = consumed(12)
        assert value(series, "queue_jobs_enqueued_total", system="app") == 12
        assert value(series, "queue_exporter_source_up", source=source) == 1
    finally:
        proxy.cut()


def test_a_frozen_events_redis_is_noticed_and_read_again_once_it_answers(
    redis_client, redis_db, caplog
):
    """Behind a proxy that stops forwarding (sockets open: only the exporter's own deadline
    can tell): the stream's source goes down within one deadline and a moment, says why, and
    is read again by itself, with what was written meanwhile, once the proxy forwards again."""
    deadline = 2.0  # socket_timeout
    caplog.set_level(logging.INFO, logger="exporter.sources.streams.consumer")
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    config = {
        "listen_address": "127.0.0.1:0",
        "sources": {
            "events": {
                "streams": [{"key": STREAM, "system": "app"}],
                "redis": {
                    "url": f"redis://127.0.0.1:{proxy.port}/{redis_db}",
                    "socket_timeout": deadline,
                },
                "block_ms": 50,
            }
        },
    }
    app = App(from_dict(config))  # not run_exporter's: this test shuts it down itself
    app.start()
    try:
        source = f"events:{STREAM}"
        wait_for(lambda: app.health.snapshot()[source].up)
        _write(redis_client, 5)
        wait_for(lambda: _consumed(app) == 5)

        lag = wake_up_lag()  # how late this machine wakes a waiting thread now
        proxy.freeze()
        frozen = time.monotonic()
        # Whatever is in flight as the proxy freezes (the idle wait for new entries, or a read)
        # times out within one deadline, and the source is down then: half a deadline more
        # covers a busy machine, and stays short of the two deadlines a quiet wait would take.
        wait_for(lambda: not app.health.snapshot()[source].up, timeout=1.5 * deadline + 5 * lag)
        print(
            f"\nfrozen events Redis: down after {time.monotonic() - frozen:.1f} s (deadline {deadline:g} s)"
        )
        series = scrape_series(app)
        assert value(series, "queue_exporter_source_up", source=source) == 0
        assert value(series, "queue_exporter_source_errors_total", source=source, reason="timeout")
        assert any(f"{source} failed (timeout)" in r.getMessage() for r in caplog.records)
        _write(redis_client, 7)  # while the exporter cannot read

        proxy.thaw()
        wait_for(lambda: _consumed(app) == 12, timeout=2 * (deadline + consumer_module.MAX_RETRY))
        assert app.health.snapshot()[source].up
        messages = [record.getMessage() for record in caplog.records]
        assert f"{source} is back: reading again" in messages
        assert sum(f"{source} failed (timeout)" in m for m in messages) == 1  # once per outage
    finally:
        app.shutdown()
        proxy.cut()


def test_shutdown_stops_a_consumer_whose_read_hangs(redis_client, redis_db):
    """SIGTERM's shutdown while a read waits on a frozen Redis with a long deadline: the
    consumer is stopped within the shutdown budget, not left to wait the deadline out."""
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    url = f"redis://127.0.0.1:{proxy.port}/{redis_db}"
    config = {
        "listen_address": "127.0.0.1:0",
        "sources": {
            "events": {
                "streams": [{"key": STREAM, "system": "app"}],
                "redis": {"url": url, "socket_timeout": 10 * SHUTDOWN_BUDGET},
                "block_ms": 50,
            }
        },
    }
    app = App(from_dict(config))
    app.start()
    try:
        wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
        _write(redis_client, 3)
        wait_for(lambda: _consumed(app) == 3)
        proxy.freeze()
        wait_for(proxy.held)  # the next read is sent and hangs
        app.shutdown()
        (consumer,) = app.event_consumers
        assert consumer.thread is not None and not consumer.thread.is_alive()
    finally:
        proxy.cut()


def _consumed(app) -> float | None:
    return value(scrape_series(app), "queue_exporter_events_total", stream=STREAM)


def test_sigterm_ends_serve_within_5s_while_the_events_redis_is_frozen(
    redis_client, redis_db, serve_process
):
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    try:
        serve = serve_process(
            "--redis-url", f"redis://127.0.0.1:{proxy.port}/{redis_db}", "--events-stream", STREAM
        )
        serve.series_when(
            lambda s: value(s, "queue_exporter_source_up", source=f"events:{STREAM}") == 1
        )
        _write(redis_client, 3)
        serve.series_when(lambda s: value(s, "queue_exporter_events_total", stream=STREAM) == 3)
        proxy.freeze()
        wait_for(proxy.held)  # the consumer's next read is sent and hangs
        load = process_cost()  # what this machine's load adds to a process's stop, now
        stopped_in, stderr = serve.sigterm()
        assert stopped_in < 5 + load, (stopped_in, load, stderr[-2000:])
        # The consumer hangs in its wait for new entries (XREAD BLOCK) or, rarely, in a read.
        # A wait has nothing read and unapplied: it is let go as shutdown begins, with no cut
        # to name (test_events_group.py); a read gets the grace, then is cut off and named.
    finally:
        proxy.cut()
