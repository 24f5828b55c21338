"""Runner-Q's native {q}:events_stream, written exactly as runner_q_redis writes it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer
from tests.conftest import parse_exposition, scrape_series, value, wait_for

STREAM = "default:events_stream"


def _serde(epoch: float) -> str:
    """chrono's serde form of DateTime<Utc> (in the event JSON): nanoseconds and Z."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def _rfc3339(epoch: float) -> str:
    """chrono's to_rfc3339() (in the activity hash): nanoseconds and +00:00."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123+00:00"


class RunnerQ:
    """The writes of runner_q_redis/src/backend/queue.rs that matter here: write_snapshot
    (the activity:{uuid} hash) and record_event (XADD, XTRIM MAXLEN ~ 100, EXPIRE 60)."""

    def __init__(self, client, queue: str = "default") -> None:
        self.client = client
        self.queue = queue

    def new(self, activity_type: str, priority: str, created: float, **extra: Any) -> str:
        activity_id = str(uuid.uuid4())
        self.snapshot(
            activity_id,
            activity_type=activity_type,
            priority=json.dumps(priority),  # serde_json::to_string: with quotes
            status=json.dumps("Pending"),
            created_at=_rfc3339(created),
            scheduled_at="",
            started_at="",
            completed_at="",
            retry_count="0",
            max_retries=str(extra.get("max_retries", 3)),
            current_worker_id="",
            last_error="",
        )
        return activity_id

    def snapshot(self, activity_id: str, **fields: str) -> None:
        self.client.hset(f"activity:{activity_id}", mapping=fields)
        self.client.expire(f"activity:{activity_id}", 7 * 86400)

    def event(
        self,
        activity_id: str,
        event_type: str,
        at: float,
        worker: str | None,
        detail: Any,
        maxlen: int = 100,
    ) -> None:
        payload = {
            "activity_id": activity_id,
            "timestamp": _serde(at),
            "event_type": event_type,
            "worker_id": worker,
        }
        if detail is not None:
            payload["detail"] = detail
        stream = f"{self.queue}:events_stream"
        self.client.xadd(stream, {"event": json.dumps(payload)})
        self.client.execute_command("XTRIM", stream, "MAXLEN", "~", maxlen)
        self.client.expire(stream, 60)


def _run_day(rq: RunnerQ, t: float) -> int:
    """Five activities through every event type; returns the number of stream entries."""
    a1 = rq.new("send_email", "High", t)
    rq.event(a1, "Enqueued", t, None, {"priority": "High", "scheduled_at": None})
    rq.snapshot(a1, status='"Running"', started_at=_rfc3339(t + 2), current_worker_id="w1")
    rq.event(a1, "Dequeued", t + 2, "w1", {"lease_deadline_ms": int((t + 62) * 1000)})
    rq.event(a1, "LeaseExtended", t + 2.5, None, {"new_deadline_ms": 1, "extend_by_ms": 1})
    rq.snapshot(a1, status='"Completed"', completed_at=_rfc3339(t + 3.5))
    rq.event(a1, "Completed", t + 3.5, "w1", {"activity_type": "send_email"})
    rq.event(a1, "ResultStored", t + 3.5, None, {"data": {"ok": True}, "state": "Ok"})

    a2 = rq.new("send_email", "Normal", t)
    rq.event(a2, "Enqueued", t, None, {"priority": "Normal", "scheduled_at": None})
    rq.snapshot(a2, status='"Running"', started_at=_rfc3339(t + 1))
    rq.event(a2, "Dequeued", t + 1, "w2", {"lease_deadline_ms": 1})
    rq.snapshot(a2, status='"Failed"', completed_at=_rfc3339(t + 1.25), last_error="bad input")
    rq.event(a2, "Failed", t + 1.25, "w2", {"retryable": False, "error": "bad input"})

    a3 = rq.new("resize_image", "Low", t, max_retries=2)
    rq.event(a3, "Enqueued", t, None, {"priority": "Low", "scheduled_at": None})
    rq.snapshot(a3, status='"Running"', started_at=_rfc3339(t + 1))
    rq.event(a3, "Dequeued", t + 1, "w1", {"lease_deadline_ms": 1})
    due = t + 3.5  # retry_delay_seconds 1 * 2^1
    rq.snapshot(a3, status='"Retrying"', retry_count="1", scheduled_at=_rfc3339(due))
    retrying = {"retry_count": 1, "scheduled_at": _serde(due), "error": "connection reset"}
    rq.event(a3, "Retrying", t + 1.5, "w1", retrying)
    rq.snapshot(a3, status='"Pending"')
    moved = {"priority": "Low", "scheduled_at": _serde(due), "from": "scheduled"}
    rq.event(a3, "Enqueued", due, None, moved)  # process_scheduled moved it back
    rq.snapshot(a3, status='"Running"', started_at=_rfc3339(t + 4))
    rq.event(a3, "Dequeued", t + 4, "w2", {"lease_deadline_ms": 1})
    rq.snapshot(a3, status='"DeadLetter"', completed_at=_rfc3339(t + 9))
    rq.event(a3, "DeadLetter", t + 9, "w2", {"error": "Activity execution timed out"})

    a4 = rq.new("report", "Critical", t)
    rq.snapshot(a4, scheduled_at=_rfc3339(t + 60))
    rq.event(a4, "Scheduled", t, None, {"scheduled_at": _serde(t + 60)})

    a5 = rq.new("cleanup", "Normal", t)
    rq.event(a5, "Enqueued", t, None, {"priority": "Normal", "scheduled_at": None})
    rq.snapshot(a5, status='"Running"', started_at=_rfc3339(t + 1))
    rq.event(a5, "Dequeued", t + 1, "w3", {"lease_deadline_ms": 1})
    rq.snapshot(a5, status='"Pending"', current_worker_id="")
    rq.event(a5, "Requeued", t + 70, None, {"reason": "lease_expired"})

    # hostile neighbours: not JSON, and an event type Runner-Q does not have
    rq.client.xadd(STREAM, {"event": "{not json"})
    rq.event(a5, "Exploded", t + 71, None, None)
    return 20


def test_runnerq_events_map_onto_the_event_families(redis_client, redis_url, run_exporter):
    app = run_exporter({"presets": ["runnerq"]}, redis_url=redis_url)
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    # One MULTI: the exporter sees the hashes as they are at the end of the day (a live
    # reader may see them mid-way; then the times it reads belong to another attempt).
    day = redis_client.pipeline(transaction=True)
    entries = _run_day(RunnerQ(day), time.time() - 100)
    day.execute()
    assert_the_day(wait_for_the_day(app, entries))


def wait_for_the_day(app, entries: int):
    """The scrape once the exporter consumed the day's entries."""
    return wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_exporter_events_total", stream=STREAM) == entries
            and s
        )
    )


