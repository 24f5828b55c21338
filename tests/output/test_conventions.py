"""OpenTelemetry's messaging semantic-convention names, served beside the project's own:
the same series under both names with equal values, on /metrics and over OTLP, and nothing of
them when the option is off. The truth is what the test emitted."""

from __future__ import annotations

import time

import pytest

from exporter.lifecycle.producer import EventEmitter
from exporter.output.catalog import BY_NAME, CONVENTIONS, Convention, convention_spec
from tests.conftest import Series, scrape_series, total, wait_for
from tests.output.test_otlp import attributes, metrics_named, receiver  # noqa: F401  (the fixture)

STREAM = "conventions:events"
DURATIONS = (0.5, 1.5)  # completed attempts
FAILED_DURATION = 2.0  # one failed attempt: the execution histogram holds it too
ENQUEUED, DEQUEUED = 4, 3
# Our name on /metrics -> its convention's, with the labels renamed (catalog.CONVENTIONS).
PROMETHEUS_RENAMES = {
    "system": "messaging_system",
    "queue": "messaging_destination_name",
}
OPERATIONS = {"process", "dequeue", "enqueue"}


def _exporter(run_exporter, redis_url, conventions: bool, **extra):
    app = run_exporter(
        {
            "messaging_conventions": conventions,
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": STREAM, "system": "app"}], "block_ms": 50},
            },
            **extra,
        }
    )
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    with EventEmitter(redis_url, STREAM) as emitter:
        job = {"queue": "billing", "job_type": "invoice"}
        for _ in range(ENQUEUED):
            emitter.emit("enqueued", ts=time.time(), **job)
        for _ in range(DEQUEUED):
            emitter.emit("dequeued", ts=time.time(), **job)
        for duration in DURATIONS:
            emitter.emit("completed", ts=time.time(), duration=duration, **job)
        emitter.emit(
            "failed", ts=time.time(), duration=FAILED_DURATION, error_type="Timeout", **job
        )
    return app


def _scrape_when_counted(app) -> Series:
    """A scrape once every emitted event is counted (under the project's names)."""

    def counted() -> Series | None:
        series = scrape_series(app)
        executions = total(series, "queue_job_execution_seconds_count")
        dequeued = total(series, "queue_jobs_dequeued_total")
        return series if (executions, dequeued) == (len(DURATIONS) + 1, DEQUEUED) else None

    return wait_for(counted)


def _conventional(name: str, labels: frozenset[tuple[str, str]], convention: Convention):
    """What our series becomes under the convention on /metrics."""
    prometheus = convention_spec(BY_NAME[convention.source], convention, otlp=False).name
    suffix = name.removeprefix(convention.source)  # _bucket, _sum, _count of a histogram
    if BY_NAME[convention.source].kind == "counter":
        suffix = ""
    renamed = {(PROMETHEUS_RENAMES.get(k, k), v) for k, v in labels}
    return (
        prometheus + suffix,
        frozenset(renamed | {("messaging_operation_name", convention.operation)}),
    )


def test_both_names_are_served_with_equal_values(redis_url, run_exporter):
    app = _exporter(run_exporter, redis_url, conventions=True)
    series = _scrape_when_counted(app)
    for convention in CONVENTIONS:
        ours = {
            key: number
            for key, number in series.items()
            if key[0].removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            == convention.source
        }
        assert ours, convention.source
        theirs = {
            key: number
            for key, number in series.items()
            if ("messaging_operation_name", convention.operation) in key[1]
        }
        expected = {
            _conventional(name, labels, convention): v for (name, labels), v in ours.items()
        }
        assert theirs == expected, convention.name
    # and the values are the workload's, under the conventions' names
    job = {"messaging_system": "app", "messaging_destination_name": "billing"}
    assert total(series, "messaging_client_sent_messages_total", **job) == ENQUEUED
    assert total(series, "messaging_client_consumed_messages_total", **job) == DEQUEUED
    executions = len(DURATIONS) + 1
    assert total(series, "messaging_process_duration_seconds_count", **job) == executions
    assert total(series, "messaging_process_duration_seconds_sum", **job) == pytest.approx(
        sum(DURATIONS) + FAILED_DURATION
    )
    # the project's own are there as before
    assert total(series, "queue_jobs_enqueued_total", system="app", queue="billing") == ENQUEUED


def test_off_serves_only_the_projects_names(redis_url, run_exporter):
    app = _exporter(run_exporter, redis_url, conventions=False)
    series = _scrape_when_counted(app)
    assert not [name for name, _ in series if name.startswith("messaging_")]
    assert not [
        labels for _, labels in series if any(k.startswith("messaging_") for k, _ in labels)
    ]


def _in(request, name: str):
    """The one metric of that name in one push."""
    (metric,) = metrics_named([request], name)
    return metric


def test_otlp_carries_the_dotted_names_with_units(
    receiver,  # noqa: F811
    redis_url,
    run_exporter,
    monkeypatch,
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    _exporter(run_exporter, redis_url, conventions=True, otlp={"enabled": True, "interval": 0.3})

    def pushed_all():
        durations = receiver.metrics("messaging.process.duration")
        if durations and durations[-1].histogram.data_points[0].count == len(DURATIONS) + 1:
            return durations[-1]
        return None

    duration = wait_for(pushed_all)
    (point,) = duration.histogram.data_points
    assert duration.unit == "s"
    assert attributes(point) == {
        "messaging.system": "app",
        "messaging.destination.name": "billing",
        "job_type": "invoice",
        "priority": "",
        "messaging.operation.name": "process",
    }
    # the project's histogram of one same push: equal counts, sum and buckets
    last = receiver.requests[-1]
    ours, theirs = (
        _in(last, name) for name in ("queue_job_execution_seconds", "messaging.process.duration")
    )
    (our_point,), (their_point,) = ours.histogram.data_points, theirs.histogram.data_points
    assert (their_point.count, their_point.sum) == (our_point.count, our_point.sum)
    assert list(their_point.bucket_counts) == list(our_point.bucket_counts)
    assert list(their_point.explicit_bounds) == list(our_point.explicit_bounds)
    assert ours.unit == ""  # our names carry their unit already
    (consumed,) = receiver.metrics("messaging.client.consumed.messages")[-1:]
    assert consumed.unit == "{message}" and consumed.sum.is_monotonic
    assert [p.as_double for p in consumed.sum.data_points] == [DEQUEUED]
