"""Consumer groups: several sidecars share a stream, crashes leave nothing uncounted, trims are seen."""

from __future__ import annotations

import logging
import time

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer
from tests.conftest import parse_exposition, scrape_series, value, wait_for

STREAM = "jobs:events"
TYPES = ("a", "b", "c", "d", "e")


def _config(redis_url: str, consumer: str, **settings: object) -> dict[str, object]:
    return {
        "sources": {
            "redis": {"url": redis_url},
            "events": {
                "streams": [{"key": STREAM, "system": "jobs", "start": "0"}],
                "consumer": consumer,
                "batch_size": 10,
                "block_ms": 50,
                **settings,
            },
        }
    }


def _write(client, count: int, offset: int = 0) -> None:
    pipe = client.pipeline(transaction=False)
    for n in range(offset, offset + count):
        entry = wire.encode("enqueued", {"queue": "q", "job_type": TYPES[n % 5], "job_id": n})
        pipe.xadd(STREAM, entry)
    pipe.execute()


def _counted(*apps) -> tuple[float, dict[str, float]]:
    """Events consumed and enqueued per job type, summed over the exporters."""
    consumed, by_type = 0.0, dict.fromkeys(TYPES, 0.0)
    for app in apps:
        series = scrape_series(app)
        consumed += value(series, "queue_exporter_events_total", stream=STREAM) or 0
        for job_type in TYPES:
            found = value(series, "queue_jobs_enqueued_total", job_type=job_type)
            by_type[job_type] += found or 0
    return consumed, by_type


def _wait_all_acked(client) -> None:
    """Nothing more arrives: every entry is acknowledged (a consumer acks a batch with its next
    read), so none is left pending for a consumer to be delivered or claim again."""
    wait_for(lambda: client.xpending(STREAM, "queue-exporter")["pending"] == 0)


def test_two_consumers_count_every_event_exactly_once(redis_client, redis_url, run_exporter):
    first = run_exporter(_config(redis_url, "sidecar-a"))
    second = run_exporter(_config(redis_url, "sidecar-b"))
    for n in range(4):
        _write(redis_client, 500, offset=n * 500)
        time.sleep(0.05)
    wait_for(lambda: _counted(first, second)[0] == 2000)
    _wait_all_acked(redis_client)
    consumed, by_type = _counted(first, second)
    assert consumed == 2000
    assert by_type == dict.fromkeys(TYPES, 400.0)
    shares = [
        value(scrape_series(app), "queue_exporter_events_total", stream=STREAM)
        for app in (first, second)
    ]
    assert all(share and share > 0 for share in shares), shares  # both took part
    first.shutdown()
    second.shutdown()
    assert redis_client.xpending(STREAM, "queue-exporter")["pending"] == 0  # acked at shutdown


def test_survivor_claims_what_a_killed_consumer_left_pending(redis_client, redis_url, run_exporter):
    _write(redis_client, 100)
    redis_client.xgroup_create(STREAM, "queue-exporter", id="0")
    # A consumer that read 30 entries and was killed before acknowledging them.
    redis_client.xreadgroup("queue-exporter", "killed", {STREAM: ">"}, count=30)
    # This sidecar's own earlier incarnation (same pod name) left 20 pending too.
    redis_client.xreadgroup("queue-exporter", "sidecar-b", {STREAM: ">"}, count=20)
    assert redis_client.xpending(STREAM, "queue-exporter")["pending"] == 50

    survivor = run_exporter(_config(redis_url, "sidecar-b", claim_idle=0.3))
    wait_for(lambda: _counted(survivor)[0] == 100)
    _write(redis_client, 50, offset=100)
    wait_for(lambda: _counted(survivor)[0] == 150)
    _wait_all_acked(redis_client)
    consumed, by_type = _counted(survivor)
    assert consumed == 150 and by_type == dict.fromkeys(TYPES, 30.0)
    survivor.shutdown()
    assert redis_client.xpending(STREAM, "queue-exporter")["pending"] == 0


def _consumer(redis_url: str, name: str):
    telemetry = Telemetry(HealthBoard())
    settings = EventsSourceConfig.model_validate(
        {"streams": [{"key": STREAM, "system": "jobs", "start": "0"}], "consumer": name}
    )
    metrics = EventMetrics(telemetry, settings.buckets())
    connection = RedisConnectionConfig.model_validate({"url": redis_url})
    return StreamConsumer(settings.streams[0], settings, connection, metrics), telemetry