def assert_the_day(series) -> None:
    """What _run_day's stream, with each activity hash as it is at the day's end, yields."""

    def job(name: str, job_type: str, priority: str, **labels: str) -> float | None:
        return value(
            series,
            name,
            system="runnerq",
            queue="default",
            job_type=job_type,
            priority=priority,
            **labels,
        )

    email_high, email_normal = ("send_email", "high"), ("send_email", "normal")
    resize, report, cleanup = ("resize_image", "low"), ("report", "critical"), ("cleanup", "normal")
    assert job("queue_jobs_enqueued_total", *email_high) == 1
    assert job("queue_jobs_enqueued_total", *email_normal) == 1
    assert job("queue_jobs_enqueued_total", *resize) == 1  # the move back from scheduled is not
    assert job("queue_jobs_enqueued_total", *cleanup) == 1
    assert value(series, "queue_scheduler_processed_total", system="runnerq") == 1
    assert job("queue_jobs_scheduled_total", *report) == 1
    assert job("queue_job_schedule_delay_seconds_sum", *report) == pytest.approx(60, abs=0.01)
    assert job("queue_jobs_dequeued_total", *resize) == 2
    assert job("queue_jobs_started_total", *email_high) == 1
    assert job("queue_jobs_completed_total", *email_high) == 1
    assert job("queue_jobs_lease_extended_total", *email_high) == 1
    assert job("queue_jobs_failed_total", *email_normal, error_type="non_retryable") == 1
    assert job("queue_jobs_failed_total", *resize, error_type="retryable") == 1
    assert job("queue_jobs_failed_total", *resize, error_type="timeout") == 1
    assert job("queue_jobs_timed_out_total", *resize) == 1
    assert job("queue_jobs_retried_total", *resize) == 1
    assert job("queue_job_retry_delay_seconds_sum", *resize) == pytest.approx(2, abs=0.01)
    assert job("queue_jobs_dead_lettered_total", *resize) == 1
    assert job("queue_jobs_max_retries_exceeded_total", *resize) == 1
    assert job("queue_jobs_requeued_total", *cleanup, reason="lease_expired") == 1
    assert value(series, "queue_dequeue_attempts_total", system="runnerq", result="hit") == 5

    def histogram(name: str, labels: tuple[str, str]) -> tuple[Any, Any]:
        return job(f"{name}_count", *labels), job(f"{name}_sum", *labels)

    approx = pytest.approx
    # wait: creation (or due time, for a retry) to dequeue
    assert histogram("queue_job_wait_seconds", email_high) == (1, approx(2, abs=0.01))
    assert histogram("queue_job_wait_seconds", resize) == (2, approx(1.5, abs=0.01))
    # execution from the hash's started_at / completed_at; the first resize attempt's start
    # was overwritten by the second by the time the hash was read: no observation for it
    assert histogram("queue_job_execution_seconds", email_high) == (1, approx(1.5, abs=0.01))
    assert histogram("queue_job_execution_seconds", email_normal) == (1, approx(0.25, abs=0.01))
    assert histogram("queue_job_execution_seconds", resize) == (1, approx(5, abs=0.01))
    assert histogram("queue_job_total_seconds", email_high) == (1, approx(3.5, abs=0.01))
    assert histogram("queue_job_total_seconds", resize) == (2, approx(10.5, abs=0.01))
    # attempts at the end: completed (1), non-retryable failure (1), dead letter (2)
    assert histogram("queue_job_attempts", email_high) == (1, 1)
    assert histogram("queue_job_attempts", email_normal) == (1, 1)
    assert histogram("queue_job_attempts", resize) == (1, 2)
    assert value(series, "queue_exporter_events_invalid_total", reason="bad_value") == 1
    assert value(series, "queue_exporter_events_invalid_total", reason="unknown_event") == 1


