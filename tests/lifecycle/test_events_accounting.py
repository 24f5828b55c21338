"""Events exactly accounted: no entry applied twice and every entry that can no longer be read
counted as lost, across a destroyed group, a Redis that restarts without its data or from an
older copy, and trimming past unread entries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer
from tests.conftest import parse_exposition, value, wait_for
from tests.private_redis import PrivateRedis

STREAM = "jobs:events"
GROUP = "queue-exporter"


class Reader:
    """One consumer of STREAM (batches of 30) and what it counted."""

    def __init__(self, redis_url: str, name: str = "sidecar") -> None:
        self.telemetry = Telemetry(HealthBoard())
        settings = EventsSourceConfig.model_validate(
            {
                "streams": [{"key": STREAM, "system": "jobs", "start": "0"}],
                "consumer": name,
                "batch_size": 30,
                "block_ms": 50,
            }
        )
        metrics = EventMetrics(self.telemetry, settings.buckets())
        connection = RedisConnectionConfig.model_validate({"url": redis_url, "socket_timeout": 2})
        self.consumer = StreamConsumer(settings.streams[0], settings, connection, metrics)

    def drain(self) -> None:
        while self.consumer.poll():
            pass

    def counts(self) -> tuple[float, float, float]:
        """(consumed, enqueued events applied, lost)"""
        series = parse_exposition(self.telemetry.render(False).decode())
        return (
            value(series, "queue_exporter_events_total", stream=STREAM) or 0,
            value(series, "queue_jobs_enqueued_total", system="jobs") or 0,
            value(series, "queue_exporter_events_lost_total", stream=STREAM) or 0,
        )


def _write(client, count: int) -> None:
    pipe = client.pipeline(transaction=False)
    for _ in range(count):
        pipe.xadd(STREAM, wire.encode("enqueued", {"queue": "q"}))
    pipe.execute()


def test_a_destroyed_group_is_recreated_where_it_stood(redis_client, redis_url):
    reader = Reader(redis_url)
    _write(redis_client, 100)
    reader.drain()
    redis_client.xgroup_destroy(STREAM, GROUP)
    _write(redis_client, 50)
    reader.drain()
    assert reader.counts() == (150, 150, 0)

    # an operator recreates it at 0: moved back up to where this consumer stood
    redis_client.xgroup_destroy(STREAM, GROUP)
    redis_client.xgroup_create(STREAM, GROUP, id="0")
    _write(redis_client, 20)
    reader.drain()
    assert reader.counts() == (170, 170, 0)
    assert redis_client.xinfo_groups(STREAM)[0]["lag"] == 0


def test_a_group_destroyed_while_its_stream_is_trimmed_counts_the_gap(
    redis_client, redis_url, caplog
):
    reader = Reader(redis_url)
    _write(redis_client, 100)
    assert reader.consumer.poll() == 30
    redis_client.xgroup_destroy(STREAM, GROUP)
    redis_client.xtrim(STREAM, maxlen=20, approximate=False)  # 50 of the 70 unread go
    with caplog.at_level(logging.WARNING):
        reader.drain()
    assert reader.counts() == (50, 50, 50)
    assert f"events:{STREAM}: 50 entries lost before the group applied them [trimmed]" in [
        record.getMessage() for record in caplog.records
    ]


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _restart(server: PrivateRedis, wipe: bool) -> None:
    """Kill the server (nothing saved at exit) and start it on the same port: empty, or from
    the last SAVE."""
    server.stop()
    if wipe:
        (server.directory / "dump.rdb").unlink(missing_ok=True)
    server.start()


def _run(reader: Reader) -> threading.Event:
    stop = threading.Event()
    reader.consumer.start(stop)
    return stop


@pytest.mark.parametrize("trimmed", [0, 60], ids=["new-stream-whole", "new-stream-trimmed"])
def test_a_redis_restarted_empty_counts_what_it_lost(private_redis, caplog, trimmed):
    client = private_redis.client()
    reader = Reader(private_redis.url)
    _write(client, 100)
    assert reader.consumer.poll() == 30  # 70 entries still unread when Redis goes
    _restart(private_redis, wipe=True)
    client = private_redis.client()
    _write(client, 40 + trimmed)  # the producer writes a new stream (say, its buffer) ...
    client.xtrim(STREAM, maxlen=40, approximate=False)  # ... trimmed before the group exists
    with caplog.at_level(logging.WARNING):  # before the thread: it may name the gap at once
        stop = _run(reader)  # the consumer finds its connection broken, reconnects
        try:
            wait_for(lambda: reader.counts() == (70, 70, 70 + trimmed))
        finally:
            stop.set()
            reader.consumer.thread.join(10)
    named = f"events:{STREAM}: {70 + trimmed} entries lost before the group applied them"
    assert f"{named} [data_lost]" in [record.getMessage() for record in caplog.records]
    assert client.xinfo_groups(STREAM)[0]["lag"] == 0
    assert client.xpending(STREAM, GROUP)["pending"] == 0


def test_a_redis_restored_from_an_older_copy_applies_nothing_twice(private_redis):
    client = private_redis.client()
    reader = Reader(private_redis.url)
    _write(client, 100)
    assert reader.consumer.poll() == 30
    client.save()  # the copy it comes back from: 100 entries, 30 delivered and still pending
    reader.drain()
    _write(client, 50)
    assert reader.consumer.poll() == 30  # 20 unread when Redis goes
    assert reader.counts() == (130, 130, 0)
    _restart(private_redis, wipe=False)
    client = private_redis.client()
    assert client.xlen(STREAM) == 100
    _write(client, 10)
    stop = _run(reader)
    try:
        wait_for(lambda: reader.counts() == (140, 140, 20), timeout=5)
    finally:
        stop.set()
        reader.consumer.thread.join(10)
    assert client.xpending(STREAM, GROUP)["pending"] == 0
    assert client.xinfo_groups(STREAM)[0]["lag"] == 0


def test_pending_entries_trimmed_before_a_restart_applies_them_count_as_lost(
    redis_client, redis_url, caplog
):
    _write(redis_client, 100)
    redis_client.xgroup_create(STREAM, GROUP, id="0")
    redis_client.xreadgroup(GROUP, "sidecar", {STREAM: ">"}, count=30)  # then it crashed
    redis_client.xtrim(STREAM, maxlen=80, approximate=False)  # 20 of its 30 pending go
    reader = Reader(redis_url)  # its successor, same consumer name
    with caplog.at_level(logging.WARNING):
        reader.drain()
    assert reader.counts() == (80, 80, 20)
    assert redis_client.xpending(STREAM, GROUP)["pending"] == 0
    named = f"events:{STREAM}: 20 entries lost before the group applied them [deleted_pending]"
    assert named in [record.getMessage() for record in caplog.records]
