"""Each native reader meets arbitrary records beside good ones, against real Redis (Hypothesis).

Arbitrary: deep nesting, integers of hundreds of digits, NaN and infinities, wrong types,
times a year ahead, garbage text, in every field a reader reads. Whatever they hold, the read
succeeds (the reader stays up), every good record is counted exactly once with its exact
times, and the render of what was stored parses back in both formats. The good records are
Celery's own events (its EventDispatcher) or, for RQ, BullMQ, Bull, SAQ, Sidekiq and Resque, records in the
layouts their sources write (the field names and formats of the seed documents and of
tests/test_native_*.py, which check them against the real libraries).

Derandomized, with few examples each: every test takes a few seconds.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bull import BullReader
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    BullReaderConfig,
    CeleryReaderConfig,
    ResqueReaderConfig,
    RqReaderConfig,
    SaqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import NativeSource
from exporter.sources.readers.resque import ResqueReader
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.saq import SaqReader
from exporter.sources.readers.sidekiq import SidekiqReader
from exporter.sources.runner import apply_report
from exporter.sources.streams.config import EventsSourceConfig
from tests import claims
from tests.conftest import Series, parse_exposition, total
from tests.sources.readers.test_native_trust import _deep, _dispatcher, _envelope

YEAR = 365 * 86_400.0
NOW = time.time()  # the good times near it: most hostile records differ in one field only
FUZZ = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    # no shrinking: an example costs Redis round trips, a shrink hundreds of them
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Numbers no sample may take, and values of the wrong type.
_numbers = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(time.time() + YEAR),
    st.sampled_from([10**400, -1, -1000.5, 0, True, None]),
)
_json = st.recursive(
    st.none() | st.booleans() | _numbers | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
_texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["nan", "inf", "-inf", "-1", "1e400", "", "9" * 400, "x"]),
    _numbers.map(str),
    _json.map(json.dumps),
    st.just(_deep(20_000).decode()),
)


def _fields(record: dict[str, Any]) -> dict[str, str | int | float]:
    """A record as Redis hash or stream fields: what is not a string or number, as JSON."""
    return {
        key: value
        if isinstance(value, str | int | float) and not isinstance(value, bool)
        else json.dumps(value)
        for key, value in record.items()
    }


class _Feed:
    """A reader run as the exporter runs it; each read's series rendered and parsed."""

    def __init__(self, make_reader: Any) -> None:
        self.telemetry = Telemetry(HealthBoard())
        self.metrics = EventMetrics(self.telemetry, EventsSourceConfig().buckets())
        self.source = NativeSource(make_reader, 2.0, self.metrics)

    def read(self) -> Series:
        report = self.source.sample()  # never raises
        apply_report(self.telemetry, self.metrics, self.source.name, report)
        assert self.telemetry.store.dropped_values == 0  # the reader refused every bad value
        assert list(parse_openmetrics(self.telemetry.render(True).decode()))
        return parse_exposition(self.telemetry.render(False).decode())

    def close(self) -> None:
        self.source.close()
        self.telemetry.shutdown()


# -- Celery -------------------------------------------------------------------------------------

_hostile = st.one_of(_numbers, _numbers, _json, _texts)  # numbers first: what samples take


