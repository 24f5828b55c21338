"""Telemetry: the metrics store, the exporter's own instruments, /metrics and OTLP.

Everything the catalog's queue and job families hold lives in one store (store.py) and is
written by one renderer (exposition.py) for /metrics, and read by OTLP at export time
(otlp.py). OpenTelemetry has two roles, no more (self_metrics.py):
- the API of the exporter's own instruments (source up, durations, errors by reason, series
  overflow, events consumed...): a dozen self-metrics, exposed through
  opentelemetry-exporter-prometheus into the same exposition, under names the store never uses;
- the data model and exporter of OTLP, which carry the SDK's self-metrics and the store's
  families read at each push.

A source that fails withdraws its snapshot: its series disappear instead of going stale.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import platform
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.core.printable import printable
from exporter.output import exposition
from exporter.output.catalog import BY_NAME
from exporter.output.conventions import with_conventions
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet, Series
from exporter.output.store import Family, MetricStore, NumberFamily, SeriesGuard
from exporter.output.telemetry_config import LimitsConfig, OtlpConfig

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from prometheus_client.samples import Sample

    from exporter.output.self_metrics import SelfMetrics

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


class Telemetry:
    def __init__(
        self,
        health: HealthBoard,
        limits: LimitsConfig | None = None,
        otlp: OtlpConfig | None = None,
        *,
        self_metrics_later: bool = False,
        messaging_conventions: bool = False,
    ) -> None:
        """With `self_metrics_later` the SDK's instruments wait for build_self_metrics() (serve
        answers its first scrapes before the SDK loads): until then /metrics carries
        queue_exporter_build_info alone, and refused logins are counted when they are built."""
        self.health = health
        self.limits = limits or LimitsConfig()
        self.otlp = otlp
        # Also serve OpenTelemetry's messaging semantic-convention names (conventions.py).
        self.messaging_conventions = messaging_conventions
        # Held while a sampled source's series and its health change together (SourceRunner)
        # and while a render reads both: no scrape serves a source's new series beside its old
        # queue_exporter_source_up, or its old series beside the new.
        self.source_change = threading.Lock()
        return_large_buffers_to_the_system()
        self.build_labels = {"version": __version__, "python": platform.python_version()}
        self._self_metrics: SelfMetrics | None = None
        self._handover = threading.Lock()  # auth failures held vs the self-metrics being built
        self._held_auth_failures: collections.Counter[str] = collections.Counter()
        guard = SeriesGuard(
            self.limits.max_series_per_metric,
            self.limits.label_value_max_length,
            lambda metric, count: self._built().count_overflow(metric, count),
        )
        self._fences: dict[str, Callable[[], bool]] = {}
        self._fence_lock = threading.Lock()
        # The fences the render on this thread has relied on so far (render_fenced).
        self._rendering = threading.local()
        self.store = MetricStore(guard, self.limits.series_idle_timeout, serves=self._serves)
        self._line_starts = exposition.LineStarts()
        self._renders = {
            openmetrics: SharedRender(functools.partial(self._render, openmetrics))
            for openmetrics in (False, True)
        }
        if not self_metrics_later:
            self.build_self_metrics()

    def build_self_metrics(self) -> None:
        """The SDK's instruments, once; the sources are built after them (they count into them)."""
        if self._self_metrics is not None:
            return
        from exporter.output.self_metrics import SelfMetrics

        built = SelfMetrics(self.health, self.build_labels, self.otlp, self._pushed_families)
        with self._handover:
            for reason, count in self._held_auth_failures.items():
                built.count_auth_failure(reason, count)
            self._held_auth_failures.clear()
            self._self_metrics = built

    @property
    def meter(self) -> Meter:
        """The SDK's meter, for the instruments of event streams, readers and the lease."""
        return self._built().meter

    def _built(self) -> SelfMetrics:
        if self._self_metrics is None:
            raise RuntimeError("the self-metrics are not built yet (build_self_metrics)")
        return self._self_metrics

    # -- sampled snapshots -------------------------------------------------------------------

    def publish(
        self, source: str, samples: SampleSet, fence: Callable[[], bool] | None = None
    ) -> None:
        """Replace everything `source` published before with this snapshot. With a `fence`
        (Leadership.fence) the snapshot is served only while it returns True, checked at every
        read of the store: series taken under a lease are never served past it."""
        with self._fence_lock:
            if fence is None:
                self._fences.pop(source, None)
            else:
                self._fences[source] = fence
        self.store.publish(source, samples)

    def withdraw(self, source: str) -> None:
        """Drop a failing source's series rather than serve them stale."""
        self.store.withdraw(source)

    def _serves(self, source: str) -> bool:
        """Whether `source`'s snapshot may be served now (its lease, if any, still held)."""
        with self._fence_lock:
            fence = self._fences.get(source)
        if fence is None:
            return True
        held = fence()
        relied_on: list[Callable[[], bool]] | None = getattr(self._rendering, "fences", None)
        if held and relied_on is not None:
            relied_on.append(fence)
        return held

    # -- /metrics ----------------------------------------------------------------------------

    def render(self, openmetrics: bool) -> bytes:
        """The whole exposition's bytes, for a reader that sends nothing on (tests, tools):
        render_fenced()'s body."""
        return self.render_fenced(openmetrics).body

    def render_fenced(self, openmetrics: bool) -> exposition.Rendered:
        """The whole exposition, uncompressed (Prometheus text, or OpenMetrics when asked for),
        with the fences of the leases its sampled series were served under. The HTTP server
        asks the result's still_served() right before it writes the body: a process stopped
        (SIGSTOP, a long GC or swap) between the render and the write must not send, on
        resuming, series of a lease that passed to another replica meanwhile.

        A stop between that check and the write cannot be caught (no check is atomic with the
        write it guards against a stop): that one body is sent on resuming as it was checked.
        Its series are those of a lease held at the check, and Prometheus stamps them with the
        scrape's start, before the check, so before another replica could take the lease.

        Concurrent scrapes share one render (SharedRender), and with it its fences."""
        return self._renders[openmetrics]()

    def _render(self, openmetrics: bool) -> exposition.Rendered:
        fences: list[Callable[[], bool]] = []
        self._rendering.fences = fences
        try:
            with self.source_change:
                own = self._own(openmetrics)
                families = self.store.families()
        finally:
            self._rendering.fences = None
        if self.messaging_conventions:
            families = with_conventions(families, otlp=False)
        chunks = exposition.render(families, openmetrics, self._line_starts)
        body = b"".join([*own, *chunks, exposition.OPENMETRICS_EOF if openmetrics else b""])
        return exposition.Rendered(body, tuple(fences))

    def _pushed_families(self) -> list[Family]:
        """What an OTLP push carries of the store."""
        families = self.store.families()
        return with_conventions(families, otlp=True) if self.messaging_conventions else families

    def _own(self, openmetrics: bool) -> list[bytes]:
        if self._self_metrics is not None:
            return [self._self_metrics.render(openmetrics)]
        # Before the SDK is loaded: the build, written by the store's own writer.
        spec = BY_NAME["queue_exporter_build_info"]
        build = tuple(self.build_labels[label] for label in spec.labels)
        family = NumberFamily(spec, Series([{build: 1.0}]))
        return exposition.render([family], openmetrics, exposition.LineStarts())

    # -- self-metrics --------------------------------------------------------------------------

    def own_samples(self) -> list[Sample]:
        """The exporter's own instruments' samples, structured (the status page reads them):
        none before the SDK is built."""
        return self._self_metrics.samples() if self._self_metrics is not None else []

    def count_auth_failure(self, reason: str) -> None:
        built = self._self_metrics
        if built is None:
            with self._handover:  # held until build_self_metrics, unless it just finished
                built = self._self_metrics
                if built is None:
                    self._held_auth_failures[reason] += 1
                    return
        built.count_auth_failure(reason)

    def count_error(
        self, source: str, reason: str, count: int = 1, system: str = "", pattern: str = ""
    ) -> None:
        """Count an error; a key group's carries its system and pattern (else they are empty)."""
        # a label a person reads and types back: Celery's \x06\x16 shown as such
        labels = {
            "source": source,
            "reason": reason,
            "system": system,
            "pattern": printable(pattern),
        }
        self._built().count_error(labels, count)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop, pushing a last OTLP export if enabled, within `timeout` seconds (the SDK
        abandons the push then: a hung collector must not hold the exit)."""
        if self._self_metrics is not None:
            self._self_metrics.shutdown(timeout)


class SharedRender:
    """One render at a time; a scrape that arrives while one is in progress waits for it and
    is answered with its result, instead of starting another.

    That is the only reuse: a scrape never gets a body whose render had finished before the
    scrape arrived, so what it sees is at most one render old. Four concurrent scrapes of a
    large exposition cost one render, and the body is let go as soon as the last scrape that
    waited for it has it.
    """

    def __init__(self, render: Callable[[], exposition.Rendered]) -> None:
        self._render = render
        self._lock = threading.Lock()  # held for a whole render
        self._count_lock = threading.Lock()
        self._scrapes = 0  # in progress or waiting
        self._body: exposition.Rendered | None = None
        self._finished = float("-inf")

    def __call__(self) -> exposition.Rendered:
        arrived = time.monotonic()
        with self._count_lock:
            self._scrapes += 1
        try:
            with self._lock:
                if self._body is not None and self._finished >= arrived:
                    return self._body  # rendered while this scrape waited
                body = self._render()
                self._body, self._finished = body, time.monotonic()
                return body
        finally:
            with self._count_lock:
                self._scrapes -= 1
                if not self._scrapes:
                    self._body = None


def return_large_buffers_to_the_system() -> None:
    """Have glibc give every allocation over 128 KiB back to the system when it is freed.

    A render's body and chunks are megabytes that live for one scrape. glibc raises its mmap
    threshold after such a buffer is freed, so the next ones come from the heap of whichever
    HTTP thread rendered, where they stay: RSS doubled over a few concurrent scrapes of a 100k
    sample exposition (bench/exposition.py); with the threshold fixed it stays within 1.2x.
    Elsewhere than glibc this does nothing.
    """
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


def release_free_heap() -> None:
    """Hand the heap pages that start-up allocated and freed back to the system.

    Reading the configuration, building the models and importing the sources leave freed
    chunks across glibc's heap that it keeps for later allocations; an idle sidecar never
    makes them, so they would stay resident for the life of the pod. malloc_trim(0) returns
    every whole free page of every arena: 1.8-1.9 MiB of RSS at rest (docs/benchmarks.md, "At
    rest"). Elsewhere than glibc this does nothing.
    """
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def _glibc(function: str) -> Callable[..., int] | None:
    """A function of the C library the process runs on, None where it has none by that name
    (not glibc, or no C library to load)."""
    try:
        found: Callable[..., int] = getattr(ctypes.CDLL(None), function)
    except (AttributeError, OSError):
        return None
    return found
