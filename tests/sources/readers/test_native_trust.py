"""Hostile records against the native readers and SQL collectors (issue 23's attacks).

Each test names the class of attack, the issue's example among its cases. The classes:
- a number no sample may take (huge integers, NaN, negative durations, times from the far
  future) is refused by the one number check (exporter/core/numbers.py), counted by reason, and
  reaches no sum, no gauge, no render;
- a record whose reading raises anything (RecursionError from deep nesting included) costs
  itself only: the read goes on and counts every good record;
- what a record may bring and what a reader remembers is bounded (queues per worker, workers
  a Celery reader remembers, entries of kombu's unacked hash and members of an RQ registry a
  read takes, rows a SQL collector reads), the excess counted once per read;
- the tracebacks and warnings of refused records are rate-limited.
Everything runs against the test's own Redis database or PostgreSQL database; the good
records are written by the systems' own libraries where the test can run them (Celery's
EventDispatcher), else in the layouts their docs give.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from rq import Queue, SimpleWorker

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.postgres import source as postgres
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.celery import DEPTH, MAX_UNACKED, CeleryReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    CeleryReaderConfig,
    RqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import (
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    NativeSource,
    ReadDeadline,
    Reader,
    ReaderError,
    Signals,
)
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.rq_windows import MAX_NEW
from exporter.sources.readers.sidekiq import SidekiqReader
from exporter.sources.runner import apply_report
from exporter.sources.streams.config import EventsSourceConfig
from tests.conftest import Series, parse_exposition, total, value

YEAR = 365 * 86_400.0
NAN = float("nan")


def _envelope(body: object) -> bytes:
    """kombu's message envelope around a body (what its Redis transport publishes)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.dumps(
        {
            "body": base64.b64encode(raw).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {},
            "properties": {"body_encoding": "base64", "delivery_tag": "x"},
        }
    ).encode()


def _deep(depth: int = 100_000) -> bytes:
    return b"[" * depth + b"]" * depth


@contextmanager
def _dispatcher(redis_url: str) -> Iterator[Any]:
    """Celery's own EventDispatcher: the good events every test counts."""
    celery = Celery(broker=redis_url)
    with celery.connection_for_write() as connection:
        dispatcher = celery.events.Dispatcher(connection, hostname="good@test")
        yield dispatcher
        dispatcher.close()


def _read(reader: Reader) -> Signals:
    signals = Signals()
    reader.read(signals)
    return signals


def _counted(signals: Signals, metric: str) -> float:
    return sum(count for (name, _), count in signals.tally.counts.items() if name == metric)


def _observed(signals: Signals, metric: str) -> list[float]:
    return [
        v
        for (name, _), values in signals.tally.observations.items()
        if name == metric
        for v in values
    ]


def _rendered(telemetry: Telemetry) -> Series:
    """Both formats render and parse back; the text format's series."""
    openmetrics = telemetry.render(True).decode()
    assert list(parse_openmetrics(openmetrics))
    return parse_exposition(telemetry.render(False).decode())


class _Feed:
    """A reader run as the exporter runs it (NativeSource), rendered after each read."""

    def __init__(self, make_reader: Any, interval: float = 2.0) -> None:
        self.telemetry = Telemetry(HealthBoard())
        self.metrics = EventMetrics(self.telemetry, EventsSourceConfig().buckets())
        self.source = NativeSource(make_reader, interval, self.metrics)

    def read(self) -> Series:
        apply_report(self.telemetry, self.metrics, self.source.name, self.source.sample())
        assert self.telemetry.store.dropped_values == 0  # the reader refused every bad value
        return _rendered(self.telemetry)

    def invalid(self, series: Series) -> dict[str, float]:
        prefix = "queue_exporter_events_invalid_total"
        return {
            dict(labels)["reason"]: count
            for (name, labels), count in series.items()
            if name == prefix and dict(labels)["stream"] == self.source.name and count
        }

    def close(self) -> None:
        self.source.close()
        self.telemetry.shutdown()