def _one_bad(*templates: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A good record with one field (or one more) holding anything: the bad value is then
    all that can refuse it."""

    def spoil(template: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        field = st.sampled_from([*template, "extra"])
        return st.tuples(field, _hostile).map(lambda bad: {**template, bad[0]: bad[1]})

    return st.sampled_from(templates).flatmap(spoil)


_celery_event = st.one_of(
    _one_bad(
        {"type": "worker-heartbeat", "timestamp": NOW, "hostname": "h@x", "active": 1},
        {"type": "task-received", "timestamp": NOW, "uuid": "h-1", "name": "x", "retries": 0},
        {"type": "task-started", "timestamp": NOW, "uuid": "h-1", "hostname": "h@x"},
        {"type": "task-succeeded", "timestamp": NOW, "uuid": "h-1", "runtime": 0.5},
        {"type": "task-failed", "timestamp": NOW, "uuid": "h-2", "exception": "E()"},
        {"type": "task-sent", "timestamp": NOW, "uuid": "h-2", "queue": "q"},
    ),
    st.dictionaries(st.sampled_from(["type", "timestamp", "uuid", "hostname"]), _hostile),
)
# Messages that are no single event: batches, any JSON, no JSON, nesting 100k deep.
_celery_garbage = st.one_of(
    st.lists(_celery_event | _json, max_size=4).map(_envelope),
    _json.map(_envelope),
    st.binary(max_size=40),
    st.just(_envelope(_deep())),
)
_celery_message = _celery_event.map(_envelope) | _celery_garbage


@FUZZ
@given(
    hostile=st.lists(_celery_event.map(_envelope), min_size=10, max_size=30),
    garbage=st.lists(_celery_garbage, max_size=2),
    good=st.integers(1, 4),
)
def test_celery_counts_every_good_event_whatever_else_arrives(
    redis_client, redis_url, hostile, garbage, good
):
    feed = _Feed(
        lambda: CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    )
    channel = f"/{redis_url.rsplit('/', 1)[1]}.celeryev/task.multi"
    try:
        feed.read()  # subscribed
        with _dispatcher(redis_url) as dispatcher:
            for index in range(good):
                task = f"good-{index}"
                dispatcher.send("task-received", uuid=task, name="good.task")
                redis_client.publish(channel, hostile[index % len(hostile)])
                dispatcher.send("task-succeeded", uuid=task, runtime=0.25)
            for message in hostile + garbage:
                redis_client.publish(channel, message)
        series = feed.read()
        job = {"system": "celery", "job_type": "good.task"}
        assert total(series, "queue_jobs_completed_total", **job) == good
        assert total(series, "queue_job_execution_seconds_count", **job) == good
        assert total(series, "queue_job_execution_seconds_sum", **job) == good * 0.25
    finally:
        feed.close()


# -- RQ -----------------------------------------------------------------------------------------


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_rq_job = _one_bad(
    {
        "description": "h.task(1)",
        "enqueued_at": _iso(NOW - 5),
        "started_at": _iso(NOW - 2),
        "ended_at": _iso(NOW - 1),
        "status": "finished",
        "exc_info": "",
    }
)
_rq_worker = st.fixed_dictionaries({}, optional={"state": _texts, "queues": _texts})


@FUZZ
@given(
    jobs=st.lists(_rq_job, min_size=2, max_size=6),
    workers=st.lists(_rq_worker, max_size=3),
    good=st.integers(1, 3),
)
def test_rq_counts_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, jobs, workers, good
):
    claims.flush_keeping_claim(redis_client)
    redis_client.sadd("rq:queues", "rq:queue:default")
    redis_client.sadd("rq:workers", "rq:worker:good")
    redis_client.hset("rq:worker:good", mapping={"state": "busy", "queues": "default"})
    feed = _Feed(lambda: RqReader(RqReaderConfig(), RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        now = time.time()
        for index, fields in enumerate(jobs):
            if fields:
                redis_client.hset(f"rq:job:h{index}", mapping=_fields(fields))
            redis_client.zadd("rq:finished:default", {f"h{index}": now})
        for index, fields in enumerate(workers):
            redis_client.sadd("rq:workers", f"rq:worker:h{index}")
            if fields:
                redis_client.hset(f"rq:worker:h{index}", mapping=_fields(fields))
        for index in range(good):
            times = {
                "enqueued_at": _iso(now - 3),
                "started_at": _iso(now - 2),
                "ended_at": _iso(now - 1),
            }
            redis_client.hset(f"rq:job:g{index}", mapping={"description": "good.task(1)", **times})
            redis_client.zadd("rq:finished:default", {f"g{index}": now})
        series = feed.read()
        job = {"system": "rq", "job_type": "good.task"}
        assert total(series, "queue_jobs_completed_total", **job) == good
        assert total(series, "queue_job_execution_seconds_sum", **job) == good * 1.0
        assert total(series, "queue_workers", system="rq", queue="default", state="busy") >= 1
    finally:
        feed.close()


# -- Sidekiq ------------------------------------------------------------------------------------

_process_info = st.one_of(
    _texts,
    st.fixed_dictionaries(
        {}, optional={"concurrency": _numbers | _json, "queues": _json, "hostname": _json}
    ).map(json.dumps),
)
_process = st.fixed_dictionaries({}, optional={"info": _process_info, "busy": _texts})


@FUZZ
@given(
    processes=st.lists(_process, min_size=1, max_size=4),
    stat=st.sampled_from(["nan", "inf", "-1", "1e400", "x", "9" * 400, "-inf"]),
    done=st.integers(1, 50),
)
def test_sidekiq_counts_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, processes, stat, done
):
    claims.flush_keeping_claim(redis_client)
    redis_client.sadd("processes", "good:1")
    info = {"concurrency": 4, "queues": ["default"], "hostname": "good"}
    redis_client.hset("good:1", mapping={"info": json.dumps(info), "busy": "1"})
    for index, fields in enumerate(processes):
        redis_client.sadd("processes", f"h{index}")
        if fields:
            redis_client.hset(f"h{index}", mapping=_fields(fields))
    redis_client.mset({"stat:processed": 1000, "stat:failed": 10})
    feed = _Feed(lambda: SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        redis_client.set("stat:processed", stat)  # for one read
        series = feed.read()
        assert total(series, "queue_workers", system="sidekiq", queue="default", state="busy") >= 1
        redis_client.set("stat:processed", 1000 + done)
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="sidekiq") == done
        assert total(series, "queue_workers", system="sidekiq", queue="default", state="busy") >= 1
    finally:
        feed.close()


# -- Resque -------------------------------------------------------------------------------------

# node-resque's record of the job a worker runs (tests/conformance/ checks it against the library)
_RESQUE_JOB = {
    "run_at": datetime.fromtimestamp(NOW - 30, UTC).strftime("%a %b %d %Y %H:%M:%S GMT+0000"),
    "queue": "default",
    "worker": "good:1",
    "payload": {"class": "ok", "queue": "default", "args": []},
}
_resque_record = st.one_of(_one_bad(_RESQUE_JOB), _texts)


@FUZZ
@given(
    records=st.lists(_resque_record, min_size=1, max_size=4),
    stat=st.sampled_from(["nan", "inf", "-1", "1e400", "x", "9" * 400, "-inf"]),
    done=st.integers(1, 50),
)
def test_resque_counts_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, records, stat, done
):
    claims.flush_keeping_claim(redis_client)
    redis_client.sadd("resque:queues", "default")
    redis_client.sadd("resque:workers", "good:1:default")
    redis_client.set("resque:worker:good:1:default", json.dumps(_RESQUE_JOB))
    for index, record in enumerate(records):
        worker_id = f"h:{index}:default"
        redis_client.sadd("resque:workers", worker_id)
        text = record if isinstance(record, str) else json.dumps(record)
        redis_client.set(f"resque:worker:{worker_id}", text)
    redis_client.mset({"resque:stat:processed": 1000, "resque:stat:failed": 10})
    config = ResqueReaderConfig()
    feed = _Feed(lambda: ResqueReader(config, RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        redis_client.set("resque:stat:processed", stat)  # for one read
        series = feed.read()
        assert total(series, "queue_workers", system="resque", queue="default", state="busy") >= 1
        redis_client.set("resque:stat:processed", 1000 + done)
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="resque") == done
        assert total(series, "queue_workers", system="resque", queue="default", state="busy") >= 1
        assert total(series, "queue_depth", system="resque", queue="default", state="active") >= 1
    finally:
        feed.close()


def test_resque_counts_nothing_for_a_counter_s_dip_and_counts_from_zero_after_a_reset(
    redis_client, redis_url
):
    """node-resque's retry plugin decrements stat:processed for a moment (its worker increments
    it again): a read in between counts nothing, nor the increment that takes the dip back; a
    counter down by more than one per listed worker was reset, and counts from zero."""
    claims.flush_keeping_claim(redis_client)
    redis_client.mset({"resque:stat:processed": 1000, "resque:stat:failed": 10})
    redis_client.sadd("resque:workers", "host:1:default", "host:2:default")
    config = ResqueReaderConfig()
    feed = _Feed(lambda: ResqueReader(config, RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        redis_client.mset({"resque:stat:processed": 998, "resque:stat:failed": 12})
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="resque") == 0
        assert total(series, "queue_jobs_failed_total", system="resque") == 2
        redis_client.set("resque:stat:processed", 1003)  # the dips taken back, and three more
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="resque") == 3
        redis_client.set("resque:stat:processed", 5)  # Resque::Stat.clear, then five jobs
        series = feed.read()
        assert total(series, "queue_jobs_completed_total", system="resque") == 8
    finally:
        feed.close()


# -- BullMQ -------------------------------------------------------------------------------------

_bull_entry = _one_bad(
    {"event": "completed", "jobId": "h0"},
    {"event": "failed", "jobId": "h1", "failedReason": "x"},
    {"event": "active", "jobId": "h0", "prev": "waiting"},
    {"event": "delayed", "jobId": "h1", "delay": str(int(NOW * 1000) + 5000)},
    {"event": "waiting", "jobId": "h2", "prev": "active"},
    {"event": "added", "jobId": "h2", "name": "h"},
)
_BULL_NOW = int(NOW * 1000)
_bull_job = _one_bad(
    {
        "name": "h",
        "timestamp": _BULL_NOW - 3000,
        "delay": 0,
        "processedOn": _BULL_NOW - 2000,
        "finishedOn": _BULL_NOW - 1000,
        "atm": 1,
    }
)


@FUZZ
@given(
    entries=st.lists(_bull_entry, min_size=3, max_size=8),
    jobs=st.lists(_bull_job, min_size=3, max_size=3),
    good=st.integers(1, 3),
)
def test_bullmq_counts_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, entries, jobs, good
):
    claims.flush_keeping_claim(redis_client)
    redis_client.hset("bull:q:meta", "opts.maxLenEvents", 10000)
    feed = _Feed(lambda: BullmqReader(BullmqReaderConfig(), RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        for index, fields in enumerate(jobs):
            if fields:
                redis_client.hset(f"bull:q:h{index}", mapping=_fields(fields))
        now_ms = int(time.time() * 1000)
        for index in range(good):
            times = {
                "timestamp": now_ms - 3000,
                "processedOn": now_ms - 2000,
                "finishedOn": now_ms - 500,
            }
            redis_client.hset(f"bull:q:g{index}", mapping={"name": "good", "atm": 1, **times})
        for index in range(max(good, len(entries))):
            if index < len(entries):
                redis_client.xadd("bull:q:events", _fields(entries[index]))
            if index < good:
                redis_client.xadd("bull:q:events", {"event": "completed", "jobId": f"g{index}"})
        series = feed.read()
        job = {"system": "bullmq", "job_type": "good"}
        assert total(series, "queue_jobs_completed_total", **job) == good
        assert total(series, "queue_job_execution_seconds_sum", **job) == good * 1.5
    finally:
        feed.close()


# -- Bull (the bull package) ---------------------------------------------------------------------

_bull3_job = st.one_of(
    st.none(),  # a finished id whose hash is gone
    st.just("list"),  # a hash of another type
    _one_bad(
        {
            "name": "h",
            "timestamp": _BULL_NOW - 3000,
            "delay": 0,
            "processedOn": _BULL_NOW - 2000,
            "finishedOn": _BULL_NOW - 1000,
            "attemptsMade": 1,
            "failedReason": "boom",
        }
    ),
)


@FUZZ
@given(
    jobs=st.lists(_bull3_job, min_size=3, max_size=6),
    scores=st.lists(st.floats(allow_nan=False) | st.sampled_from([0, -1, 1e300]), max_size=3),
    good=st.integers(1, 3),
)
def test_bull_counts_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, jobs, scores, good
):
    claims.flush_keeping_claim(redis_client)
    redis_client.set("bull:q:id", 0)
    redis_client.set("bull:other:id", 0)
    redis_client.set("bull:other:failed", "not a zset")
    feed = _Feed(lambda: BullReader(BullReaderConfig(), RedisConnectionConfig(url=redis_url)))
    try:
        feed.read()  # the baseline
        now_ms = int(time.time() * 1000)
        for index, fields in enumerate(jobs):
            if fields == "list":
                redis_client.rpush(f"bull:q:h{index}", "not a hash")
            elif fields:
                redis_client.hset(f"bull:q:h{index}", mapping=_fields(fields))
            redis_client.zadd(f"bull:q:{'failed' if index % 2 else 'completed'}",
                              {f"h{index}": now_ms})  # fmt: skip
        for index, score in enumerate(scores):  # members of any score, no hash
            redis_client.zadd("bull:q:completed", {f"s{index}": score})
        for index in range(good):
            times = {"timestamp": now_ms - 3000, "processedOn": now_ms - 2000, "finishedOn": now_ms}
            redis_client.hset(
                f"bull:q:g{index}", mapping={"name": "good", "attemptsMade": 1, **times}
            )
            redis_client.zadd("bull:q:completed", {f"g{index}": now_ms})
        job = {"system": "bull", "queue": "q", "job_type": "good"}
        for read in (1, 2):  # whatever was scored before, the next jobs are counted too
            if read == 2:
                for index in range(good):
                    redis_client.hset(f"bull:q:n{index}", mapping={"name": "good", **times})
                    redis_client.zadd("bull:q:completed", {f"n{index}": now_ms + 1})
            series = feed.read()
            assert total(series, "queue_jobs_completed_total", **job) == good * read
            assert total(series, "queue_jobs_retried_total", **job) == good
            assert total(series, "queue_job_execution_seconds_sum", **job) == good * 2.0 * read
    finally:
        feed.close()


# -- SAQ's finished jobs -------------------------------------------------------------------------


def _saq_job(now_ms: int, **fields: Any) -> dict[str, Any]:
    """A finished job as SAQ keeps it (times in ms): 1.5 s run, 1 s waited."""
    times = {"queued": now_ms - 3000, "started": now_ms - 2000, "completed": now_ms - 500}
    return {"function": "good", "queue": "q", "status": "complete", "attempts": 1, **times,
            **fields}  # fmt: skip


def _saq_worker_counted(client: Any, complete: int) -> None:
    """A live worker's record as SAQ's Queue.worker_info writes it, having counted `complete`
    jobs."""
    key = "saq:q:worker_info:w"
    client.zadd("saq:q:stats", {key: int(time.time() * 1000) + 600_000})
    stats = {"complete": complete, "failed": 0, "retried": 0, "aborted": 0, "uptime": 1}
    client.set(key, json.dumps({"stats": stats, "queue_key": "q", "metadata": None}))


_saq_record = st.one_of(
    st.just("list"),  # a job of another type
    st.just("x" * (2 << 20)),  # huge
    _texts,  # not JSON, or JSON of anything
    _one_bad(_saq_job(_BULL_NOW, function="h")),
    _one_bad(_saq_job(_BULL_NOW, function="h", status="failed", attempts=2, scheduled=int(NOW))),
)


@FUZZ
@given(records=st.lists(_saq_record, min_size=3, max_size=6), good=st.integers(1, 3))
def test_saq_observes_every_good_job_whatever_else_is_recorded(
    redis_client, redis_url, records, good
):
    claims.flush_keeping_claim(redis_client)
    redis_client.zadd("saq:q:incomplete", {"saq:job:q:waiting": 0})
    redis_client.set("saq:job:q:waiting", "not read: it is not finished")
    redis_client.set("saq:other:incomplete", "a queue's zset of another type")
    redis_client.set("saq:job:other:x", "{}")
    config = SaqReaderConfig(queues=["q"])
    feed = _Feed(lambda: SaqReader(config, RedisConnectionConfig(url=redis_url)))
    try:
        _saq_worker_counted(redis_client, 0)
        feed.read()  # the baseline
        for index, record in enumerate(records):
            key = f"saq:job:q:h{index}"
            if record == "list":
                redis_client.rpush(key, "not a job")
            else:
                text = record if isinstance(record, str) else json.dumps(record)
                redis_client.set(key, text, ex=600)
            redis_client.publish(key, "complete")  # announced as SAQ's notify() does
        job = {"system": "saq", "queue": "q", "job_type": "good"}
        for read in (1, 2):  # the next good jobs are observed too, none twice
            now_ms = int(time.time() * 1000)
            for index in range(good):
                key = f"saq:job:q:g{read}-{index}"
                redis_client.set(key, json.dumps(_saq_job(now_ms)), ex=600)
                redis_client.publish(key, "complete")
            _saq_worker_counted(redis_client, read * (len(records) + good))
            series = feed.read()
            assert total(series, "queue_job_execution_seconds_count", **job) == good * read
            assert total(series, "queue_job_execution_seconds_sum", **job) == good * 1.5 * read
            assert total(series, "queue_job_wait_seconds_sum", **job) == good * 1.0 * read
    finally:
        feed.close()
