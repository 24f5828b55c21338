"""End to end: the producer library emits a realistic mix, /metrics shows exact values."""

from __future__ import annotations

import logging
import time

import pytest

from exporter.lifecycle.producer import EventEmitter
from tests.conftest import scrape_series, value, wait_for

STREAM = "shop:events"
JOB = {"system": "shop", "queue": "billing", "job_type": "invoice", "priority": "high"}


def _events_config(redis_url: str, **settings: object) -> dict[str, object]:
    return {
        "sources": {
            "redis": {"url": redis_url},
            "events": {
                "streams": [{"key": STREAM, "system": "shop"}],
                "block_ms": 50,
                "stats_interval": 0.2,
                **settings,
            },
        }
    }


def _ready(app):
    """Wait for the consumer's first read: a group created at $ counts only what follows."""
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    return app


def _consumed(app, count: int):
    """The scrape once the exporter has consumed `count` events."""
    return wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_exporter_events_total", stream=STREAM) == count
            and s
        )
    )


def _emit_mix(emitter: EventEmitter, t0: float) -> int:
    """A day in the life of a queue; returns the number of events emitted."""
    job = {k: v for k, v in JOB.items() if k != "system"}
    n = 0

    def emit(event: str, **fields: object) -> None:
        nonlocal n
        emitter.emit(event, **job, **fields)  # type: ignore[arg-type]
        n += 1

    for i in range(3):  # three jobs run to completion
        emit("enqueued", ts=t0, job_id=f"ok-{i}")
        emit("dequeued", ts=t0 + 2, worker="w1")
        emit("started", ts=t0 + 2, enqueued_at=t0)
        emit("completed", ts=t0 + 3, duration=0.5, enqueued_at=t0, attempt=1)
    for error_type in ("retryable", "non_retryable", "timeout", "handler_not_found", "other"):
        emit("failed", ts=t0 + 4, duration=1.0, enqueued_at=t0, attempt=1, error_type=error_type)
    for delay in (2, 4, 8):  # retries with exponential backoff
        emit("retried", ts=t0 + 5, delay=delay)
    emit("dead_lettered", ts=t0 + 20, attempt=3)
    emit("max_retries_exceeded", ts=t0 + 20)
    emit("scheduled", ts=t0, scheduled_for=t0 + 60)
    emit("scheduled", ts=t0, delay=30)
    emit("timed_out", ts=t0 + 9, duration=5.0)
    emit("requeued", ts=t0 + 6, reason="lease_expired")
    emit("requeued", ts=t0 + 7, reason="lease_expired")
    emit("lease_extended", ts=t0 + 3)
    emit("idempotency_conflict", ts=t0, duration=0.001)
    emit("idempotency_reused", ts=t0)
    for event, fields in (
        ("backend_op", {"operation": "enqueue", "duration": 0.002}),
        ("backend_op", {"operation": "enqueue", "duration": 0.004}),
        ("backend_op", {"operation": "dequeue", "duration": 0.001}),
        ("reaper_cycle", {"duration": 0.05, "count": 3, "ok": 1}),
        ("reaper_cycle", {"duration": 0.02, "count": 0, "ok": 0}),
        ("scheduler_cycle", {"duration": 0.01, "count": 5, "ok": 1}),
        ("dequeue_empty", {}),
        ("dequeue_empty", {}),
        ("dequeue_error", {}),
    ):
        emit(event, ts=t0 + 1, **fields)
    return n