# -- numbers no sample may take, and records whose reading raises -------------------------------


def _celery_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "timestamp": time.time(), "hostname": "bad@test", **fields}


CELERY_POISON = {
    # attack 1: a heartbeat whose `active` is a 400-digit integer
    "huge-active": (_celery_event("worker-heartbeat", active=10**400), "bad_number"),
    # attack 3: a runtime NaN, another negative
    "nan-runtime": (_celery_event("task-succeeded", uuid="n", runtime=NAN), "bad_number"),
    "negative-runtime": (
        _celery_event("task-succeeded", uuid="m", runtime=-1000.0),
        "negative_duration",
    ),
    # attack 5: a body nested 100k deep (RecursionError), a heartbeat timestamp of 10**400
    "deep-nesting": (_deep(), "bad_value"),
    "huge-timestamp": (_celery_event("worker-heartbeat", timestamp=10**400), "bad_number"),
    # attack 13: phantom workers timestamped a year ahead, or NaN
    "future-heartbeat": (
        _celery_event("worker-heartbeat", timestamp=time.time() + YEAR),
        "future_time",
    ),
    "nan-heartbeat": (_celery_event("worker-heartbeat", timestamp=NAN), "bad_number"),
    "wrong-types": (_celery_event("task-received", uuid=["x"], retries={}), "missing_field"),
}


@pytest.mark.parametrize("case", list(CELERY_POISON))
def test_celery_poison_costs_only_itself(redis_client, redis_url, case):
    """One poison message among 100 good events and a good heartbeat: refused by reason, the
    100 completions counted, their execution sum exact, one worker (no phantom), /metrics
    renders and parses in both formats."""
    poison, reason = CELERY_POISON[case]
    config = CeleryReaderConfig()
    connection = RedisConnectionConfig(url=redis_url)
    feed = _Feed(lambda: CeleryReader(config, connection, 2.0))
    channel = f"/{redis_url.rsplit('/', 1)[1]}.celeryev/task.multi"
    try:
        feed.read()  # subscribed
        with _dispatcher(redis_url) as dispatcher:
            for index in range(50):
                dispatcher.send("task-succeeded", uuid=f"a{index}", runtime=0.5)
            redis_client.publish(channel, _envelope(poison))
            for index in range(50):
                dispatcher.send("task-succeeded", uuid=f"b{index}", runtime=0.5)
            dispatcher.send("worker-heartbeat", active=1, freq=2.0)
        series = feed.read()
        assert feed.invalid(series) == {reason: 1}
        assert total(series, "queue_jobs_completed_total", system="celery") == 100
        assert total(series, "queue_job_execution_seconds_sum", system="celery") == 50.0
        assert total(series, "queue_job_execution_seconds_count", system="celery") == 100
        assert total(series, "queue_workers", system="celery") == 1
        assert value(series, "queue_workers", system="celery", state="busy") == 1
    finally:
        feed.close()


def test_celery_unacked_entry_nested_deep_costs_only_itself(redis_client, redis_url):
    """Attack 6: one kombu `unacked` entry nested 100k deep beside two real deliveries: the
    reader stays up, the two are pending depth, the deep one is refused every read."""
    for tag, queue in (("t1", "q1"), ("t2", "q1")):
        message = {"headers": {"id": tag}, "body": "", "properties": {}}
        redis_client.hset("unacked", tag, json.dumps([message, "", queue]))
    redis_client.hset("unacked", "deep", _deep())
    feed = _Feed(
        lambda: CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    )
    try:
        for _ in range(2):
            series = feed.read()
            assert feed.invalid(series) == {"bad_value": 1} or feed.invalid(series) == {
                "bad_value": 2
            }
            assert value(series, "queue_depth", system="celery", queue="q1", state="pending") == 2
        assert feed.invalid(series) == {"bad_value": 2}  # counted at each read
    finally:
        feed.close()


