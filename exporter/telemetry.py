"""The one place metrics live: OpenTelemetry instruments, sampled snapshots, the cardinality cap.

Two paths feed one exposition:
- instruments (event counters and histograms, self-metrics) go through the OpenTelemetry SDK
  and its PrometheusMetricReader, and through OTLP when enabled;
- sampled gauges arrive as whole snapshots from the sources' cycles. They are rendered
  straight from the snapshot: routing 10k series through the SDK's observable gauges made
  every scrape 3.4x slower than rendering them directly (bench/key_sampling.py). When OTLP
  is on, a second, OTLP-only MeterProvider observes the same snapshots;
- event counters and histograms arrive in bulk, one batch at a time, into a cumulative
  store rendered next to the others (telemetry_cumulative explains why).

A source that fails withdraws its snapshot: its series disappear instead of going stale.
"""

from __future__ import annotations

import functools
import itertools
import platform
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from pydantic import BaseModel, ConfigDict, Field

from exporter import __version__
from exporter.catalog import BY_NAME, MetricSpec
from exporter.health import HealthBoard
from exporter.samples import LabelValues, SampleSet, Series, longest_label
from exporter.telemetry_cumulative import CumulativeStore

OVERFLOW = "__overflow__"
# The SDK's own cap silently folds series; ours counts them, so the SDK's must never bind first.
_SDK_CARDINALITY = 1_000_000


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_series_per_metric: int = Field(
        10_000, ge=2, description="distinct label sets per metric before folding into overflow"
    )
    label_value_max_length: int = Field(128, ge=8, description="longer label values are cut")
    series_idle_timeout: float | None = Field(
        21600.0,
        gt=0,
        description="seconds after which an event series no batch updated is dropped (null: never)",
    )


class OtlpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False, description="also push every metric over OTLP/HTTP (OTEL_EXPORTER_OTLP_* apply)"
    )
    interval: float = Field(15.0, gt=0, description="seconds between pushes")


class SeriesGuard:
    """Admits at most `limit` label sets per metric; the rest share one overflow label set."""

    def __init__(self, limit: int, max_label_length: int, on_overflow: Any) -> None:
        self.limit = limit
        self.max_label_length = max_label_length
        self._on_overflow = on_overflow
        self._admitted: dict[str, set[LabelValues]] = {}
        self._lock = threading.Lock()

    def admit(self, metric: str, labels: LabelValues) -> LabelValues:
        """For instruments: the labels to record under (the overflow set once the cap is full)."""
        labels = self.clip(labels)
        admitted = self._admitted.setdefault(metric, set())
        if labels in admitted:
            return labels
        with self._lock:
            if len(admitted) < self.limit - 1:
                admitted.add(labels)
                return labels
        self._on_overflow(metric, 1)
        return (OVERFLOW,) * len(labels)

    def forget(self, metric: str, labels: LabelValues) -> None:
        with self._lock:
            self._admitted.get(metric, set()).discard(labels)

    def clip(self, labels: LabelValues) -> LabelValues:
        cap = self.max_label_length
        if all(len(value) <= cap for value in labels):
            return labels
        return tuple(value[:cap] for value in labels)


