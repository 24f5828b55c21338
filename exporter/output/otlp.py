"""OTLP push: the store's families read at export time, beside the SDK's own instruments.

One MeterProvider holds the exporter's self-metrics; its periodic reader hands each
collection to StoreExporter, which adds the store's families as they are at that moment,
built straight into the OpenTelemetry data model, then passes everything to the OTLP
exporter. Nothing is replayed through SDK instruments: a push costs one read of the store,
however many events or samples came in since the last one. The exemplars the store keeps
(a trace's ids beside a counter's or a histogram bucket's observation) ride on their points.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.sdk.metrics import Exemplar as OtelExemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from exporter import __version__
from exporter.output.store import Exemplar, Family, HistogramFamily, NumberFamily

SCOPE = InstrumentationScope("queue-exporter.store", __version__)


class StoreExporter(MetricExporter):
    """Wraps an exporter: every export also carries the store's families."""

    def __init__(
        self, inner: MetricExporter, read: Callable[[], list[Family]], resource: Resource
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._read = read
        self._resource = resource
        self._start_ns = time.time_ns()  # the store's counters start with the process

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        stored = ScopeMetrics(SCOPE, store_metrics(self._read(), self._start_ns), "")
        resources = list(metrics_data.resource_metrics) or [ResourceMetrics(self._resource, [], "")]
        first = resources[0]
        resources[0] = ResourceMetrics(
            first.resource, [*first.scope_metrics, stored], first.schema_url
        )
        return self._inner.export(MetricsData(resources), timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


def store_metrics(families: list[Family], start_ns: int) -> list[Metric]:
    """The families in the OpenTelemetry data model: gauges, monotonic cumulative sums and
    explicit-bucket histograms, one data point per series."""
    now = time.time_ns()
    metrics = []
    for family in families:
        spec = family.spec
        names = spec.labels
        data: Gauge | Sum | Histogram
        if isinstance(family, HistogramFamily):
            bounds = list(family.bounds)
            exemplars = family.exemplars
            data = Histogram(
                [
                    HistogramDataPoint(
                        dict(zip(names, labels, strict=True)),
                        start_ns,
                        now,
                        count,
                        total,
                        buckets,
                        bounds,
                        None,  # type: ignore[arg-type]  # min and max are not kept
                        None,  # type: ignore[arg-type]
                        _otel_exemplars(exemplars.get(labels, ())),
                    )
                    for labels, (buckets, total, count) in family.series.items()
                ],
                AggregationTemporality.CUMULATIVE,
            )
        else:
            points = _number_points(family, start_ns, now)
            if spec.kind == "counter":
                data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
            else:
                data = Gauge(points)
        metrics.append(Metric(spec.name, spec.help, spec.unit or None, data))
    return metrics


def _number_points(family: NumberFamily, start_ns: int, now: int) -> list[NumberDataPoint]:
    names = family.spec.labels
    exemplars = family.exemplars
    if not exemplars:
        return [
            NumberDataPoint(dict(zip(names, labels, strict=True)), start_ns, now, value)
            for labels, value in family.series.items()
        ]
    return [
        NumberDataPoint(
            dict(zip(names, labels, strict=True)),
            start_ns,
            now,
            value,
            _otel_exemplars((exemplars.get(labels),)),
        )
        for labels, value in family.series.items()
    ]


def _otel_exemplars(exemplars: Iterable[Exemplar | None]) -> list[OtelExemplar]:
    """The store's exemplars (None: an empty slot) in the OpenTelemetry data model."""
    return [
        OtelExemplar(
            {},
            exemplar.value,
            round(exemplar.time * 1e9),
            int(exemplar.span_id, 16),
            int(exemplar.trace_id, 16),
        )
        for exemplar in exemplars
        if exemplar is not None
    ]
