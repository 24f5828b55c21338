"""Record times and execution times, held to one rule in every native reader (issue 40).

Every time a reader takes from a record passes numbers.epoch, as a v1 event's does: one
before 1970 is refused (`bad_value`), one further ahead than the clock skew tolerated
(`future_time`); an execution time below zero (a start after the end, on the worker's one
clock) is refused as `negative_duration`, as a v1 event's `duration` is. Each refusal is
counted (queue_exporter_events_invalid_total) and costs its job's event alone. Before, Bull
and BullMQ counted a negative execution time as 0 s, Bull a start before 1970 as a 57-year
run, RQ a negative one as 0 s, and Celery left a negative one out silently.

Bull's and BullMQ's records are written in the layout their docs give (as in
test_native_trust.py); RQ's jobs are run by RQ's own worker and Celery's events sent by its
own EventDispatcher, then the one time under test changed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from rq import Queue, SimpleWorker

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bull import BullReader
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    BullReaderConfig,
    CeleryReaderConfig,
    RqReaderConfig,
)
from exporter.sources.readers.framework import Reader, Signals
from exporter.sources.readers.rq import RqReader
from tests.conftest import total
from tests.sources.readers.test_native_trust import _dispatcher, _Feed

BEFORE_1970_MS = -5_000
DAY_MS = 86_400_000


def _read(reader: Reader) -> Signals:
    signals = Signals()
    reader.read(signals)
    return signals


def _counted(signals: Signals, metric: str) -> float:
    return sum(count for (name, _), count in signals.tally.counts.items() if name == metric)


def _observed(signals: Signals, metric: str) -> list[float]:
    observations = signals.tally.observations.items()
    return [v for (name, _), values in observations if name == metric for v in values]


def _jobs(now_ms: int) -> dict[str, dict[str, int]]:
    """Finished jobs' times (ms): a sound one (2 s run), then one wrong time each."""
    sound = {"timestamp": now_ms - 3000, "processedOn": now_ms - 2000, "finishedOn": now_ms}
    return {
        "sound": sound,
        "negative": {**sound, "processedOn": now_ms, "finishedOn": now_ms - 1000},
        "started-before-1970": {**sound, "processedOn": BEFORE_1970_MS},
        "finished-a-day-ahead": {**sound, "finishedOn": now_ms + DAY_MS},
    }


def test_bull_refuses_times_before_1970_or_ahead_and_negative_runs(redis_client, redis_url):
    redis_client.set("bull:q:id", 0)
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=redis_url))
    try:
        _read(reader)  # the baseline
        now_ms = int(time.time() * 1000)
        for job_id, times in _jobs(now_ms).items():
            fields = {"name": "t", "attemptsMade": 0, **times}
            redis_client.hset(f"bull:q:{job_id}", mapping=fields)
            redis_client.zadd("bull:q:completed", {job_id: now_ms})  # scored as Bull does
        signals = _read(reader)
        assert signals.tally.invalid == {"negative_duration": 1, "bad_value": 1, "future_time": 1}
        assert _counted(signals, "queue_jobs_completed_total") == 1  # a refused time: its job
        assert _observed(signals, "queue_job_execution_seconds") == [2.0]
    finally:
        reader.close()


def test_bullmq_refuses_times_before_1970_or_ahead_and_negative_runs(redis_client, redis_url):
    """A job hash with a time refused is counted without times (as one removed on
    completion); a negative run refuses its event."""
    redis_client.hset("bull:q:meta", "opts.maxLenEvents", 10000)
    reader = BullmqReader(BullmqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        _read(reader)  # the baseline
        for job_id, times in _jobs(int(time.time() * 1000)).items():
            redis_client.hset(f"bull:q:{job_id}", mapping={"name": "t", **times})
            redis_client.xadd("bull:q:events", {"event": "completed", "jobId": job_id})
        signals = _read(reader)
        assert signals.tally.invalid == {"negative_duration": 1, "bad_value": 1, "future_time": 1}
        assert _counted(signals, "queue_jobs_completed_total") == 3
        assert _observed(signals, "queue_job_execution_seconds") == [2.0]
    finally:
        reader.close()


def _rq_time(epoch: float) -> str:
    """A time as RQ writes it (utcformat)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_rq_refuses_a_start_before_1970_and_a_negative_run(redis_client, redis_url):
    queue = Queue("default", connection=redis_client)
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=redis_url))
    try:
        queue.enqueue("builtins.len", "x")
        SimpleWorker([queue], connection=redis_client).work(burst=True)  # rq:queues lists it
        _read(reader)  # the baseline
        sound, negative, early = (queue.enqueue("builtins.len", "abc") for _ in range(3))
        SimpleWorker([queue], connection=redis_client).work(burst=True)
        ended = datetime.fromisoformat(redis_client.hget(negative.key, "ended_at").decode())
        redis_client.hset(negative.key, "started_at", _rq_time(ended.timestamp() + 1))
        redis_client.hset(early.key, "started_at", _rq_time(BEFORE_1970_MS / 1000))
        signals = _read(reader)
        # the early job's start is refused twice: as its started event's time, as its run's
        assert signals.tally.invalid == {"negative_duration": 1, "bad_value": 2}
        assert _counted(signals, "queue_jobs_completed_total") == 1
        assert _counted(signals, "queue_jobs_started_total") == 2
        assert len(_observed(signals, "queue_job_execution_seconds")) == 1
        assert sound.get_status() == "finished"
    finally:
        reader.close()


def test_celery_refuses_a_negative_run(redis_url):
    """A failure whose task started after it failed (no runtime in the event: the reader
    takes the span from task-started), beside a sound one of 2 s."""
    feed = _Feed(
        lambda: CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), 2.0)
    )
    try:
        feed.read()  # subscribed
        now = time.time()
        with _dispatcher(redis_url) as dispatcher:
            dispatcher.send("task-started", uuid="sound", timestamp=now - 2)
            dispatcher.send("task-failed", uuid="sound", timestamp=now, exception="boom")
            dispatcher.send("task-started", uuid="negative", timestamp=now)
            dispatcher.send("task-failed", uuid="negative", timestamp=now - 1, exception="boom")
        series = feed.read()
        assert feed.invalid(series) == {"negative_duration": 1}
        assert total(series, "queue_jobs_failed_total", system="celery") == 1
        assert total(series, "queue_job_execution_seconds_sum", system="celery") == 2.0
    finally:
        feed.close()