def _series(telemetry: Telemetry):
    return parse_exposition(telemetry.render(False).decode())


def _drain(*consumers: StreamConsumer) -> None:
    while sum(consumer.poll() for consumer in consumers):
        pass
    for consumer in consumers:
        consumer.close()


def test_entries_trimmed_before_they_were_read_are_counted_lost_once(redis_client, redis_url):
    first, first_telemetry = _consumer(redis_url, "one")
    second, second_telemetry = _consumer(redis_url, "two")
    _write(redis_client, 5)
    assert first.poll() == 5  # creates the group and reads everything so far
    _write(redis_client, 300, offset=5)
    redis_client.xtrim(STREAM, maxlen=100, approximate=False)  # 200 unread entries gone
    _drain(first, second)

    totals = {"consumed": 0.0, "lost": 0.0}
    for telemetry in (first_telemetry, second_telemetry):
        series = _series(telemetry)
        totals["consumed"] += value(series, "queue_exporter_events_total", stream=STREAM) or 0
        totals["lost"] += value(series, "queue_exporter_events_lost_total", stream=STREAM) or 0
    assert totals == {"consumed": 105, "lost": 200}
    group = redis_client.xinfo_groups(STREAM)[0]
    assert group["lag"] == 0  # the group's read counter was moved past the gap

    # another trim while nobody reads; counted by whichever consumer reads next
    _write(redis_client, 300, offset=305)
    redis_client.xtrim(STREAM, maxlen=50, approximate=False)
    _drain(second)  # a closed consumer reconnects on its next poll
    lost = consumed = 0.0
    for telemetry in (first_telemetry, second_telemetry):
        series = _series(telemetry)
        lost += value(series, "queue_exporter_events_lost_total", stream=STREAM) or 0
        consumed += value(series, "queue_exporter_events_total", stream=STREAM) or 0
    assert (consumed, lost) == (155, 450)


def test_a_stream_that_appears_later_is_read_from_its_start(redis_client, redis_url):
    consumer, telemetry = _consumer(redis_url, "early")
    assert consumer.poll() == 0  # no stream yet: nothing created, nothing read
    assert not redis_client.exists(STREAM)
    _write(redis_client, 7)
    _drain(consumer)
    assert value(_series(telemetry), "queue_exporter_events_total", stream=STREAM) == 7


def test_a_flushed_script_cache_costs_nothing(redis_client, redis_url):
    consumer, telemetry = _consumer(redis_url, "one")
    _write(redis_client, 3)
    assert consumer.poll() == 3
    redis_client.script_flush()
    _write(redis_client, 4, offset=3)
    _drain(consumer)
    assert value(_series(telemetry), "queue_exporter_events_total", stream=STREAM) == 7
    assert redis_client.xpending(STREAM, "queue-exporter")["pending"] == 0


def test_a_consumer_speaking_resp3_counts_every_event_once(redis_client, redis_url):
    """Replies are parsed as they come: RESP3 shapes them differently (a map of streams)."""
    consumer, telemetry = _consumer(f"{redis_url}?protocol=3", "resp3")
    _write(redis_client, 25)
    _drain(consumer)
    series = _series(telemetry)
    assert value(series, "queue_exporter_events_total", stream=STREAM) == 25
    for job_type in TYPES:
        assert value(series, "queue_jobs_enqueued_total", job_type=job_type) == 5
    assert redis_client.xpending(STREAM, "queue-exporter")["pending"] == 0


def test_a_consumer_waiting_for_entries_stops_at_once_at_shutdown(
    redis_client, redis_url, run_exporter, caplog
):
    """Its wait (XREAD BLOCK, here up to 4 s) would outlast the shutdown's 1 s of grace and be
    reported as a read cut off; it has nothing to ack, so it ends as shutdown begins."""
    _write(redis_client, 5)
    app = run_exporter(_config(redis_url, "idle", block_ms=60_000))
    wait_for(lambda: _counted(app)[0] == 5)
    wait_for(lambda: redis_client.xpending(STREAM, "queue-exporter")["pending"] == 0)
    [consumer] = app.event_consumers
    wait_for(lambda: consumer._waiting)
    with caplog.at_level(logging.WARNING, logger="exporter.runtime.app"):
        app.shutdown()
    assert consumer.thread is not None and not consumer.thread.is_alive()
    assert "cut off" not in caplog.text
