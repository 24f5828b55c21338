"""Native readers meet hostile data: a broken record costs itself only, and is counted.

Celery: messages on the events channel that are not kombu's, or events missing what they
need, are refused by reason while a real event (sent by Celery's own EventDispatcher) is
applied. RQ: registry members whose job hash is gone, of another type or unreadable still
count as what the registry says, the unreadable one also as invalid. Redis restarts: both
readers come back by themselves. A reader that stood by while another replica led does not
count again what that replica counted.
"""

from __future__ import annotations

import base64
import json
import time

from celery import Celery

from exporter.events.config import EventsSourceConfig
from exporter.events.metrics import EventMetrics
from exporter.health import HealthBoard
from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.native.celery import CeleryReader
from exporter.sources.native.config import CeleryReaderConfig, RqReaderConfig
from exporter.sources.native.framework import NativeSource
from exporter.sources.native.rq import RqReader
from exporter.telemetry import Telemetry
from tests.conftest import Series, parse_exposition, scrape_series, value, wait_for
from tests.private_redis import PrivateRedis


def _sum(series: Series, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and wanted <= set(ls))


def _envelope(body: object) -> bytes:
    """kombu's message envelope around a JSON body (what its Redis transport publishes)."""
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    return json.dumps(
        {
            "body": encoded,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {},
            "properties": {"body_encoding": "base64", "delivery_tag": "x"},
        }
    ).encode()


HOSTILE = [
    b"not json",  # unreadable: bad_value
    json.dumps({"no": "body"}).encode(),  # unreadable: bad_value
    json.dumps({"body": "%%%", "properties": {"body_encoding": "base64"}}).encode(),  # bad_value
    _envelope([1, 2]),  # a batch of non-events: bad_value twice
    _envelope({"type": 7, "timestamp": 1.0}),  # missing_field
    _envelope({"type": "task-started", "timestamp": time.time()}),  # no uuid: missing_field
]
REFUSED = {"bad_value": 5, "missing_field": 2}


def test_celery_hostile_messages_cost_themselves_only(redis_client, redis_url, run_exporter):
    app = run_exporter({"presets": ["celery"]}, redis_url=redis_url)
    wait_for(lambda: app.health.snapshot()["native:celery"].up)
    database = redis_url.rsplit("/", 1)[1]
    channel = f"/{database}.celeryev/task.multi"
    for payload in HOSTILE:
        redis_client.publish(channel, payload)
    celery = Celery(broker=redis_url)
    with celery.connection_for_write() as connection:
        dispatcher = celery.events.Dispatcher(connection, hostname="w1@test")
        dispatcher.send("worker-heartbeat", active=0, freq=2.0)
        dispatcher.close()

    def applied() -> Series | None:
        series = scrape_series(app)
        return series if value(series, "queue_workers", system="celery", state="idle") else None

    series = wait_for(applied, timeout=30)
    for reason, count in REFUSED.items():
        invalid = value(
            series, "queue_exporter_events_invalid_total", stream="native:celery", reason=reason
        )
        assert invalid == count, reason
    assert value(series, "queue_exporter_source_up", source="native:celery") == 1


def test_rq_unreadable_jobs_still_count(redis_client, redis_url, run_exporter):
    redis_client.sadd("rq:queues", "rq:queue:default")
    app = run_exporter({"presets": ["rq"]}, redis_url=redis_url)
    # the baseline read, then three jobs finish whose records are broken
    wait_for(lambda: app.health.snapshot()["native:rq"].last_success is not None)
    redis_client.set("rq:job:string", "not a hash")
    redis_client.hset("rq:job:garbled", mapping={"description": "x.y()", "ended_at": "never"})
    redis_client.xadd("rq:results:garbled", {"type": "2", "exc_string": "%%not base64%%"})
    redis_client.zadd("rq:finished:default", {"gone": 1, "string": 1})
    redis_client.zadd("rq:failed:default", {"garbled": 1})

    def counted() -> Series | None:
        series = scrape_series(app)
        done = _sum(series, "queue_jobs_completed_total", system="rq", queue="default")
        failed = _sum(series, "queue_jobs_failed_total", system="rq", queue="default")
        return series if done == 2 and failed == 1 else None

    series = wait_for(counted, timeout=30)
    invalid = value(
        series, "queue_exporter_events_invalid_total", stream="native:rq", reason="bad_value"
    )
    assert invalid == 1  # the garbled result
    assert value(series, "queue_exporter_events_total", stream="native:rq") == 3
    assert value(series, "queue_exporter_source_up", source="native:rq") == 1


def test_readers_come_back_after_a_redis_restart(tmp_path, run_exporter):
    server = PrivateRedis(tmp_path).start()
    try:
        url = server.url
        app = run_exporter({"presets": ["rq", "celery"]}, redis_url=url)
        up = ("native:rq", "native:celery")
        wait_for(lambda: all(app.health.snapshot()[name].up for name in up))
        server.stop()
        wait_for(lambda: not any(app.health.snapshot()[name].up for name in up), timeout=30)
        server.start()
        wait_for(lambda: all(app.health.snapshot()[name].up for name in up), timeout=30)
        # the Celery reader subscribed again: a heartbeat after the restart is seen
        celery = Celery(broker=url)
        with celery.connection_for_write() as connection:
            dispatcher = celery.events.Dispatcher(connection, hostname="w2@test")
            dispatcher.send("worker-heartbeat", active=1, freq=2.0)
            dispatcher.close()
        wait_for(
            lambda: value(scrape_series(app), "queue_workers", system="celery", state="busy"),
            timeout=30,
        )
    finally:
        server.stop()


def test_a_reader_left_standing_by_does_not_count_what_the_leader_counted(redis_client, redis_url):
    """Reads resume after more than three intervals (another replica led): the source starts
    a new reader, whose first read is a baseline (RQ's registries, Celery's subscription);
    then both count again."""
    connection = RedisConnectionConfig(url=redis_url)
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
    sources = [
        NativeSource(lambda: RqReader(RqReaderConfig(), connection), 0.1, metrics),
        NativeSource(lambda: CeleryReader(CeleryReaderConfig(), connection, 0.1), 0.1, metrics),
    ]
    redis_client.sadd("rq:queues", "rq:queue:default")

    def read_all() -> Series:
        for source in sources:
            source.sample()
        return parse_exposition(telemetry.render(False).decode())

    try:
        read_all()  # the baseline, and the subscription
        redis_client.zadd("rq:finished:default", {"while-away": 1})
        _heartbeat(redis_url, "away@test")
        time.sleep(0.5)
        away = read_all()
        assert _sum(away, "queue_jobs_completed_total", system="rq") == 0
        assert not value(away, "queue_workers", system="celery", state="idle")

        redis_client.zadd("rq:finished:default", {"while-leading": 1})
        _heartbeat(redis_url, "here@test")
        time.sleep(0.05)
        leading = read_all()
        assert _sum(leading, "queue_jobs_completed_total", system="rq") == 1
        assert value(leading, "queue_workers", system="celery", state="idle") == 1
    finally:
        for source in sources:
            source.close()


def _heartbeat(redis_url: str, hostname: str) -> None:
    celery = Celery(broker=redis_url)
    with celery.connection_for_write() as connection:
        dispatcher = celery.events.Dispatcher(connection, hostname=hostname)
        dispatcher.send("worker-heartbeat", active=0, freq=2.0)
        dispatcher.close()
