"""A poison event never blocks a stream: it is refused, named and acknowledged, the rest of
its batch is applied, and a restart under the same consumer name finds nothing stuck."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers import v1 as v1_module
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer
from tests.conftest import Series, parse_exposition, scrape_series, value, wait_for
from tests.sources.readers.test_events_runnerq import RunnerQ

RUNNERQ_STREAM = "default:events_stream"
V1_STREAM = "app:events"
GROUP = "queue-exporter"


def _consumer(redis_url: str, stream: dict[str, str], name: str = "sidecar"):
    telemetry = Telemetry(HealthBoard())
    settings = EventsSourceConfig.model_validate(
        {"streams": [{**stream, "start": "0"}], "consumer": name, "batch_size": 1000}
    )
    metrics = EventMetrics(telemetry, settings.buckets())
    connection = RedisConnectionConfig.model_validate({"url": redis_url})
    return StreamConsumer(settings.streams[0], settings, connection, metrics), telemetry


def _series(telemetry: Telemetry) -> Series:
    return parse_exposition(telemetry.render(False).decode())


def _drain(consumer: StreamConsumer) -> None:
    while consumer.poll():
        pass
    consumer.close()


def _pending(client, stream: str) -> int:
    return int(client.xpending(stream, GROUP)["pending"])


def _runnerq_batch(client, poison_key_type: str) -> tuple[bytes, str, int]:
    """999 good Enqueued events around one whose activity:<id> is not a hash: the poison's
    entry id and activity id, and the number of good events."""
    rq = RunnerQ(client)
    now = time.time()
    good = [rq.new("send_email", "High", now) for _ in range(999)]
    poison = str(uuid.uuid4())
    key = f"activity:{poison}"
    if poison_key_type == "string":
        client.set(key, "not a hash")
    elif poison_key_type == "list":
        client.rpush(key, "a", "b")
    else:
        client.zadd(key, {"a": 1.0})
    for activity in good[:500]:
        rq.event(activity, "Enqueued", now, None, {"priority": "High"}, maxlen=10_000)
    rq.event(poison, "Enqueued", now, None, {"priority": "High"}, maxlen=10_000)
    poison_id = client.xrevrange(RUNNERQ_STREAM, count=1)[0][0]
    for activity in good[500:]:
        rq.event(activity, "Enqueued", now, None, {"priority": "High"}, maxlen=10_000)
    return poison_id, poison, 999


def _runnerq_counts(telemetry: Telemetry) -> tuple[float | None, ...]:
    series = _series(telemetry)
    return (
        value(series, "queue_exporter_events_total", stream=RUNNERQ_STREAM),
        value(series, "queue_jobs_enqueued_total", job_type="send_email"),
        value(
            series,
            "queue_exporter_events_invalid_total",
            stream=RUNNERQ_STREAM,
            reason="unreadable_activity",
        ),
    )


@pytest.mark.parametrize("poison_key_type", ["string", "list", "zset"])
def test_an_activity_key_that_is_not_a_hash_costs_only_its_event(
    redis_client, redis_url, poison_key_type, caplog
):
    poison_id, poison, good = _runnerq_batch(redis_client, poison_key_type)
    consumer, telemetry = _consumer(
        redis_url, {"key": RUNNERQ_STREAM, "format": "runnerq", "system": "runnerq"}
    )
    with caplog.at_level(logging.WARNING):
        assert consumer.poll() == good + 1  # one batch
        _drain(consumer)
    assert _runnerq_counts(telemetry) == (good + 1, good, 1)
    assert _pending(redis_client, RUNNERQ_STREAM) == 0
    named = [r.getMessage() for r in caplog.records if "refused entry" in r.getMessage()]
    assert named == [
        f"{RUNNERQ_STREAM}: refused entry {poison_id.decode()} (unreadable_activity)"
        f": activity:{poison}"
    ]


def test_a_restart_under_the_same_name_recovers_a_batch_left_pending(
    redis_client, redis_url, run_exporter
):
    """The batch a crashed incarnation read (poison included) is applied and acked when the
    exporter starts again under the same consumer name, and it is ready."""
    _, _, good = _runnerq_batch(redis_client, "string")
    redis_client.xgroup_create(RUNNERQ_STREAM, GROUP, id="0")
    redis_client.xreadgroup(GROUP, "sidecar", {RUNNERQ_STREAM: ">"}, count=1000)
    assert _pending(redis_client, RUNNERQ_STREAM) == good + 1

    stream = {"key": RUNNERQ_STREAM, "format": "runnerq", "system": "runnerq"}
    app = run_exporter(
        {
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [stream], "consumer": "sidecar"},
            }
        }
    )
    series = wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_exporter_events_total", stream=RUNNERQ_STREAM) == good + 1
            and s
        )
    )
    assert value(series, "queue_jobs_enqueued_total", job_type="send_email") == good
    assert value(series, "queue_exporter_events_invalid_total", reason="unreadable_activity") == 1
    wait_for(app.health.ready)
    wait_for(lambda: _pending(redis_client, RUNNERQ_STREAM) == 0)  # acked with the next read


def test_a_runnerq_entry_that_broke_the_enrichment_pipeline(redis_client, redis_url):
    """A lone surrogate in the activity id cannot be a Redis key: refused, not raised."""
    rq = RunnerQ(redis_client)
    now = time.time()
    good = rq.new("send_email", "High", now)
    rq.event(good, "Enqueued", now, None, {"priority": "High"})
    payload = '{"activity_id": "\\ud800", "timestamp": "2024-01-01T00:00:00Z", '
    redis_client.xadd(RUNNERQ_STREAM, {"event": payload + '"event_type": "Enqueued"}'})
    rq.event(good, "LeaseExtended", now, None, {"activity_type": "\ud83d\ude00"})
    redis_client.hset(f"activity:{good}", "retry_count", "²")  # isdigit(), yet not int()
    rq.event(good, "Completed", now, "w1", {})
    consumer, telemetry = _consumer(
        redis_url, {"key": RUNNERQ_STREAM, "format": "runnerq", "system": "runnerq"}
    )
    _drain(consumer)
    series = _series(telemetry)
    assert value(series, "queue_exporter_events_total", stream=RUNNERQ_STREAM) == 4
    assert value(series, "queue_exporter_events_invalid_total", reason="bad_encoding") == 1
    assert value(series, "queue_jobs_enqueued_total", job_type="send_email") == 1
    assert value(series, "queue_jobs_lease_extended_total", job_type="send_email") == 1
    assert value(series, "queue_job_attempts_sum", job_type="send_email") == 1
    assert _pending(redis_client, RUNNERQ_STREAM) == 0


def test_v1_entries_the_decoder_refuses_leave_the_batch_whole(redis_client, redis_url, caplog):
    good = [wire.encode("enqueued", {"queue": "q", "job_type": "t"}) for _ in range(600)]
    hostile: list[dict[str, object]] = [
        {"v": "1", "event": "enqueued", "ts": "nan", "queue": "q"},
        {"v": "1", "event": "completed", "ts": "1e400", "queue": "q"},
        {"v": "1", "event": "enqueued", "ts": "1", "queue": b"\xff\xfe"},
        {
            "v": "1",
            "event": "worker_heartbeat",
            "ts": "1",
            "queue": "q",
            "worker": "w",
            "active": "9" * 30,
            "capacity": "1",
        },
        {"v": "2", "event": "enqueued", "ts": "1"},
        {"junk": b"\x00" * 2000},
    ]
    pipe = redis_client.pipeline(transaction=False)
    for n, entry in enumerate(good):
        pipe.xadd(V1_STREAM, entry)
        if n % 100 == 0:
            pipe.xadd(V1_STREAM, hostile[n // 100])
    pipe.execute()
    consumer, telemetry = _consumer(redis_url, {"key": V1_STREAM, "system": "app"})
    with caplog.at_level(logging.WARNING):
        assert consumer.poll() == 606
        _drain(consumer)
    series = _series(telemetry)
    assert value(series, "queue_exporter_events_total", stream=V1_STREAM) == 606
    assert value(series, "queue_jobs_enqueued_total", job_type="t") == 600
    invalid = {
        dict(labels)["reason"]: count
        for (name, labels), count in series.items()
        if name == "queue_exporter_events_invalid_total"
    }
    assert invalid == {"bad_number": 3, "bad_encoding": 1, "unknown_version": 1, "missing_field": 1}
    assert _pending(redis_client, V1_STREAM) == 0
    warned = [r.getMessage() for r in caplog.records if "refused entry" in r.getMessage()]
    assert len(warned) == 4  # once per reason: the second bad_number waits for the period
    assert all(message.startswith(f"{V1_STREAM}: refused entry ") for message in warned)


def test_an_exporter_bug_on_one_event_costs_only_that_event(
    redis_client, redis_url, monkeypatch, caplog
):
    """Whatever escapes the decoder (here a bug planted in the event mapping, on both of its
    paths: plain entries and parsed events) refuses the one entry that raised, as
    `unprocessable`; the batch's other entries count exactly once."""
    apply, tally_plain = v1_module.apply, v1_module.tally_plain

    def buggy(tally, event, system):
        if event.job_type == "boom":
            raise KeyError("planted")
        apply(tally, event, system)

    def buggy_plain(plain, flat, *rest):
        if b"boom" in flat:
            raise KeyError("planted")
        return tally_plain(plain, flat, *rest)

    monkeypatch.setattr(v1_module, "apply", buggy)
    monkeypatch.setattr(v1_module, "tally_plain", buggy_plain)
    pipe = redis_client.pipeline(transaction=False)
    for n in range(300):
        pipe.xadd(V1_STREAM, wire.encode("enqueued", {"queue": "q", "job_type": "t"}))
        if n == 150:
            pipe.xadd(V1_STREAM, wire.encode("enqueued", {"queue": "q", "job_type": "boom"}))
    ids = pipe.execute()
    boom = ids[151]
    consumer, telemetry = _consumer(redis_url, {"key": V1_STREAM, "system": "app"})
    with caplog.at_level(logging.WARNING):
        _drain(consumer)
    series = _series(telemetry)
    assert value(series, "queue_exporter_events_total", stream=V1_STREAM) == 301
    assert value(series, "queue_jobs_enqueued_total", job_type="t") == 300
    assert value(series, "queue_jobs_enqueued_total", job_type="boom") is None
    assert value(series, "queue_exporter_events_invalid_total", reason="unprocessable") == 1
    assert _pending(redis_client, V1_STREAM) == 0
    assert any(
        f"refused entry {boom.decode()} (unprocessable): KeyError" in r.getMessage()
        for r in caplog.records
    )
