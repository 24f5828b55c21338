"""The consumer while Redis is away: marked down, errors counted, back without losing events."""

from __future__ import annotations

from exporter.events import wire
from tests.conftest import REDIS_HOST, REDIS_PORT, scrape_series, value, wait_for
from tests.tcp_proxy import TcpProxy

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
