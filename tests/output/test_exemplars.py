"""Exemplars: the trace and span ids of lifecycle events beside the series they fed.

Events are built as a producer writes them (wire.encode, a traceparent the test chooses) and
read as the consumer reads them (wire.parse, EventMetrics); the renders are read back with
prometheus_client's OpenMetrics parser, which knows exemplars (and refuses them on any line
but a counter's or a histogram bucket's), and with its 0.0.4 parser, which must see none.
"""

from __future__ import annotations

import time
from bisect import bisect_left

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EXEMPLIFIED, EventMetrics, Tally, apply
from exporter.output.catalog import BY_NAME
from exporter.output.conventions import with_conventions
from exporter.output.health import HealthBoard
from exporter.output.otlp import store_metrics
from exporter.output.store import OVERFLOW, Exemplar, MetricStore, SeriesGuard
from exporter.output.telemetry import Telemetry
from exporter.output.telemetry_config import LimitsConfig

pytestmark = pytest.mark.fast

EXECUTION = "queue_job_execution_seconds"
BOUNDS = BY_NAME[EXECUTION].buckets


def _traceparent(n: int) -> str:
    return f"00-{n:032x}-{n + 1:016x}-01"


def _event(name: str, n: int | None, ts: float, **fields: wire.FieldValue) -> wire.Event:
    """An event as the consumer reads it from what a producer wrote; n: its trace's number."""
    fields = {"queue": "emails", "job_type": "send", **fields}
    if n is not None:
        fields["traceparent"] = _traceparent(n)
    entry = wire.encode(name, fields, ts=ts)
    return wire.parse({key.encode(): value.encode() for key, value in entry.items()})


def _record(telemetry: Telemetry, events: list[wire.Event], redis_source: str | None = None):
    metrics = EventMetrics(telemetry, {}, by_redis=redis_source is not None)
    tally = Tally()
    for event in events:
        apply(tally, event, "app")
    metrics.record("app:events", tally, metrics.worker_registry(60.0, 100, redis_source))