def test_sidekiq_numbers_out_of_range_cost_only_themselves(redis_client, redis_url):
    """Attack 2: a process whose concurrency is a 400-digit integer, beside a good one.
    Attack 7: `stat:processed` "nan" for one read, then 85 more completions: the read counts
    neither counter, the workers stay, and the next good read counts all 85."""
    redis_client.sadd("processes", "good:1", "huge:2")
    info = {"concurrency": 5, "queues": ["default"], "hostname": "good"}
    redis_client.hset("good:1", mapping={"info": json.dumps(info), "busy": "2"})
    huge = {**info, "concurrency": 10**400}
    redis_client.hset("huge:2", mapping={"info": json.dumps(huge), "busy": "1"})
    redis_client.mset({"stat:processed": 100, "stat:failed": 10})
    feed = _Feed(lambda: SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=redis_url)))
    try:
        series = feed.read()  # the counters' baseline
        assert feed.invalid(series) == {"bad_number": 1}
        assert value(series, "queue_workers", system="sidekiq", queue="default", state="busy") == 1
        assert (
            value(series, "queue_worker_slots", system="sidekiq", queue="default", state="free")
            == 3
        )

        redis_client.set("stat:processed", "nan")
        series = feed.read()
        assert feed.invalid(series) == {"bad_number": 3}
        assert value(series, "queue_exporter_source_up", source="native:sidekiq") != 0
        assert value(series, "queue_workers", system="sidekiq", queue="default", state="busy") == 1
        assert total(series, "queue_jobs_completed_total", system="sidekiq") == 0

        redis_client.set("stat:processed", 185)
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="sidekiq") == 85
        assert feed.invalid(series) == {"bad_number": 4}  # the huge process, each read
    finally:
        feed.close()


