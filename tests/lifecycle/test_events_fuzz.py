"""Hypothesis writes hostile entries into real Redis streams, around valid events, and the
consumer reads them: it never stops, nothing stays pending, the valid events count exactly.

Both decoders: the v1 wire format (any bytes as keys and values, numbers huge, nan, inf or
negative, fields missing) and Runner-Q's JSON (any JSON, any activity id, and an
`activity:<id>` key that is missing, a hash of anything, or a key of another type).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer
from tests.conftest import Series, parse_exposition, value

FUZZ = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MARKER = "valid-marker"

_NUMBERS = st.one_of(
    st.sampled_from([b"nan", b"-nan", b"inf", b"-inf", b"1e400", b"-0", b"1e15", b"9" * 40]),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()),
)
_V1_VALUES = st.one_of(
    st.binary(max_size=40),
    _NUMBERS,
    st.sampled_from([b"1", b"0", b"", b"\xff\xfe", b"x" * 2000]),
    st.sampled_from([name.encode() for name in wire.EVENTS]),
)
_V1_KEYS = st.one_of(
    st.sampled_from(
        [b"v", b"event", b"ts", b"queue", b"job_type", b"priority", b"system", b"duration",
         b"delay", b"attempt", b"count", b"ok", b"active", b"capacity", b"worker",
         b"enqueued_at", b"started_at", b"scheduled_for", b"error_type", b"reason"]
    ),
    st.binary(min_size=1, max_size=10),
)  # fmt: skip
# Shaped like an event (v 1, a known name, a time), then anything in the other fields.
_V1_SHAPED = st.builds(
    lambda name, ts, rest: {b"v": b"1", b"event": name, b"ts": ts, **rest},
    st.sampled_from([name.encode() for name in wire.EVENTS]),
    st.one_of(st.just(b"1700000000.5"), _NUMBERS),
    st.dictionaries(_V1_KEYS, _V1_VALUES, max_size=8),
)
_V1_ENTRIES = st.one_of(_V1_SHAPED, st.dictionaries(_V1_KEYS, _V1_VALUES, min_size=1, max_size=12))


def _consumer(redis_url: str, stream: str, fmt: str) -> tuple[StreamConsumer, Telemetry]:
    telemetry = Telemetry(HealthBoard())
    settings_ = EventsSourceConfig.model_validate(
        {"streams": [{"key": stream, "format": fmt, "start": "0"}], "batch_size": 7}
    )
    consumer = StreamConsumer(
        settings_.streams[0],
        settings_,
        RedisConnectionConfig.model_validate({"url": redis_url}),
        EventMetrics(telemetry, settings_.buckets()),
    )
    return consumer, telemetry


def _consume(redis_url: str, stream: str, fmt: str) -> Series:
    consumer, telemetry = _consumer(redis_url, stream, fmt)
    try:
        while consumer.poll():  # raises if anything escapes: the consumer would have stopped
            pass
        consumer.close()
        return parse_exposition(telemetry.render(False).decode())
    finally:
        telemetry.shutdown()


def _interleave(hostile: list[Any], valid: list[Any], positions: list[int]) -> list[Any]:
    entries = list(hostile)
    for item, position in zip(valid, positions, strict=False):
        entries.insert(position % (len(entries) + 1), item)
    return entries


def _refused(series: Series, stream: str) -> float:
    return sum(
        count
        for (name, labels), count in series.items()
        if name == "queue_exporter_events_invalid_total" and ("stream", stream) in labels
    )


@FUZZ
@given(
    hostile=st.lists(_V1_ENTRIES, max_size=25),
    valid=st.integers(min_value=1, max_value=12),
    positions=st.lists(st.integers(min_value=0, max_value=40), min_size=12, max_size=12),
)
def test_v1_consumer_survives_any_field_map(redis_client, redis_url, hostile, valid, positions):
    stream = f"fuzz:{uuid.uuid4().hex}"
    good = [
        {b"v": b"1", b"event": b"enqueued", b"ts": b"1700000000.5", b"queue": MARKER.encode()}
    ] * valid
    pipe = redis_client.pipeline(transaction=False)
    for fields in _interleave(hostile, good, positions):
        pipe.xadd(stream, fields)
    pipe.execute()

    series = _consume(redis_url, stream, "v1")
    assert value(series, "queue_exporter_events_total", stream=stream) == len(hostile) + valid
    marked = [
        count
        for (name, labels), count in series.items()
        if name == "queue_jobs_enqueued_total" and ("queue", MARKER) in labels
    ]
    hostile_markers = sum(  # a hostile entry that happens to be a valid enqueued of MARKER
        1 for fields in hostile if _is_marker(fields)
    )
    assert sum(marked) == valid + hostile_markers
    refused = sum(1 for fields in hostile if not _valid_v1(fields))
    assert _refused(series, stream) == refused
    assert redis_client.xpending(stream, "queue-exporter")["pending"] == 0
    redis_client.delete(stream)


def _valid_v1(fields: dict[bytes, bytes]) -> bool:
    try:
        wire.parse(fields)
    except wire.InvalidEvent:
        return False
    return True


def _is_marker(fields: dict[bytes, bytes]) -> bool:
    return (
        _valid_v1(fields)
        and fields.get(b"event") == b"enqueued"
        and fields.get(b"queue") == MARKER.encode()
    )


# -- Runner-Q -------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
_HOSTILE_IDS = ["a", "b", "c", "d"]
_TIMES = st.one_of(
    st.sampled_from(["2023-11-14T22:13:20Z", "2023-11-14T22:13:20.123456789+00:00", "", "x"]),
    st.text(max_size=30),
)
_DETAIL = st.fixed_dictionaries(
    {},
    optional={
        name: st.one_of(_JSON, _TIMES)
        for name in ("priority", "scheduled_at", "from", "retry_count", "error", "reason",
                     "activity_type")
    },
)  # fmt: skip
_EVENT_TYPES = st.sampled_from(
    ["Enqueued", "Scheduled", "Dequeued", "Completed", "Failed", "Retrying", "DeadLetter",
     "Requeued", "LeaseExtended", "Started", "ResultStored", "Nope"]
)  # fmt: skip
_DOCUMENT = st.fixed_dictionaries(
    {},
    optional={
        "activity_id": st.one_of(st.sampled_from(_HOSTILE_IDS), st.text(max_size=70), _JSON),
        "timestamp": st.one_of(_TIMES, _JSON),
        "event_type": st.one_of(_EVENT_TYPES, _JSON),
        "worker_id": _JSON,
        "detail": st.one_of(_DETAIL, _JSON),
    },
)  # fmt: skip
# Shaped like an ActivityEvent (an id, a time, a type), anything in the rest.
_SHAPED = st.fixed_dictionaries(
    {
        "activity_id": st.one_of(st.sampled_from(_HOSTILE_IDS), st.text(max_size=70)),
        "timestamp": st.one_of(st.just("2023-11-14T22:13:20Z"), _TIMES),
        "event_type": _EVENT_TYPES,
    },
    optional={"worker_id": _JSON, "detail": st.one_of(_DETAIL, _JSON)},
)
_RUNNERQ_ENTRIES = st.one_of(
    _SHAPED.map(lambda doc: {b"event": json.dumps(doc).encode()}),
    _DOCUMENT.map(lambda doc: {b"event": json.dumps(doc).encode("utf-8", "surrogatepass")}),
    _JSON.map(lambda doc: {b"event": json.dumps(doc).encode()}),
    st.dictionaries(st.binary(min_size=1, max_size=8), st.binary(max_size=60), min_size=1),
)
_HASH_FIELDS = st.sampled_from(
    ["activity_type", "priority", "created_at", "scheduled_at", "started_at", "completed_at",
     "retry_count", "junk"]
)  # fmt: skip
_ACTIVITY_KEYS = st.one_of(
    st.none(),
    st.dictionaries(_HASH_FIELDS, st.one_of(st.binary(max_size=30), _TIMES), min_size=1),
    st.sampled_from(["string", "list", "zset", "set"]),
)


def _write_activity(client: redis.Redis, activity_id: str, layout: Any) -> None:
    key = f"activity:{activity_id}"
    client.delete(key)
    if layout is None:
        return
    if isinstance(layout, dict):
        client.hset(key, mapping=layout)
    elif layout == "string":
        client.set(key, "x")
    elif layout == "list":
        client.rpush(key, "x")
    elif layout == "zset":
        client.zadd(key, {"x": 1})
    else:
        client.sadd(key, "x")


@FUZZ
@given(
    hostile=st.lists(_RUNNERQ_ENTRIES, max_size=20),
    activities=st.fixed_dictionaries({activity: _ACTIVITY_KEYS for activity in _HOSTILE_IDS}),
    valid=st.integers(min_value=1, max_value=8),
    positions=st.lists(st.integers(min_value=0, max_value=30), min_size=8, max_size=8),
)
def test_runnerq_consumer_survives_any_entry_and_activity_key(
    redis_client, redis_url, hostile, activities, valid, positions
):
    stream = f"fuzz-{uuid.uuid4().hex}:events_stream"
    for activity_id, layout in activities.items():
        _write_activity(redis_client, activity_id, layout)
    good = []
    for _ in range(valid):
        activity_id = str(uuid.uuid4())
        redis_client.hset(f"activity:{activity_id}", mapping={"activity_type": MARKER})
        document = {
            "activity_id": activity_id,
            "timestamp": "2023-11-14T22:13:20Z",
            "event_type": "Enqueued",
            "worker_id": None,
            "detail": {"priority": "High"},
        }
        good.append({b"event": json.dumps(document).encode()})
    pipe = redis_client.pipeline(transaction=False)
    for fields in _interleave(hostile, good, positions):
        pipe.xadd(stream, fields)
    pipe.execute()

    series = _consume(redis_url, stream, "runnerq")
    assert value(series, "queue_exporter_events_total", stream=stream) == len(hostile) + valid
    assert value(series, "queue_jobs_enqueued_total", job_type=MARKER) == valid
    assert redis_client.xpending(stream, "queue-exporter")["pending"] == 0
    redis_client.delete(stream, *(f"activity:{a}" for a in _HOSTILE_IDS))