def test_realistic_mix_gives_exact_counters_and_histograms(redis_url, run_exporter):
    app = _ready(
        run_exporter(
            _events_config(redis_url, histogram_buckets={"queue_job_wait_seconds": [1, 2.5, 5]})
        )
    )
    t0 = time.time() - 60
    emitter = EventEmitter(redis_url, STREAM, system="shop")
    emitted = _emit_mix(emitter, t0)
    emitter.close()
    assert emitter.sent == emitted and emitter.dropped == 0
    series = _consumed(app, emitted)

    def count(name: str, **labels: str) -> float | None:
        return value(series, name, **{**JOB, **labels})

    sq = {"system": "shop", "queue": "billing"}
    assert count("queue_jobs_enqueued_total") == 3
    assert count("queue_jobs_dequeued_total") == 3
    assert count("queue_jobs_started_total") == 3
    assert count("queue_jobs_completed_total") == 3
    for error_type in ("retryable", "non_retryable", "timeout", "handler_not_found", "other"):
        assert count("queue_jobs_failed_total", error_type=error_type) == 1
    assert count("queue_jobs_retried_total") == 3
    assert count("queue_jobs_dead_lettered_total") == 1
    assert count("queue_jobs_max_retries_exceeded_total") == 1
    assert count("queue_jobs_scheduled_total") == 2
    assert count("queue_jobs_timed_out_total") == 1
    assert count("queue_jobs_requeued_total", reason="lease_expired") == 2
    assert count("queue_jobs_lease_extended_total") == 1
    assert count("queue_idempotency_conflicts_total") == 1
    assert count("queue_idempotency_reused_total") == 1
    assert value(series, "queue_dequeue_attempts_total", **sq, result="hit") == 3
    assert value(series, "queue_dequeue_attempts_total", **sq, result="empty") == 2
    assert value(series, "queue_dequeue_attempts_total", **sq, result="error") == 1
    assert value(series, "queue_reaper_requeued_total", **sq) == 3
    assert value(series, "queue_reaper_errors_total", **sq) == 1
    assert value(series, "queue_scheduler_processed_total", **sq) == 5
    assert value(series, "queue_scheduler_errors_total", **sq) is None  # no failed cycle yet

    def histogram(name: str, **labels: str) -> tuple[float | None, float | None]:
        return (
            value(series, f"{name}_count", **labels),
            value(series, f"{name}_sum", **labels),
        )

    assert histogram("queue_job_wait_seconds", **JOB) == (3, pytest.approx(6.0))
    # configured buckets: every wait was 2 s
    assert value(series, "queue_job_wait_seconds_bucket", **JOB, le="1.0") == 0
    assert value(series, "queue_job_wait_seconds_bucket", **JOB, le="2.5") == 3
    assert value(series, "queue_job_wait_seconds_bucket", **JOB, le="+Inf") == 3
    # execution: 3 completed x 0.5, 5 failed x 1.0, 1 timed out x 5.0
    assert histogram("queue_job_execution_seconds", **JOB) == (9, pytest.approx(11.5))
    # enqueue to end of attempt: 3 x 3 s (completed), 5 x 4 s (failed)
    assert histogram("queue_job_total_seconds", **JOB) == (8, pytest.approx(29.0))
    # attempts at the end of a job: 3 completed (1), non_retryable and handler_not_found (1),
    # the dead letter (3)
    assert histogram("queue_job_attempts", **JOB) == (6, pytest.approx(8.0))
    assert histogram("queue_job_retry_delay_seconds", **JOB) == (3, pytest.approx(14.0))
    assert histogram("queue_job_schedule_delay_seconds", **JOB) == (2, pytest.approx(90.0))
    assert histogram("queue_backend_operation_seconds", **sq, operation="enqueue") == (
        2,
        pytest.approx(0.006),
    )
    assert histogram("queue_backend_operation_seconds", **sq, operation="dequeue") == (
        1,
        pytest.approx(0.001),
    )
    assert histogram("queue_idempotency_check_seconds", **sq) == (1, pytest.approx(0.001))
    assert histogram("queue_reaper_cycle_seconds", **sq) == (2, pytest.approx(0.07))
    assert histogram("queue_scheduler_cycle_seconds", **sq) == (1, pytest.approx(0.01))
    # default buckets where none are configured
    assert value(series, "queue_job_execution_seconds_bucket", **JOB, le="0.5") == 3
    assert value(series, "queue_job_execution_seconds_bucket", **JOB, le="1.0") == 8

    assert value(series, "queue_exporter_events_invalid_total", stream=STREAM) is None
    assert value(series, "queue_exporter_events_lost_total", stream=STREAM) == 0
    wait_for(
        lambda: (
            value(
                scrape_series(app),
                "queue_exporter_stream_lag",
                stream=STREAM,
                group="queue-exporter",
            )
            == 0
        )
    )
    pending = value(
        scrape_series(app), "queue_exporter_stream_pending", stream=STREAM, group="queue-exporter"
    )
    assert pending is not None and pending <= 1000  # the last batch is acked with the next read