def test_bullmq_job_times_not_numbers_cost_only_their_job(redis_client, redis_url):
    """Attack 4: job hashes whose processedOn / timestamp are "nan": the hashes are refused
    (bad_number), their completions count without times (as for a job removed on
    completion), a good job's with its exact times: the sums stay finite."""
    redis_client.hset("bull:q:meta", "opts.maxLenEvents", 10000)
    reader = BullmqReader(BullmqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        _read(reader)  # baseline
        now_ms = int(time.time() * 1000)
        jobs = {
            "good": {"timestamp": now_ms - 3000, "processedOn": now_ms - 2000},
            "nan-start": {"timestamp": now_ms - 3000, "processedOn": "nan"},
            "nan-created": {"timestamp": "nan", "processedOn": now_ms - 2000},
        }
        for job_id, fields in jobs.items():
            redis_client.hset(
                f"bull:q:{job_id}", mapping={"name": "t", "finishedOn": now_ms, **fields}
            )
            redis_client.xadd("bull:q:events", {"event": "completed", "jobId": job_id})
        signals = _read(reader)
        assert signals.tally.invalid == {"bad_number": 2}
        assert _counted(signals, "queue_jobs_completed_total") == 3
        assert _observed(signals, "queue_job_execution_seconds") == [2.0]
        assert _observed(signals, "queue_job_total_seconds") == [3.0]
    finally:
        reader.close()


# -- limits on what is read and remembered ----------------------------------------------------


def test_rq_worker_listing_300k_queues_is_bounded(redis_client, redis_url):
    """Attack 10: one worker hash listing 300,000 queues beside a real busy worker. Each read
    takes the first MAX_QUEUES_PER_WORKER of them and counts the excess once (over_limit); the
    busy worker is there in every read; a read costs little more than one without the flood."""
    redis_client.sadd("rq:workers", "rq:worker:busy", "rq:worker:flood")
    redis_client.hset("rq:worker:busy", mapping={"state": "busy", "queues": "default"})
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        _read(reader)
        plain = []
        for _ in range(5):
            started = time.perf_counter()
            _read(reader)
            plain.append(time.perf_counter() - started)
        reference = statistics.median(plain)
        flood = ",".join(f"q{index}" for index in range(300_000))
        redis_client.hset("rq:worker:flood", mapping={"state": "idle", "queues": flood})
        fetches, reads = [], []
        for _ in range(5):
            started = time.perf_counter()
            redis_client.hget("rq:worker:flood", "queues")
            fetches.append(time.perf_counter() - started)  # the flood's field alone
            started = time.perf_counter()
            signals = _read(reader)
            reads.append(time.perf_counter() - started)
            assert signals.tally.invalid == {"over_limit": 1}
            beats = signals.tally.heartbeats
            assert [b.queue for b in beats if b.worker == "busy" and b.active] == ["default"]
            assert sum(b.worker == "flood" for b in beats) == MAX_QUEUES_PER_WORKER
        # a read costs about the field's fetch (2 MB) plus a read without the flood; without
        # the limit it took 3.8 s (issue 23; bench/native_floods.py: 2.4 s against 0.03 s)
        took, fetch = statistics.median(reads), statistics.median(fetches)
        assert took < 10 * (fetch + reference), (took, fetch, reference)
    finally:
        reader.close()


def test_celery_worker_table_is_bounded(redis_client, redis_url):
    """Attack 11: heartbeats from more hostnames than MAX_WORKERS: the reader remembers
    MAX_WORKERS of them, the excess is counted once per read (over_limit); a known worker's
    heartbeat is still taken."""
    reader = CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    channel = f"/{redis_url.rsplit('/', 1)[1]}.celeryev/worker.heartbeat"
    extra = 500
    try:
        _read(reader)
        now = time.time()
        hostnames = [f"w{index}@flood" for index in range(MAX_WORKERS + extra)]
        for start in range(0, len(hostnames), 5000):
            batch = [
                {"type": "worker-heartbeat", "timestamp": now, "hostname": name, "active": 0}
                for name in hostnames[start : start + 5000]
            ]
            redis_client.publish(channel, _envelope(batch))
        signals = _read(reader)
        assert signals.tally.invalid == {"over_limit": 1}
        assert len(signals.tally.heartbeats) == MAX_WORKERS
        known = {
            "type": "worker-heartbeat",
            "timestamp": time.time(),
            "hostname": "w0@flood",
            "active": 3,
        }
        redis_client.publish(channel, _envelope(known))
        signals = _read(reader)
        assert signals.tally.invalid == {}
        assert [b.active for b in signals.tally.heartbeats if b.worker == "w0@flood"] == [3]
    finally:
        reader.close()


def test_celery_unacked_flood_is_read_up_to_its_limit(redis_client, redis_url):
    """Issue 23 (the unacked hash): kombu's `unacked` flooded with 200,000 entries. Each read
    takes MAX_UNACKED of them (HSCAN, UNACKED_SCAN a call) as pending depth and counts the
    excess once (over_limit); the reader stays up, 100 good events beside the flood are
    counted, and the process's peak RSS stays within 1.3x of a read of a handful of entries."""
    message = {"headers": {"id": "t"}, "body": "x" * 200, "properties": {}}
    redis_client.hset("unacked", "good", json.dumps([message, "", "q1"]))
    reader = CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    try:
        _reset_rss_peak()
        signals = _read(reader)  # subscribed; the handful read
        idle = _rss_peak()
        assert signals.tally.invalid == {}
        # written by Redis itself: the test's own process stays as it was at the idle read
        entry = json.dumps([{**message, "headers": {"id": "ID"}}, "", "flood"])
        fill = "redis.call('HSET', KEYS[1], 'f' .. i, (ARGV[1]:gsub('ID', 'f' .. i)))"
        _flood(redis_client, fill, "unacked", entry)
        assert redis_client.hlen("unacked") == 200_001
        for _ in range(2):
            with _dispatcher(redis_url) as dispatcher:
                for index in range(100):
                    dispatcher.send("task-succeeded", uuid=f"g{index}", runtime=0.5)
            _reset_rss_peak()
            signals = _read(reader)
            peak = _rss_peak()
            assert signals.tally.invalid == {"over_limit": 1}
            assert _counted(signals, "queue_jobs_completed_total") == 100
            held = signals.samples.table(DEPTH).items()
            assert sum(count for labels, count in held if labels[3] == "pending") == MAX_UNACKED
            assert peak <= idle * 1.3, (peak / 2**20, idle / 2**20)
    finally:
        reader.close()


def test_rq_registry_flood_is_read_up_to_its_limit(redis_client, redis_url):
    """Issue 23 (RQ's registries): 200,000 members flooded into a finished registry between two
    reads, scored below the job the reader counted last (finishes of a shorter TTL: found by a
    count that changed below its cursor). A read takes MAX_NEW of them and remembers no more
    than MAX_REMEMBERED: the process's peak RSS stays within 1.3x of a read of empty
    registries; the reads that follow take the rest, each counted once, none refused; five
    jobs RQ itself runs afterwards (its own worker, scored by RQ) are counted exactly once, and
    a read with nothing new counts nothing."""
    queue = Queue("default", connection=redis_client)
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=redis_url))

    def completed(signals: Signals) -> float:
        return _counted(signals, "queue_jobs_completed_total")

    try:
        queue.enqueue("builtins.len", "x")
        SimpleWorker([queue], connection=redis_client).work(burst=True)  # rq:queues lists it
        _reset_rss_peak()
        _read(reader)  # the baseline
        idle = _rss_peak()
        # written by Redis itself, scored below what RQ gives a job finishing now (its
        # result_ttl ahead): a backlog of old finishes the reader has not seen
        fill = "redis.call('ZADD', KEYS[1], ARGV[1] + i / 1000, 'flood' .. i)"
        _flood(redis_client, fill, "rq:finished:default", time.time())
        _reset_rss_peak()
        signals = _read(reader)
        peak = _rss_peak()
        assert (signals.tally.invalid, completed(signals)) == ({}, MAX_NEW)
        assert peak <= idle * 1.3, (peak / 2**20, idle / 2**20)
        counted = [completed(signals)]
        while counted[-1] and len(counted) <= FLOOD // MAX_NEW + 1:
            signals = _read(reader)
            assert signals.tally.invalid == {}, len(counted)
            counted.append(completed(signals))
        assert sum(counted) == FLOOD and max(counted) == MAX_NEW, counted
        jobs = [queue.enqueue("builtins.len", "abc") for _ in range(5)]
        SimpleWorker([queue], connection=redis_client).work(burst=True)
        assert all(job.get_status() == "finished" for job in jobs)
        signals = _read(reader)
        assert signals.tally.invalid == {}
        assert completed(signals) == 5
        assert _counted(signals, "queue_jobs_started_total") == 5
        signals = _read(reader)
        assert (signals.tally.invalid, completed(signals)) == ({}, 0)
    finally:
        reader.close()


