"""Telemetry: the metrics store, the exporter's own instruments, /metrics and OTLP.

Everything the catalog's queue and job families hold lives in one store (store.py) and is
written by one renderer (exposition.py) for /metrics, and read by OTLP at export time
(otlp.py). OpenTelemetry has two roles, no more:
- the API of the exporter's own instruments (source up, durations, errors by reason, series
  overflow, events consumed...): a dozen self-metrics, exposed through
  opentelemetry-exporter-prometheus into the same exposition, under names the store never uses;
- the data model and exporter of OTLP, which carry the SDK's self-metrics and the store's
  families read at each push.

A source that fails withdraws its snapshot: its series disappear instead of going stale.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

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
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest as _untyped_text
from prometheus_client.openmetrics.exposition import generate_latest as _untyped_openmetrics

from exporter import __version__, exposition
from exporter.catalog import AUTH_FAILURE_REASONS, BY_NAME
from exporter.health import HealthBoard
from exporter.otlp import StoreExporter
from exporter.samples import SampleSet
from exporter.store import Family, MetricStore, SeriesGuard
from exporter.telemetry_config import LimitsConfig, OtlpConfig

# The SDK's own cap silently folds series; ours counts them, so the SDK's must never bind first.
_SDK_CARDINALITY = 1_000_000
_EOF = b"# EOF\n"
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
_Writer = Callable[[CollectorRegistry], bytes]
_write_text = cast(_Writer, _untyped_text)
_write_openmetrics = cast(_Writer, _untyped_openmetrics)


class Telemetry:
    def __init__(
        self,
        health: HealthBoard,
        limits: LimitsConfig | None = None,
        otlp: OtlpConfig | None = None,
    ) -> None:
        self.health = health
        self.limits = limits or LimitsConfig()
        # Held while a sampled source's series and its health change together (SourceRunner)
        # and while a render reads both: no scrape serves a source's new series beside its old
        # queue_exporter_source_up, or its old series beside the new.
        self.source_change = threading.Lock()
        return_large_buffers_to_the_system()
        self._self_registry = CollectorRegistry(auto_describe=False)
        limits_by_class: dict[type, int] = {
            kind: _SDK_CARDINALITY
            for kind in (Counter, UpDownCounter, Histogram, ObservableGauge, ObservableCounter)
        }
        readers: list[MetricReader] = [
            PrometheusMetricReader(
                disable_target_info=True,
                scope_info_enabled=False,
                registry=self._self_registry,
                cardinality_limits=limits_by_class,
            )
        ]
        if otlp is not None and otlp.enabled:
            # Reads the store at each push; the store itself is made below, once the provider
            # has the overflow counter its guard counts into.
            readers.append(_otlp_reader(otlp, lambda: self.store.families()))
        self.provider = MeterProvider(metric_readers=readers, resource=_resource())
        self.meter = self.provider.get_meter("queue-exporter", __version__)
        overflow = self.meter.create_counter(
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
        guard = SeriesGuard(
            self.limits.max_series_per_metric,
            self.limits.label_value_max_length,
            lambda metric, count: overflow.add(count, {"metric": metric}),
        )
        self.store = MetricStore(guard, self.limits.series_idle_timeout)
        self._register_self_gauges()
        self._renders = {
            openmetrics: SharedRender(functools.partial(self._render, openmetrics))
            for openmetrics in (False, True)
        }

    # -- sampled snapshots -------------------------------------------------------------------

    def publish(self, source: str, samples: SampleSet) -> None:
        """Replace everything `source` published before with this snapshot."""
        self.store.publish(source, samples)

    def withdraw(self, source: str) -> None:
        """Drop a failing source's series rather than serve them stale."""
        self.store.withdraw(source)

    # -- /metrics ----------------------------------------------------------------------------

    def render(self, openmetrics: bool) -> bytes:
        """The whole exposition, uncompressed: Prometheus text, or OpenMetrics when asked for.

        Concurrent scrapes share one render (SharedRender)."""
        return self._renders[openmetrics]()

    def _render(self, openmetrics: bool) -> bytes:
        with self.source_change:
            if openmetrics:
                own = _write_openmetrics(self._self_registry).removesuffix(_EOF)
            else:
                own = _write_text(self._self_registry)
            families = self.store.families()
        chunks = exposition.render(families, openmetrics)
        return b"".join([own, *chunks, _EOF if openmetrics else b""])

    # -- self-metrics --------------------------------------------------------------------------

    def count_auth_failure(self, reason: str) -> None:
        self._auth_failures.add(1, {"reason": reason})

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
            # The board holds no findings of a failing or standing-by source: none go stale.
            for report in self.health.key_groups():
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

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop, pushing a last OTLP export if enabled, within `timeout` seconds (the SDK
        abandons the push then: a hung collector must not hold the exit)."""
        self.provider.shutdown(timeout_millis=timeout * 1000)


class SharedRender:
    """One render at a time; a scrape that arrives while one is in progress waits for it and
    is answered with its result, instead of starting another.

    That is the only reuse: a scrape never gets a body whose render had finished before the
    scrape arrived, so what it sees is at most one render old. Four concurrent scrapes of a
    large exposition cost one render, and the body is let go as soon as the last scrape that
    waited for it has it.
    """

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render
        self._lock = threading.Lock()  # held for a whole render
        self._count_lock = threading.Lock()
        self._scrapes = 0  # in progress or waiting
        self._body = b""
        self._finished = float("-inf")

    def __call__(self) -> bytes:
        arrived = time.monotonic()
        with self._count_lock:
            self._scrapes += 1
        try:
            with self._lock:
                if self._finished >= arrived:  # rendered while this scrape waited
                    return self._body
                body = self._render()
                self._body, self._finished = body, time.monotonic()
                return body
        finally:
            with self._count_lock:
                self._scrapes -= 1
                if not self._scrapes:
                    self._body = b""


def return_large_buffers_to_the_system() -> None:
    """Have glibc give every allocation over 128 KiB back to the system when it is freed.

    A render's body and chunks are megabytes that live for one scrape. glibc raises its mmap
    threshold after such a buffer is freed, so the next ones come from the heap of whichever
    HTTP thread rendered, where they stay: RSS doubled over a few concurrent scrapes of a 100k
    sample exposition (bench/exposition.py); with the threshold fixed it stays within 1.2x.
    Elsewhere than glibc this does nothing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


def _resource() -> Resource:
    return Resource.create({"service.name": "queue-exporter", "service.version": __version__})


def _otlp_reader(otlp: OtlpConfig, read: Callable[[], list[Family]]) -> MetricReader:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as error:  # the extra is optional
        raise RuntimeError(
            "OTLP push needs the otlp extra: pip install 'queue-exporter[otlp]'"
        ) from error
    return PeriodicExportingMetricReader(
        StoreExporter(OTLPMetricExporter(), read, _resource()),
        export_interval_millis=int(otlp.interval * 1000),
    )
