"""OTLP push: the same metrics, received by a small local OTLP/HTTP receiver."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from exporter import __version__
from exporter.lifecycle.producer import EventEmitter
from tests.conftest import wait_for


class _Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"

    def resources(self) -> list[dict[str, str]]:
        """Each pushed resource's attributes."""
        return [
            {
                attribute.key: attribute.value.string_value
                for attribute in resource.resource.attributes
            }
            for request in self.requests
            for resource in request.resource_metrics
        ]

    def metrics(self, name: str) -> list[Any]:
        """Every pushed metric of that name, oldest push first."""
        return metrics_named(self.requests, name)

    def gauge_points(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [
            (attributes(point), point.as_double or point.as_int)
            for metric in self.metrics(name)
            for point in metric.gauge.data_points
        ]


def metrics_named(requests: list[ExportMetricsServiceRequest], name: str) -> list[Any]:
    """The metrics of that name in these pushes, in their order."""
    return [
        metric
        for request in requests
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
    ]


def attributes(point: Any) -> dict[str, str]:
    """A data point's attributes, as the labels they carry."""
    return {a.key: a.value.string_value for a in point.attributes}


@pytest.fixture
def receiver():
    receiver = _Receiver()
    yield receiver
    receiver.server.shutdown()


def test_sampled_and_self_metrics_are_pushed(
    receiver, redis_client, redis_url, run_exporter, monkeypatch
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    for _ in range(3):
        redis_client.rpush("orchestrata:dlq:billing", "{}")
    run_exporter(
        {
            "otlp": {"enabled": True, "interval": 0.3},
            "presets": ["orchestrata"],
            "sources": {"redis": {"url": redis_url}},
        }
    )

    def pushed_depth():
        return [
            value
            for labels, value in receiver.gauge_points("queue_depth")
            if labels.get("queue") == "billing" and labels.get("state") == "dead_letter"
        ]

    assert wait_for(pushed_depth)[-1] == 3
    up = wait_for(lambda: receiver.gauge_points("queue_exporter_source_up"))
    assert ({"source": "redis"}, 1.0) in up
    assert {resource["service.name"] for resource in receiver.resources()} == {"queue-exporter"}
    assert {resource["service.version"] for resource in receiver.resources()} == {__version__}


def _push_self_metrics(receiver, run_exporter, monkeypatch, otlp: dict) -> list[dict[str, str]]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    run_exporter({"otlp": {"enabled": True, "interval": 0.3, **otlp}})
    wait_for(lambda: receiver.gauge_points("queue_exporter_build_info"))
    return receiver.resources()


def test_the_resource_carries_otel_resource_attributes(receiver, run_exporter, monkeypatch):
    # what the chart sets from the downward API, and a value percent-encoded as the spec asks
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "k8s.pod.name=queue-exporter-7d9f-x2x,k8s.namespace.name=queues,"
        "deployment.environment.name=pre%20prod",
    )
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    resources = _push_self_metrics(receiver, run_exporter, monkeypatch, {})
    for resource in resources:
        assert resource["k8s.pod.name"] == "queue-exporter-7d9f-x2x"
        assert resource["k8s.namespace.name"] == "queues"
        assert resource["deployment.environment.name"] == "pre prod"
        assert resource["service.name"] == "queue-exporter"
        assert resource["telemetry.sdk.name"] == "opentelemetry"  # the SDK's own detector


def test_the_service_name_is_settable(receiver, run_exporter, monkeypatch):
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    resources = _push_self_metrics(receiver, run_exporter, monkeypatch, {"service_name": "billing"})
    assert {resource["service.name"] for resource in resources} == {"billing"}


@pytest.mark.parametrize(
    "variable, value",
    [("OTEL_SERVICE_NAME", "from-env"), ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-env")],
)
def test_the_environment_names_the_service_over_the_setting(
    receiver, run_exporter, monkeypatch, variable, value
):
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv(variable, value)
    resources = _push_self_metrics(receiver, run_exporter, monkeypatch, {"service_name": "billing"})
    assert {resource["service.name"] for resource in resources} == {"from-env"}


def test_exemplars_ride_on_the_pushed_points(receiver, redis_url, run_exporter, monkeypatch):
    """A job's traceparent reaches the OTLP receiver as its points' exemplars (trace and span
    ids as bytes, the observed value, the event's time)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    stream = "shop:events"
    app = run_exporter(
        {
            "otlp": {"enabled": True, "interval": 0.3},
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": stream, "system": "shop"}], "block_ms": 50},
            },
        }
    )
    wait_for(lambda: app.health.snapshot()[f"events:{stream}"].up)
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    ended = time.time()
    emitter = EventEmitter(redis_url, stream, system="shop")
    job = {"queue": "billing", "job_type": "invoice"}
    emitter.emit(
        "completed", **job, ts=ended, duration=200.0, traceparent=f"00-{trace_id}-{span_id}-01"
    )
    emitter.emit("completed", **job, duration=0.01)  # no trace context: no exemplar
    emitter.close()

    def exemplars(name: str) -> list[Any]:
        found = []
        for metric in receiver.metrics(name):
            data = metric.histogram if metric.HasField("histogram") else metric.sum
            found += [e for point in data.data_points for e in point.exemplars]
        return found

    (histogram, *_) = wait_for(lambda: exemplars("queue_job_execution_seconds"))
    assert (histogram.trace_id.hex(), histogram.span_id.hex()) == (trace_id, span_id)
    assert histogram.as_double == 200.0
    assert abs(histogram.time_unix_nano / 1e9 - ended) < 1e-3
    (counted, *_) = wait_for(lambda: exemplars("queue_jobs_completed_total"))
    assert (counted.trace_id.hex(), counted.as_double) == (trace_id, 1.0)
    assert {e.trace_id.hex() for e in exemplars("queue_job_execution_seconds")} == {trace_id}