def _rss_peak() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


FLOOD, FLOOD_CHUNK = 200_000, 5_000


def _flood(client: Any, statement: str, key: str, argument: object) -> None:
    """Run `statement` for i = 1..FLOOD inside Redis, FLOOD_CHUNK a script: one script of
    200,000 writes took 6.7 s on the shared server beside busy loops, past its 5 s
    busy-reply-threshold, and every other test's client then got BUSY replies."""
    script = f"for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do {statement} end"
    for first in range(1, FLOOD + 1, FLOOD_CHUNK):
        last = min(first + FLOOD_CHUNK - 1, FLOOD)
        client.eval(script, 1, key, argument, first, last)


def _reset_rss_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def test_sql_collector_rows_are_bounded(postgres_dsn):
    """Attack 15: a collector whose query returns 1M rows reads max_rows of them, streamed (the
    rest never fetched), serves those, counts the run once as too_many_rows; the process's
    peak RSS stays within 1.3x of a run of max_rows rows alone."""
    max_rows = 10_000

    def collector(rows: int) -> dict[str, Any]:
        query = f"SELECT 'q' || i AS queue, i::float8 AS depth FROM generate_series(1, {rows}) AS i"
        values = [{"column": "depth", "metric": f"flood_depth_{rows}"}]
        return {
            "name": f"rows{rows}",
            "query": query,
            "labels": ["queue"],
            "values": values,
            "max_rows": max_rows,
        }

    config = PostgresSourceConfig.model_validate(
        {"dsn": postgres_dsn, "collectors": [collector(max_rows), collector(1_000_000)]}
    )
    telemetry = Telemetry(HealthBoard())
    reference, flood = postgres.build_sources(config, 5.0)
    try:
        _reset_rss_peak()
        assert len(reference.sample().samples) == max_rows
        idle = _rss_peak()
        for _ in range(2):
            _reset_rss_peak()
            report = flood.sample()
            peak = _rss_peak()
            apply_report(telemetry, None, flood.name, report)
            assert len(report.samples) == max_rows
            assert peak <= idle * 1.3, (peak / 2**20, idle / 2**20)
        series = parse_exposition(telemetry.render(False).decode())
        errors = "queue_exporter_source_errors_total"
        assert value(series, errors, source="postgres:rows1000000", reason="too_many_rows") == 2
        assert value(series, errors, source="postgres:rows10000", reason="too_many_rows") is None
    finally:
        reference.close()
        flood.close()
        telemetry.shutdown()