def test_a_bad_traceparent_costs_that_field_not_the_event(redis_url, run_exporter, caplog):
    caplog.set_level(logging.WARNING, logger="exporter.lifecycle.refusals")
    app = _ready(run_exporter(_events_config(redis_url)))
    emitter = EventEmitter(redis_url, STREAM, system="shop")
    job = {k: v for k, v in JOB.items() if k != "system"}
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"  # all-zero trace id
    emitter.emit("completed", **job, duration=0.5, traceparent=good)
    emitter.emit("completed", **job, duration=0.5, traceparent=bad)
    emitter.emit("completed", **job, duration=0.5)
    emitter.close()
    assert emitter.sent == 3
    series = _consumed(app, 3)
    assert value(series, "queue_jobs_completed_total", **JOB) == 3
    assert value(series, "queue_job_execution_seconds_count", **JOB) == 3
    invalid = "queue_exporter_events_invalid_total"
    assert value(series, invalid, stream=STREAM, reason="bad_traceparent") == 1
    warnings = [record.getMessage() for record in caplog.records]
    assert any(
        STREAM in message and "bad_traceparent" in message and "all-zero trace id" in message
        for message in warnings
    ), warnings


def test_workers_from_heartbeats_and_a_dead_worker_disappears(redis_url, run_exporter):
    app = _ready(run_exporter(_events_config(redis_url, worker_timeout=1.5)))
    emitter = EventEmitter(redis_url, STREAM, system="shop", flush_interval=0.01)
    sq = {"system": "shop", "queue": "billing"}
    emitter.heartbeat("w1", "billing", active=2, capacity=4)
    emitter.heartbeat("w2", "billing", active=0, capacity=4)
    emitter.heartbeat("w3", "billing", active=4, capacity=4)
    emitter.heartbeat("ghost", "billing", active=1, capacity=1)
    old = time.time() - 120  # a worker that died long ago: never counted
    emitter.emit("worker_heartbeat", ts=old, worker="old", queue="billing", active=1, capacity=1)
    emitter.flush()
    series = _consumed(app, 5)
    assert value(series, "queue_workers", **sq, state="busy") == 3
    assert value(series, "queue_workers", **sq, state="idle") == 1
    assert value(series, "queue_worker_slots", **sq, state="busy") == 7
    assert value(series, "queue_worker_slots", **sq, state="free") == 6

    # w3 and ghost die; w1 and w2 keep beating
    deadline = time.monotonic() + 2.5
    sent = 5
    while time.monotonic() < deadline:
        emitter.heartbeat("w1", "billing", active=2, capacity=4)
        emitter.heartbeat("w2", "billing", active=0, capacity=4)
        sent += 2
        time.sleep(0.2)
    emitter.close()
    series = _consumed(app, sent)
    assert value(series, "queue_workers", **sq, state="busy") == 1
    assert value(series, "queue_workers", **sq, state="idle") == 1
    assert value(series, "queue_worker_slots", **sq, state="busy") == 2
    assert value(series, "queue_worker_slots", **sq, state="free") == 6
    assert value(series, "queue_worker_utilization_ratio", **sq) == 0.25
    registry = app.event_consumers[0].workers
    assert {key[2] for key in registry._workers} == {"w1", "w2"}  # nothing kept of the dead

    # once every worker is silent, the worker series are gone entirely
    time.sleep(1.7)
    series = scrape_series(app)
    assert value(series, "queue_workers", **sq, state="busy") is None
    assert value(series, "queue_worker_utilization_ratio", **sq) is None
    assert not registry._workers


def test_several_streams_each_with_its_default_system(redis_url, run_exporter):
    app = run_exporter(
        {
            "sources": {
                "redis": {"url": redis_url},
                "events": {
                    "streams": [
                        {"key": "mail:events", "system": "mailer"},
                        {"key": "pay:events", "system": "payments"},
                    ],
                    "block_ms": 50,
                },
            }
        }
    )
    for key in ("mail:events", "pay:events"):
        wait_for(lambda key=key: app.health.snapshot()[f"events:{key}"].up)
    with (
        EventEmitter(redis_url, "mail:events") as mail,
        EventEmitter(redis_url, "pay:events") as pay,
    ):
        mail.emit("enqueued", queue="q")
        pay.emit("enqueued", queue="q")
        pay.emit("enqueued", queue="q", system="ledger")  # an event's own system wins
    series = wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_exporter_events_total", stream="pay:events") == 2
            and value(s, "queue_exporter_events_total", stream="mail:events") == 1
            and s
        )
    )
    for system in ("mailer", "payments", "ledger"):
        assert value(series, "queue_jobs_enqueued_total", system=system, queue="q") == 1