def _exemplars(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], object]:
    """(sample name, sorted labels) -> its exemplar, as prometheus_client reads OpenMetrics."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.exemplar
        for family in parse_openmetrics(text)
        for sample in family.samples
        if sample.exemplar is not None
    }


def _job(**more: str) -> tuple[tuple[str, str], ...]:
    labels = {"system": "app", "queue": "emails", "job_type": "send", "priority": "", **more}
    return tuple(sorted(labels.items()))


def test_each_bucket_keeps_its_latest_traced_observation_and_counters_theirs():
    telemetry = Telemetry(HealthBoard())
    now = time.time()
    # Two jobs per chosen duration; the later of each pair must be the one kept.
    durations = [0.003, 0.2, 7.0, 100.0, 5000.0]
    events = []
    for n, duration in enumerate(durations * 2, start=1):
        ended = now - 10 + n * 0.1
        events.append(
            _event("completed", n, ended, duration=duration, enqueued_at=ended - duration - 1)
        )
    events.append(_event("failed", 99, now, duration=0.04, error_type="timeout"))
    events.append(_event("timed_out", 98, now, duration=30.0))
    events.append(_event("started", 77, now, enqueued_at=now - 3))
    events.append(_event("completed", None, now, duration=0.003))  # no trace: none kept
    _record(telemetry, events)

    read = _exemplars(telemetry.render(True).decode())
    assert {name.removesuffix("_bucket") for name, _ in read} == set(EXEMPLIFIED)
    for index, duration in enumerate(durations):
        n = len(durations) + index + 1  # the later job of the pair
        bound = (*BOUNDS, float("inf"))[bisect_left(BOUNDS, duration)]
        le = "+Inf" if bound == float("inf") else str(float(bound))
        exemplar = read.pop((f"{EXECUTION}_bucket", _job(le=le)))
        assert exemplar.labels == {"trace_id": f"{n:032x}", "span_id": f"{n + 1:016x}"}
        assert exemplar.value == duration
        assert abs(float(exemplar.timestamp) - (now - 10 + n * 0.1)) < 1e-3
        # OpenMetrics: at most 128 UTF-8 characters in an exemplar's label names and values
        assert sum(len(key) + len(value) for key, value in exemplar.labels.items()) <= 128
    completed = read.pop(("queue_jobs_completed_total", _job()))
    assert completed.labels["trace_id"] == f"{2 * len(durations):032x}" and completed.value == 1
    failed = read.pop(("queue_jobs_failed_total", _job(error_type="timeout")))
    assert failed.labels["trace_id"] == f"{99:032x}"
    timed_out = read.pop(("queue_jobs_timed_out_total", _job()))
    assert timed_out.labels["trace_id"] == f"{98:032x}" and timed_out.value == 1
    timed_out_run = read.pop((f"{EXECUTION}_bucket", _job(le="30.0")))
    assert timed_out_run.labels["trace_id"] == f"{98:032x}" and timed_out_run.value == 30
    failed_run = read.pop((f"{EXECUTION}_bucket", _job(le="0.05")))
    assert failed_run.labels["trace_id"] == f"{99:032x}" and failed_run.value == 0.04
    wait = read.pop(("queue_job_wait_seconds_bucket", _job(le="5.0")))
    assert wait.labels["trace_id"] == f"{77:032x}" and wait.value == 3
    # queue_job_total_seconds: one per bucket of the completed jobs' totals
    totals = {
        key: value for key, value in read.items() if key[0] == "queue_job_total_seconds_bucket"
    }
    assert {value.labels["trace_id"] for value in totals.values()} <= {
        f"{n:032x}" for n in range(1, 2 * len(durations) + 1)
    }
    assert len(totals) == len(read)  # nothing else carries one
    telemetry.shutdown()


def test_the_text_format_never_carries_exemplars():
    telemetry = Telemetry(HealthBoard())
    now = time.time()
    _record(telemetry, [_event("completed", n, now, duration=n / 10) for n in range(1, 40)])
    text = telemetry.render(False).decode()
    assert " # {" not in text and "trace_id" not in text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample
        for family in parse_text(text)
        for sample in family.samples
    }
    assert samples[("queue_jobs_completed_total", _job())].value == 39
    assert all(sample.exemplar is None for sample in samples.values())
    assert _exemplars(telemetry.render(True).decode())  # the same store, in OpenMetrics
    telemetry.shutdown()


def test_memory_per_series_is_bounded_by_its_buckets_whatever_the_traffic():
    guard = SeriesGuard(10_000, 128, lambda metric, count: None)
    store = MetricStore(guard)
    job = ("app", "emails", "send", "")
    for batch in range(50):
        values = [(batch * 1000 + n) % 7000 / 10 for n in range(1000)]
        exemplars = [
            Exemplar(value, f"{n:032x}", f"{n:016x}", 1.0) for n, value in enumerate(values)
        ]
        store.apply(
            {("queue_jobs_completed_total", job): 1000.0},
            {(EXECUTION, job): values},
            {(EXECUTION, job): exemplars, ("queue_jobs_completed_total", job): exemplars[:3]},
        )
    (histogram,) = [family for family in store.families() if family.spec.name == EXECUTION]
    (slots,) = histogram.exemplars.values()
    assert len(slots) == len(BOUNDS) + 1
    for index, exemplar in enumerate(slots):
        if exemplar is not None:  # each in its own bucket
            assert bisect_left(BOUNDS, exemplar.value) == index
    (counter,) = [f for f in store.families() if f.spec.name == "queue_jobs_completed_total"]
    assert list(counter.exemplars.values()) == [exemplars[2]]


def test_folded_series_keep_their_exemplars_in_the_overflow_and_idle_ones_drop_them():
    clock = [0.0]
    telemetry = Telemetry(HealthBoard(), LimitsConfig(max_series_per_metric=4))
    store = MetricStore(telemetry.store.guard, idle_timeout=60.0, clock=lambda: clock[0])
    exemplar = Exemplar(1.0, "a" * 32, "b" * 16, 5.0)
    for job_type in ("one", "two", "three", "four"):
        job = ("app", "q", job_type, "")
        store.apply(
            {("queue_jobs_completed_total", job): 1.0},
            {},
            {("queue_jobs_completed_total", job): [exemplar]},
        )
    (counter,) = store.families()
    assert (
        set(counter.exemplars)
        == {labels for labels, _ in counter.series.items()}
        == {
            ("app", "q", "one", ""),
            ("app", "q", "two", ""),
            ("app", "q", "three", ""),
            (OVERFLOW,) * 4,
        }
    )
    clock[0] = 61.0
    assert store.expire_idle() == 4
    assert store.families() == []
    telemetry.shutdown()


def test_a_feed_of_one_of_several_redis_sources_names_it_on_exemplared_series():
    telemetry = Telemetry(HealthBoard())
    _record(telemetry, [_event("completed", 5, time.time(), duration=0.2)], redis_source="main")
    read = _exemplars(telemetry.render(True).decode())
    assert read[("queue_jobs_completed_total", _job(redis_source="main"))].labels == {
        "trace_id": f"{5:032x}",
        "span_id": f"{6:016x}",
    }
    telemetry.shutdown()


def test_otlp_points_carry_the_exemplars_kept():
    telemetry = Telemetry(HealthBoard())
    now = time.time()
    _record(telemetry, [_event("completed", 12, now, duration=7.0), _event("completed", None, now)])
    metrics = {metric.name: metric for metric in store_metrics(telemetry.store.families(), 0)}
    (point,) = metrics[EXECUTION].data.data_points
    (exemplar,) = point.exemplars
    assert (exemplar.trace_id, exemplar.span_id, exemplar.value) == (12, 13, 7.0)
    assert exemplar.time_unix_nano == pytest.approx(now * 1e9, abs=1e3)
    (counted,) = metrics["queue_jobs_completed_total"].data.data_points
    assert [(e.trace_id, e.value) for e in counted.exemplars] == [(12, 1.0)]
    telemetry.shutdown()


def test_the_convention_families_carry_their_sources_exemplars():
    """messaging.process.duration is queue_job_execution_seconds renamed: the same exemplar on
    the same bucket, on /metrics and over OTLP (docs/metrics.md)."""
    telemetry = Telemetry(HealthBoard(), messaging_conventions=True)
    now = time.time()
    _record(telemetry, [_event("completed", 21, now, duration=7.0)])
    read = _exemplars(telemetry.render(True).decode())
    ours = read[(f"{EXECUTION}_bucket", _job(le="10.0"))]
    labels = {
        "messaging_system": "app",
        "messaging_destination_name": "emails",
        "job_type": "send",
        "priority": "",
        "messaging_operation_name": "process",
        "le": "10.0",
    }
    theirs = read[("messaging_process_duration_seconds_bucket", tuple(sorted(labels.items())))]
    assert theirs == ours and theirs.labels["trace_id"] == f"{21:032x}"
    pushed = with_conventions(telemetry.store.families(), otlp=True)
    metrics = {metric.name: metric for metric in store_metrics(pushed, 0)}
    (point,) = metrics["messaging.process.duration"].data.data_points
    assert [(e.trace_id, e.value) for e in point.exemplars] == [(21, 7.0)]
    telemetry.shutdown()


def test_an_exemplar_neither_format_could_carry_is_dropped_and_counted():
    guard = SeriesGuard(10_000, 128, lambda metric, count: None)
    store = MetricStore(guard)
    job = ("app", "emails", "send", "")
    good = Exemplar(1.0, "a" * 32, "b" * 16, 5.0)
    bad = [
        good._replace(trace_id='a"} 1\nfake_metric 1 #'),
        good._replace(span_id="B" * 16),
        good._replace(value=float("nan")),
        good._replace(time=float("inf")),
    ]
    store.apply(
        {("queue_jobs_completed_total", job): 1.0},
        {(EXECUTION, job): [1.0]},
        {("queue_jobs_completed_total", job): [good, *bad], (EXECUTION, job): bad},
    )
    assert store.dropped_values == 2 * len(bad)
    (counter, histogram) = store.families()
    assert list(counter.exemplars.values()) == [good]  # the sound one, though not the last
    assert histogram.exemplars == {}