def test_sql_values_not_finite_are_refused(postgres_dsn):
    """SQL values NaN, infinite or a negative counter are refused (bad_number, counted), the
    other rows served; the render parses in both formats."""
    query = (
        "SELECT * FROM (VALUES ('a', 1::numeric, 1::float8), ('b', 'NaN'::numeric, 2), "
        "('c', 3, 'Infinity'::float8), ('d', -4, 4)) AS t(queue, depth, done)"
    )
    values = [
        {"column": "depth", "metric": "sql_depth"},
        {"column": "done", "metric": "sql_done_total", "type": "counter"},
    ]
    collector = {"name": "odd", "query": query, "labels": ["queue"], "values": values}
    config = PostgresSourceConfig.model_validate({"dsn": postgres_dsn, "collectors": [collector]})
    telemetry = Telemetry(HealthBoard())
    (source,) = postgres.build_sources(config, 5.0)
    try:
        apply_report(telemetry, None, source.name, source.sample())
        series = _rendered(telemetry)
        assert {
            dict(labels)["queue"]: v for (name, labels), v in series.items() if name == "sql_depth"
        } == {
            "a": 1.0,
            "c": 3.0,
            "d": -4.0,
        }
        assert {
            dict(labels)["queue"]: v
            for (name, labels), v in series.items()
            if name == "sql_done_total"
        } == {
            "a": 1.0,
            "b": 2.0,
            "d": 4.0,
        }
        errors = "queue_exporter_source_errors_total"
        assert value(series, errors, source="postgres:odd", reason="bad_number") == 2
    finally:
        source.close()
        telemetry.shutdown()


# -- warnings and tracebacks ------------------------------------------------------------------


