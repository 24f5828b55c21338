"""Native readers meet hostile data: a broken record costs itself only, and is counted.

Celery: messages on the events channel that are not kombu's, or events missing what they
need, are refused by reason while a real event (sent by Celery's own EventDispatcher) is
applied. RQ: registry members whose job hash is gone, of another type or unreadable still
count as what the registry says, the unreadable ones also as invalid. Any record key of
another Redis type (RQ, Sidekiq, Celery, BullMQ) costs itself only: counted as `wrong_type`,
the read goes on (Hypothesis over the type of every key RQ reads). Redis restarts: both
readers come back by themselves. A reader that stood by while another replica led does not
count again what that replica counted.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.leader.config import LeaderElectionConfig
from exporter.leader.election import Leadership
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    CeleryReaderConfig,
    RqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import NativeSource, Reader, Signals
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.sidekiq import SidekiqReader
from exporter.sources.streams.config import EventsSourceConfig
from tests import claims
from tests.applied_source import AppliedSource
from tests.conftest import Series, parse_exposition, scrape_series, total, value, wait_for
from tests.private_redis import PrivateRedis


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
        done = total(series, "queue_jobs_completed_total", system="rq", queue="default")
        failed = total(series, "queue_jobs_failed_total", system="rq", queue="default")
        return series if done == 2 and failed == 1 else None

    series = wait_for(counted, timeout=30)
    invalid = value(
        series, "queue_exporter_events_invalid_total", stream="native:rq", reason="bad_value"
    )
    assert invalid == 1  # the garbled result
    wrong_type = value(
        series, "queue_exporter_events_invalid_total", stream="native:rq", reason="wrong_type"
    )
    assert wrong_type == 1  # the job record that is a string
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


LEASE_KEY = "test:leader"


def _leadership(redis_url: str, identity: str) -> Leadership:
    """A replica's lease on the test's Redis, renewed by the test (no thread). Redis expires it
    0.2 s after a renewal; the replica's own clock stands still, so it holds its token until
    the test renews it, however late the reads run on a loaded host."""
    config = LeaderElectionConfig(
        enabled=True, key=LEASE_KEY, lease_ttl=0.2, renew_interval=0.05, identity=identity
    )
    connection = RedisConnectionConfig(url=redis_url, socket_timeout=5)
    return Leadership(config, connection, clock=lambda: 0.0)


def _native_sources(
    redis_url: str, term: Callable[[], int | None] | None
) -> tuple[Telemetry, list[AppliedSource]]:
    """The RQ and Celery readers run as the exporter runs them, reading every 0.1 s."""
    connection = RedisConnectionConfig(url=redis_url)
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
    sources = [
        NativeSource(lambda: RqReader(RqReaderConfig(), connection), 0.1, metrics, term=term),
        NativeSource(
            lambda: CeleryReader(CeleryReaderConfig(), connection, 0.1), 0.1, metrics, term=term
        ),
    ]
    return telemetry, [AppliedSource(source, telemetry, metrics) for source in sources]


def _read_all(telemetry: Telemetry, sources: list[AppliedSource]) -> Series:
    for source in sources:
        source.sample()
    return parse_exposition(telemetry.render(False).decode())


def test_a_reader_left_standing_by_does_not_count_what_the_leader_counted(redis_client, redis_url):
    """Another replica led between two reads (the lease's fencing token moved past this
    replica's next one): the source starts a new reader, whose first read is a baseline (RQ's
    registries, Celery's subscription); then both count again. A lease that lapsed with none
    taking it (this replica's next token) is no gap: what finished meanwhile is counted."""
    replica, other = _leadership(redis_url, "replica"), _leadership(redis_url, "other")
    assert replica.renew()
    telemetry, sources = _native_sources(redis_url, replica.token)
    redis_client.sadd("rq:queues", "rq:queue:default")
    try:
        _read_all(telemetry, sources)  # the baseline, and the subscription
        # The lease lapses (Redis expires it) and none takes it: this replica's next lease.
        wait_for(lambda: not redis_client.exists(LEASE_KEY), timeout=30)
        redis_client.zadd("rq:finished:default", {"while-lapsed": 1})
        assert replica.renew()
        lapsed = _read_all(telemetry, sources)
        assert total(lapsed, "queue_jobs_completed_total", system="rq") == 1

        replica.release()
        assert other.renew()  # another replica leads and counts what happens now
        redis_client.zadd("rq:finished:default", {"while-away": 1})
        _heartbeat(redis_url, "away@test")
        other.release()
        assert replica.renew()
        away = _read_all(telemetry, sources)
        assert total(away, "queue_jobs_completed_total", system="rq") == 1
        assert not value(away, "queue_workers", system="celery", state="idle")

        redis_client.zadd("rq:finished:default", {"while-leading": 1})
        _heartbeat(redis_url, "here@test")
        leading = wait_for(lambda: _idle_celery_worker(_read_all(telemetry, sources)), timeout=30)
        assert total(leading, "queue_jobs_completed_total", system="rq") == 2
    finally:
        for source in sources:
            source.close()


def test_a_late_read_counts_what_happened_since_the_last(redis_client, redis_url):
    """Without leader election, reads far apart (a loaded host, a slow read: here ten
    intervals) are no gap: a job that finished in between is counted, not taken as a
    baseline and lost."""
    telemetry, sources = _native_sources(redis_url, None)
    redis_client.sadd("rq:queues", "rq:queue:default")
    try:
        _read_all(telemetry, sources)  # the baseline
        redis_client.zadd("rq:finished:default", {"late": 1})
        time.sleep(1.0)  # ten of the readers' intervals
        late = _read_all(telemetry, sources)
        assert total(late, "queue_jobs_completed_total", system="rq") == 1
    finally:
        for source in sources:
            source.close()


def _idle_celery_worker(series: Series) -> Series | None:
    return series if value(series, "queue_workers", system="celery", state="idle") else None


def _heartbeat(redis_url: str, hostname: str) -> None:
    celery = Celery(broker=redis_url)
    with celery.connection_for_write() as connection:
        dispatcher = celery.events.Dispatcher(connection, hostname=hostname)
        dispatcher.send("worker-heartbeat", active=0, freq=2.0)
        dispatcher.close()


# -- a record key of another Redis type -------------------------------------------------------

REDIS_TYPES = ("string", "list", "set", "zset", "hash", "stream")


def _write_as(client: redis.Redis, key: str, kind: str, member: str = "x") -> None:
    """Replace `key` by a key of Redis type `kind` holding `member`."""
    client.delete(key)
    if kind == "string":
        client.set(key, member)
    elif kind == "list":
        client.rpush(key, member)
    elif kind == "set":
        client.sadd(key, member)
    elif kind == "zset":
        client.zadd(key, {member: 1})
    elif kind == "hash":
        client.hset(key, "state", member)
    else:
        client.xadd(key, {"f": member})


def _completed(signals: Signals, queue: str) -> float:
    return sum(
        count
        for (metric, labels), count in signals.tally.counts.items()
        if metric == "queue_jobs_completed_total" and labels[1] == queue
    )


def _workers(signals: Signals) -> set[str]:
    return {heartbeat.worker for heartbeat in signals.tally.heartbeats}


# Each key the RQ reader reads, its right type, and what it holds in the test.
_RQ_KEYS = {
    "rq:queues": ("set", "rq:queue:bad"),
    "rq:wip:bad": ("zset", "running"),
    "rq:finished:bad": ("zset", "j0"),
    "rq:failed:bad": ("zset", "f0"),
    "rq:workers": ("set", "rq:worker:w1"),
    "rq:worker:w1": ("hash", "idle"),
}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kinds=st.fixed_dictionaries({key: st.sampled_from(REDIS_TYPES) for key in _RQ_KEYS}))
def test_rq_keys_of_any_type_cost_themselves_only(redis_client, redis_url, kinds):
    """Every key RQ's reader reads is turned into any Redis type between two reads: the read
    never fails, each key of a wrong type is counted once as wrong_type, the healthy queue's
    completion counts, and once the keys are repaired the broken queue's changes count once
    (its state from before, not its whole registry)."""
    claims.flush_keeping_claim(redis_client)

    def write_rq_layout() -> None:
        for key, (kind, member) in _RQ_KEYS.items():
            _write_as(redis_client, key, kind, member)
        redis_client.sadd("rq:queues", "rq:queue:ok")
        redis_client.sadd("rq:workers", "rq:worker:w2")
        redis_client.hset("rq:worker:w2", mapping={"state": "busy", "queues": "ok"})
        redis_client.hset("rq:worker:w1", "queues", "bad")

    write_rq_layout()
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        reader.read(Signals())  # the baseline
        for key, kind in kinds.items():
            if kind != _RQ_KEYS[key][0]:
                _write_as(redis_client, key, kind)
        redis_client.zadd("rq:finished:ok", {"ok1": 1})
        hostile = Signals()
        reader.read(hostile)

        wrong = {key for key, kind in kinds.items() if kind != _RQ_KEYS[key][0]}
        if "rq:workers" in wrong:
            wrong.discard("rq:worker:w1")  # not named, so not read
        assert hostile.tally.invalid == ({"wrong_type": len(wrong)} if wrong else {})
        assert _completed(hostile, "ok") == 1
        assert _completed(hostile, "bad") == 0
        if "rq:workers" not in wrong:
            assert "w2" in _workers(hostile)

        write_rq_layout()
        redis_client.zadd("rq:finished:bad", {"j1": 1})
        repaired = Signals()
        reader.read(repaired)
        assert repaired.tally.invalid == {}
        assert _completed(repaired, "bad") == 1  # j1 alone: j0 was there at the baseline
        assert _completed(repaired, "ok") == 0
    finally:
        reader.close()


def _rq_hostile(client: redis.Redis) -> None:
    client.sadd("rq:rl-keys", "limit")
    client.set("rq:rl:limit:rate_limited", "not a zset")


def _sidekiq_hostile(client: redis.Redis) -> None:
    client.sadd("processes", "good", "list", "garbage")
    client.hset("good", mapping={"info": '{"concurrency": 5, "queues": ["q"]}', "busy": "1"})
    client.rpush("list", "x")
    client.hset("garbage", mapping={"info": "{not json", "busy": "1"})


def _bullmq_hostile(client: redis.Redis) -> None:
    for queue in ("good", "bad"):
        client.hset(f"bull:{queue}:meta", "opts.maxLenEvents", 10000)
    client.set("bull:bad:events", "not a stream")


@pytest.mark.parametrize(
    ("make_reader", "hostile", "after_baseline", "refused"),
    [
        pytest.param(
            lambda c: RqReader(RqReaderConfig(), c), _rq_hostile, None, {"wrong_type": 1}, id="rq"
        ),
        pytest.param(
            lambda c: SidekiqReader(SidekiqReaderConfig(), c),
            _sidekiq_hostile,
            None,
            {"wrong_type": 1, "bad_value": 1},
            id="sidekiq",
        ),
        pytest.param(
            lambda c: SidekiqReader(SidekiqReaderConfig(), c),
            lambda client: client.set("processes", "not a set"),
            None,
            {"wrong_type": 1},
            id="sidekiq-processes",
        ),
        pytest.param(
            lambda c: CeleryReader(CeleryReaderConfig(), c, 1.0),
            lambda client: client.set("unacked", "not a hash"),
            None,
            {"wrong_type": 1},
            id="celery",
        ),
        pytest.param(
            lambda c: BullmqReader(BullmqReaderConfig(), c),
            _bullmq_hostile,
            lambda client: client.xadd(
                "bull:good:events", {"event": "completed", "jobId": "1", "prev": "active"}
            ),
            {"wrong_type": 1},
            id="bullmq",
        ),
    ],
)
def test_a_record_of_the_wrong_type_costs_itself_only(
    redis_client, redis_url, make_reader, hostile, after_baseline, refused
):
    """Each reader meets a record key of another Redis type: counted by reason (every read),
    and the read succeeds with what the other records say."""
    hostile(redis_client)
    reader: Reader = make_reader(RedisConnectionConfig(url=redis_url))
    try:
        baseline = Signals()
        reader.read(baseline)
        assert baseline.tally.invalid == refused
        if after_baseline is not None:
            after_baseline(redis_client)
        signals = Signals()
        reader.read(signals)
        assert signals.tally.invalid == refused
        if isinstance(reader, SidekiqReader) and "bad_value" in refused:
            assert _workers(signals) == {"good"}
        if isinstance(reader, BullmqReader):
            assert _completed(signals, "good") == 1
    finally:
        reader.close()
