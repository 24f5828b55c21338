"""The exporter's own instruments, on the OpenTelemetry SDK: exposed through
opentelemetry-exporter-prometheus into /metrics, and pushed over OTLP when it is on.

A module of its own because the SDK and prometheus_client are a fifth of `serve`'s start-up:
`serve` answers its first scrape before they load (Telemetry.build_self_metrics), the way it
does before redis-py and the sources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest as _untyped_text
from prometheus_client.openmetrics.exposition import generate_latest as _untyped_openmetrics
from prometheus_client.samples import Sample

from exporter import __version__
from exporter.core.printable import printable
from exporter.output import exposition
from exporter.output.catalog import AUTH_FAILURE_REASONS, BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.otlp import StoreExporter
from exporter.output.store import Family
from exporter.output.telemetry_config import DEFAULT_SERVICE_NAME, OtlpConfig

# The SDK's own cap silently folds series; ours counts them, so the SDK's must never bind first.
_SDK_CARDINALITY = 1_000_000
_Writer = Callable[[CollectorRegistry], bytes]
_write_text = cast(_Writer, _untyped_text)
_write_openmetrics = cast(_Writer, _untyped_openmetrics)


class SelfMetrics:
    """The meter, the counters the exporter itself adds to, and the gauges read from the
    health board, with the OTLP reader of the store when `otlp` is enabled."""

    def __init__(
        self,
        health: HealthBoard,
        build: dict[str, str],
        otlp: OtlpConfig | None,
        read_store: Callable[[], list[Family]],
    ) -> None:
        self.health = health
        self.build = build  # queue_exporter_build_info's labels
        self._registry = CollectorRegistry(auto_describe=False)
        limits_by_class: dict[type, int] = {
            kind: _SDK_CARDINALITY
            for kind in (Counter, UpDownCounter, Histogram, ObservableGauge, ObservableCounter)
        }
        readers: list[MetricReader] = [
            PrometheusMetricReader(
                disable_target_info=True,
                scope_info_enabled=False,
                registry=self._registry,
                cardinality_limits=limits_by_class,
            )
        ]
        resource = exporter_resource(otlp.service_name if otlp else DEFAULT_SERVICE_NAME)
        if otlp is not None and otlp.enabled:
            readers.append(_otlp_reader(otlp, read_store, resource))
        self.provider = MeterProvider(metric_readers=readers, resource=resource)
        self.meter: Meter = self.provider.get_meter("queue-exporter", __version__)
        self._overflow = self.meter.create_counter(
            "queue_exporter_series_overflow_total",
            description=BY_NAME["queue_exporter_series_overflow_total"].help,
        )
        self._auth_failures = self.meter.create_counter(
            "queue_exporter_http_auth_failures_total",
            description=BY_NAME["queue_exporter_http_auth_failures_total"].help,
        )
        for reason in AUTH_FAILURE_REASONS:  # 0 from the start: rate() sees the first failure
            self._auth_failures.add(0, {"reason": reason})
        self._source_errors = self.meter.create_counter(
            "queue_exporter_source_errors_total",
            description=BY_NAME["queue_exporter_source_errors_total"].help,
        )
        self._register_gauges()

    def render(self, openmetrics: bool) -> bytes:
        """These metrics in the exposition format (OpenMetrics without its `# EOF`)."""
        if openmetrics:
            return _write_openmetrics(self._registry).removesuffix(exposition.OPENMETRICS_EOF)
        return _write_text(self._registry)

    def samples(self) -> list[Sample]:
        """These metrics as structured samples (what render writes, without the text)."""
        return [sample for family in self._registry.collect() for sample in family.samples]

    def count_overflow(self, metric: str, count: int) -> None:
        self._overflow.add(count, {"metric": metric})

    def count_auth_failure(self, reason: str, count: int = 1) -> None:
        self._auth_failures.add(count, {"reason": reason})

    def count_error(self, labels: dict[str, str], count: int) -> None:
        self._source_errors.add(count, labels)

    def shutdown(self, timeout: float) -> None:
        self.provider.shutdown(timeout_millis=timeout * 1000)

    def _register_gauges(self) -> None:
        def build_info(_: CallbackOptions) -> Iterable[Observation]:
            yield Observation(1, self.build)

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
            # The board holds no findings of a failing or standing-by source: none go stale.
            for report in self.health.key_groups():
                labels = {
                    "source": report.source,
                    "system": report.system,
                    "pattern": printable(report.pattern),  # Celery's \x06\x16 shown as such
                }
                # a group that names its queues knows them even when all are empty (gone):
                # what QueueExporterKeyGroupUnmatched reads, so idle queues do not fire it
                yield Observation(max(report.keys_matched, report.keys_named), labels)

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


def exporter_resource(service_name: str) -> Resource:
    """The SDK's own resource (Resource.create: its detectors, OTEL_RESOURCE_ATTRIBUTES and
    OTEL_SERVICE_NAME among them), with our service name and version where the environment
    names none: an explicit attribute would override the environment's."""
    from_environment = OTELResourceDetector().detect().attributes
    defaults = {SERVICE_NAME: service_name, SERVICE_VERSION: __version__}
    return Resource.create({k: v for k, v in defaults.items() if k not in from_environment})


def _otlp_reader(
    otlp: OtlpConfig, read: Callable[[], list[Family]], resource: Resource
) -> MetricReader:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as error:  # the extra is optional
        raise RuntimeError(
            "OTLP push needs the otlp extra: pip install 'queue-exporter[otlp]'"
        ) from error
    return PeriodicExportingMetricReader(
        StoreExporter(OTLPMetricExporter(), read, resource),
        export_interval_millis=int(otlp.interval * 1000),
    )