def test_refused_records_are_logged_rate_limited(redis_client, redis_url, caplog):
    """Attack 17: 2,000 events that each raise inside the per-record guard: each counted,
    the log names the first and holds back the rest (no traceback per event)."""
    reader = CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    channel = f"/{redis_url.rsplit('/', 1)[1]}.celeryev/task.multi"
    try:
        _read(reader)
        batch = [
            {"type": "task-succeeded", "uuid": str(uuid.uuid4()), "timestamp": "garbage"}
            for _ in range(2000)
        ]
        redis_client.publish(channel, _envelope(batch))
        signals = Signals(source=f"native:{uuid.uuid4()}")  # a key no test logged before
        with caplog.at_level(logging.WARNING):
            reader.read(signals)
        assert signals.tally.invalid == {"bad_number": 2000}
        logged = [r for r in caplog.records if r.name.startswith("exporter.sources.readers")]
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert all(record.exc_info is None for record in logged)
    finally:
        reader.close()


def test_a_read_past_its_deadline_stops_between_records(redis_client, redis_url):
    """A read past its deadline stops between two records and fails as `timeout` (the
    watchdog can sever sockets, not stop a CPU loop); the next read within its deadline reads
    everything."""
    _sidekiq_processes(redis_client, 2000, queues=1)
    reader = SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        spent = ReadDeadline(wall=0.0, cpu=0.0)  # already spent: the first record stops
        with pytest.raises(ReaderError) as stopped:
            reader.read(Signals(deadline=spent))
        assert stopped.value.reason == "timeout"
        assert _read(reader).tally.invalid == {}
    finally:
        reader.close()


def test_a_read_busy_on_cpu_stops_once_it_has_spent_its_deadline(redis_client, redis_url):
    """Records that keep a read busy on CPU: it stops once it has spent its deadline on CPU (it
    stopped at twice the deadline in wall time before), and fails as `timeout`. The reference
    is a whole read's CPU time, measured here; the reads get a quarter of it."""
    _sidekiq_processes(redis_client, 2000, queues=100)
    connection = RedisConnectionConfig(url=redis_url)
    reader = SidekiqReader(SidekiqReaderConfig(), connection)
    feed = None
    try:
        whole, _ = _cpu_and_wall(lambda: reader.read(Signals()))
        started = time.thread_time()
        budget = ReadDeadline.starting_now(whole / 4)
        with pytest.raises(ReaderError) as stopped:
            reader.read(Signals(deadline=budget))
        spent = time.thread_time() - started
        assert stopped.value.reason == "timeout"
        assert whole / 4 <= spent < whole / 2
        # As the exporter runs it: the deadline is the interval.
        feed = _Feed(lambda: SidekiqReader(SidekiqReaderConfig(), connection), whole / 4)
        with pytest.raises(ReaderError) as stopped:
            feed.source.sample()
        assert stopped.value.reason == "timeout"
    finally:
        reader.close()
        if feed is not None:
            feed.close()


def test_a_read_slowed_by_the_host_is_not_stopped(redis_client, redis_url):
    """A healthy read made slow by what the host runs beside it (here two threads keeping the
    GIL busy, as a loaded host keeps the cores) outlasts its deadline in wall time, not on CPU:
    it reads everything."""
    _sidekiq_processes(redis_client, 2000, queues=100)
    reader = SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        whole, _ = _cpu_and_wall(lambda: reader.read(Signals()))
        # The same read's CPU grows on a loaded host (1.5x its quiet CPU was once spent beside
        # two busy loops); four spinning threads leave it about a fifth of the GIL, so its
        # wall time passes 2.5x its CPU whatever the host does.
        budget = whole * 2.5
        signals = Signals(deadline=ReadDeadline.starting_now(budget))
        with _busy_threads(4):
            spent, took = _cpu_and_wall(lambda: reader.read(signals))
        assert took > budget, "the read was not slowed past its deadline: nothing was tested"
        assert spent < budget
        assert len(signals.tally.heartbeats) == 2000 * 100
    finally:
        reader.close()


def _sidekiq_processes(redis_client, count: int, queues: int) -> None:
    """`count` Sidekiq processes, each serving `queues` queues."""
    redis_client.sadd("processes", *[f"p{index}" for index in range(count)])
    info = json.dumps({"concurrency": 1, "queues": [f"q{index}" for index in range(queues)]})
    pipe = redis_client.pipeline(transaction=False)
    for index in range(count):
        pipe.hset(f"p{index}", mapping={"info": info, "busy": "0"})
    pipe.execute()