def _consumer(redis_url: str) -> tuple[StreamConsumer, Telemetry]:
    telemetry = Telemetry(HealthBoard())
    settings = EventsSourceConfig.model_validate(
        {"streams": [{"key": STREAM, "system": "runnerq", "format": "runnerq"}]}
    )
    metrics = EventMetrics(telemetry, settings.buckets())
    connection = RedisConnectionConfig.model_validate({"url": redis_url})
    return StreamConsumer(settings.streams[0], settings, connection, metrics), telemetry


def _totals(telemetry: Telemetry) -> tuple[float, float]:
    series = parse_exposition(telemetry.render(False).decode())
    return (
        value(series, "queue_exporter_events_total", stream=STREAM) or 0,
        value(series, "queue_exporter_events_lost_total", stream=STREAM) or 0,
    )


def _drain(consumer: StreamConsumer) -> None:
    while consumer.poll():
        pass


def test_trimmed_and_expired_runnerq_streams(redis_client, redis_url):
    rq = RunnerQ(redis_client)
    consumer, telemetry = _consumer(redis_url)
    activity = rq.new("ping", "Normal", time.time())
    rq.event(activity, "Enqueued", time.time(), None, {"priority": "Normal"})
    consumer.poll()  # the group now exists (created at $: the first entry is history)
    for _ in range(400):  # a burst while the exporter does not read: ~100 survive the trims
        rq.event(activity, "LeaseExtended", time.time(), None, {"extend_by_ms": 1})
    kept = redis_client.xlen(STREAM)
    assert kept < 400
    _drain(consumer)
    assert _totals(telemetry) == (kept, 400 - kept)

    # 60 s without events: the stream (and the group with it) expires; Runner-Q starts a new one
    redis_client.delete(STREAM)
    assert consumer.poll() == 0
    for _ in range(3):
        rq.event(activity, "LeaseExtended", time.time(), None, {"extend_by_ms": 1})
    _drain(consumer)
    assert _totals(telemetry) == (kept + 3, 400 - kept)
    consumer.close()