class Telemetry:
    def __init__(
        self,
        health: HealthBoard,
        limits: LimitsConfig | None = None,
        otlp: OtlpConfig | None = None,
        histogram_buckets: dict[str, tuple[float, ...]] | None = None,
    ) -> None:
        self.health = health
        self.limits = limits or LimitsConfig()
        self.registry = CollectorRegistry(auto_describe=False)
        self._sdk_registry = CollectorRegistry(auto_describe=False)
        self._snapshots: dict[str, dict[MetricSpec, Series]] = {}
        self._snapshot_lock = threading.Lock()

        limits_by_class: dict[type, int] = {
            kind: _SDK_CARDINALITY
            for kind in (Counter, UpDownCounter, Histogram, ObservableGauge, ObservableCounter)
        }
        readers: list[MetricReader] = [
            PrometheusMetricReader(
                disable_target_info=True,
                scope_info_enabled=False,
                registry=self._sdk_registry,
                cardinality_limits=limits_by_class,
            )
        ]
        self._otlp_snapshot_provider: MeterProvider | None = None
        if otlp is not None and otlp.enabled:
            readers.append(_otlp_reader(otlp))
            self._otlp_snapshot_provider = MeterProvider(
                metric_readers=[_otlp_reader(otlp)], resource=_resource()
            )
        views = [
            View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(buckets))
            for name, buckets in (histogram_buckets or {}).items()
        ]
        self.provider = MeterProvider(metric_readers=readers, resource=_resource(), views=views)
        self.meter = self.provider.get_meter("queue-exporter", __version__)
        self._overflow = self.meter.create_counter(
            "queue_exporter_series_overflow_total",
            description=BY_NAME["queue_exporter_series_overflow_total"].help,
        )
        self.guard = SeriesGuard(
            self.limits.max_series_per_metric,
            self.limits.label_value_max_length,
            lambda metric, count: self._overflow.add(count, {"metric": metric}),
        )
        self._source_errors = self.meter.create_counter(
            "queue_exporter_source_errors_total",
            description=BY_NAME["queue_exporter_source_errors_total"].help,
        )
        # Event counters and histograms, updated in bulk per batch (see telemetry_cumulative).
        otlp_meter = (
            self._otlp_snapshot_provider.get_meter("queue-exporter.events", __version__)
            if self._otlp_snapshot_provider is not None
            else None
        )
        self.cumulative = CumulativeStore(self.guard, otlp_meter, self.limits.series_idle_timeout)
        self._register_self_gauges()
        self.registry.register(_Exposition(self))

    # -- sampled snapshots -------------------------------------------------------------------

    def publish(self, source: str, samples: SampleSet) -> None:
        """Replace everything `source` published before with this snapshot."""
        published = dict(samples.metrics())
        clip = longest_label(published.values()) > self.guard.max_label_length
        capped = {spec: self._cap(source, spec, series, clip) for spec, series in published.items()}
        with self._snapshot_lock:
            self._snapshots[source] = capped

    def withdraw(self, source: str) -> None:
        """Drop a failing source's series rather than serve them stale."""
        with self._snapshot_lock:
            self._snapshots.pop(source, None)

    def _cap(self, source: str, spec: MetricSpec, series: Series, clip: bool) -> Series:
        if clip:  # rare: most snapshots are published without a copy
            series = _clipped(spec, series, self.guard.clip)
        with self._snapshot_lock:
            used_elsewhere = sum(
                len(published.get(spec, ()))
                for name, published in self._snapshots.items()
                if name != source
            )
        room = self.guard.limit - 1 - used_elsewhere
        if len(series) <= room + 1:
            return series
        values = dict(series.items())
        kept = {labels: values[labels] for labels in _fair_share(list(values), max(room, 0))}
        refused = [value for labels, value in values.items() if labels not in kept]
        overflow_labels = (OVERFLOW,) * len(spec.labels)
        kept[overflow_labels] = functools.reduce(spec.combined, refused)
        self._overflow.add(len(refused), {"metric": spec.name})
        return Series((kept,))

    def snapshot_series(self) -> dict[MetricSpec, Series]:
        """All published series merged across sources (sums where two sources meet)."""
        merged: dict[MetricSpec, Series] = {}
        with self._snapshot_lock:
            published = list(self._snapshots.values())
        for snapshot in published:
            for spec, series in snapshot.items():
                earlier = merged.get(spec)
                merged[spec] = series if earlier is None else earlier.plus(series)
        return merged

    # -- instruments and self-metrics -------------------------------------------------------

    def count_error(
        self, source: str, reason: str, count: int = 1, system: str = "", pattern: str = ""
    ) -> None:
        """Count an error; a key group's carries its system and pattern (else they are empty)."""
        labels = {"source": source, "reason": reason, "system": system, "pattern": pattern}
        self._source_errors.add(count, labels)

    def _register_self_gauges(self) -> None:
        build = {"version": __version__, "python": platform.python_version()}

        def build_info(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(1, build)

        def health_gauge(field: str) -> Any:
            def observe(_: CallbackOptions) -> Iterator[Observation]:
                for source, status in self.health.snapshot().items():
                    if status.standby:  # a follower's sampler: the leader reports it
                        continue
                    value = {
                        "up": 1.0 if status.up else 0.0,
                        "duration": status.last_duration,
                        "last_success": status.last_success,
                    }[field]
                    if value is not None:
                        yield Observation(value, {"source": source})

            return observe

        def keys_matched(_: CallbackOptions) -> Iterator[Observation]:
            # Only for sources that are up: a failing source's findings are not current.
            sources = self.health.snapshot()
            for report in self.health.key_groups():
                status = sources.get(report.source)
                if status is not None and status.up and not status.standby:
                    labels = {
                        "source": report.source,
                        "system": report.system,
                        "pattern": report.pattern,
                    }
                    yield Observation(report.keys_matched, labels)

        for name, callback in (
            ("queue_exporter_build_info", build_info),
            ("queue_exporter_keys_matched", keys_matched),
            ("queue_exporter_source_up", health_gauge("up")),
            ("queue_exporter_source_duration_seconds", health_gauge("duration")),
            ("queue_exporter_source_last_success_timestamp_seconds", health_gauge("last_success")),
        ):
            self.meter.create_observable_gauge(
                name, callbacks=[callback], description=BY_NAME[name].help
            )
        if self._otlp_snapshot_provider is not None:
            self._observe_snapshots_for_otlp(self._otlp_snapshot_provider)

    def _observe_snapshots_for_otlp(self, provider: MeterProvider) -> None:
        meter = provider.get_meter("queue-exporter.sampled", __version__)
        specs = [spec for spec in BY_NAME.values() if spec.origin == "sampled"]
        for spec in specs:

            def observe(_: CallbackOptions, spec: MetricSpec = spec) -> Iterator[Observation]:
                series = self.snapshot_series().get(spec, Series(()))
                for labels, value in series.items():
                    yield Observation(value, dict(zip(spec.labels, labels, strict=True)))

            if spec.kind == "counter":
                meter.create_observable_counter(spec.name, callbacks=[observe])
            else:
                meter.create_observable_gauge(spec.name, callbacks=[observe])

    def shutdown(self) -> None:
        self.provider.shutdown()
        if self._otlp_snapshot_provider is not None:
            self._otlp_snapshot_provider.shutdown()


class _Exposition:
    """The collector /metrics serves: SDK families and snapshot families, merged by name."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        snapshot_families = (
            _snapshot_family(spec, series)
            for spec, series in self._telemetry.snapshot_series().items()
        )
        for family in itertools.chain(
            self._telemetry._sdk_registry.collect(),
            snapshot_families,
            self._telemetry.cumulative.families(),
        ):
            existing = families.get(family.name)
            if existing is not None and existing.type == family.type:
                # One family, two feeds: e.g. Attune's sampled totals and event counters.
                existing.samples.extend(family.samples)
            else:
                families[family.name] = family
        return families.values()


def _clipped(
    spec: MetricSpec, series: Series, clip: Callable[[LabelValues], LabelValues]
) -> Series:
    """The series with long label values cut; series that then meet combine."""
    cut: dict[LabelValues, float] = {}
    for labels, value in series.items():
        labels = clip(labels)
        earlier = cut.get(labels)
        cut[labels] = value if earlier is None else spec.combined(earlier, value)
    return Series((cut,))


def _fair_share(label_sets: list[LabelValues], room: int) -> list[LabelValues]:
    """At most `room` label sets, shared out evenly among the values of the first label (the
    system, for every sampled metric): one layout with a thousand keys must not push another
    layout's few queues into the overflow series. A value needing less than its share leaves
    the rest to the others."""
    by_first: dict[str, list[LabelValues]] = {}
    for labels in label_sets:
        by_first.setdefault(labels[0] if labels else "", []).append(labels)
    kept: list[LabelValues] = []
    groups = sorted(by_first.values(), key=len)
    for position, members in enumerate(groups):
        share = (room - len(kept)) // (len(groups) - position)
        kept += members[:share]
    return kept


def _snapshot_family(spec: MetricSpec, series: Series) -> Metric:
    base = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
    sample_name = spec.name if spec.kind != "counter" else base + "_total"
    family = Metric(base, spec.help, spec.kind)
    names = spec.labels
    family.samples = [
        Sample(sample_name, dict(zip(names, labels, strict=True)), value, None, None)
        for labels, value in series.items()
    ]
    return family


def _resource() -> Resource:
    return Resource.create({"service.name": "queue-exporter", "service.version": __version__})


def _otlp_reader(otlp: OtlpConfig) -> MetricReader:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as error:  # the extra is optional
        raise RuntimeError(
            "OTLP push needs the otlp extra: pip install 'queue-exporter[otlp]'"
        ) from error
    return PeriodicExportingMetricReader(
        OTLPMetricExporter(), export_interval_millis=int(otlp.interval * 1000)
    )