def _cpu_and_wall(work: Callable[[], object]) -> tuple[float, float]:
    """The CPU time of the calling thread and the wall time `work` took."""
    cpu, wall = time.thread_time(), time.monotonic()
    work()
    return time.thread_time() - cpu, time.monotonic() - wall


@contextmanager
def _busy_threads(count: int) -> Iterator[None]:
    """Threads spinning in Python while the block runs: they hold the GIL turn about."""
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            pass

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        done.set()
        for thread in threads:
            thread.join()


def test_the_renderer_survives_any_stored_value():
    """Stored values of every kind: the render never fails and parses back (the property test
    of the store lives in tests/output/test_store_values.py; this is the example of attack 1)."""
    from exporter.output.catalog import BY_NAME
    from exporter.output.samples import SampleSet

    telemetry = Telemetry(HealthBoard())
    samples = SampleSet()
    for index, number in enumerate((10**400, -(10**400), NAN, math.inf, 10**5000)):
        samples.add_labelled(BY_NAME["queue_depth"], ("s", f"q{index}", "", "pending"), number)
    telemetry.publish("any", samples)
    series = _rendered(telemetry)
    assert value(series, "queue_depth", queue="q0") == math.inf
    telemetry.shutdown()


def test_workers_refused_are_counted_once_per_name_not_per_read():
    """The worker registry full (or a queue without room): each refused name is counted once,
    however many reads report it again (issue 23: the overflow counter re-counted the same
    names every read)."""
    from exporter.lifecycle.metrics import Heartbeat

    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, {})
    workers = metrics.worker_registry(timeout=60.0, max_workers=2)
    now = time.time()
    beats = [Heartbeat("app", "q", f"w{index}", 0, 1, now) for index in range(5)]
    assert workers.record(beats, lambda _: True) == 3
    assert workers.record(beats, lambda _: True) == 0  # the same names: not again
    assert workers.record([Heartbeat("app", "q", "w9", 0, 1, now)], lambda _: True) == 1
    telemetry.shutdown()


def test_worker_sets_beyond_the_limit_are_cut_and_counted_once(redis_client, redis_url):
    """A Sidekiq `processes` set (and RQ's `rq:workers`) naming more than MAX_WORKERS
    identities: the first MAX_WORKERS are read, the excess counted once per read."""
    redis_client.sadd("processes", *[f"p{index:06d}" for index in range(MAX_WORKERS + 50)])
    info = {"concurrency": 2, "queues": ["default"]}
    redis_client.hset("p000000", mapping={"info": json.dumps(info), "busy": "1"})
    reader = SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        for _ in range(2):
            signals = _read(reader)
            assert signals.tally.invalid == {"over_limit": 1}
            assert [beat.worker for beat in signals.tally.heartbeats] == ["p000000"]
    finally:
        reader.close()


def test_bullmq_stored_positions_of_any_shape_start_afresh(redis_client, redis_url):
    """The positions the BullMQ reader stores (its own key, writable by anyone with the
    exporter's Redis rights) nested 100k deep, or with an infinite count: the reader starts
    afresh (a baseline) instead of failing every read."""
    config = BullmqReaderConfig()
    redis_client.hset("bull:q:meta", "opts.maxLenEvents", 10000)
    for stored in (_deep(), json.dumps({"q": ["0-0", float("inf")]}).encode()):
        redis_client.set(config.positions_key, stored)
        reader = BullmqReader(config, RedisConnectionConfig(url=redis_url))
        try:
            _read(reader)  # a baseline, stored anew
            redis_client.xadd("bull:q:events", {"event": "completed", "jobId": "1"})
            assert _counted(_read(reader), "queue_jobs_completed_total") == 1
        finally:
            reader.close()
