"""Event metrics over OTLP: counters and histograms read from the metrics store at each push."""

from __future__ import annotations

import time

from exporter.lifecycle.producer import EventEmitter
from tests.conftest import wait_for
from tests.output.test_otlp import attributes, receiver  # noqa: F401  (the fixture)

STREAM = "otlp:events"


def _points(receiver, name: str, kind: str) -> list[tuple[dict[str, str], object]]:  # noqa: F811 (the fixture)
    return [
        (attributes(point), point)
        for metric in receiver.metrics(name)
        for point in getattr(metric, kind).data_points
    ]


def test_event_counters_and_histograms_are_pushed(
    receiver,  # noqa: F811
    redis_url,
    run_exporter,
    monkeypatch,
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
    app = run_exporter(
        {
            "otlp": {"enabled": True, "interval": 0.3},
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": STREAM, "system": "app"}], "block_ms": 50},
            },
        }
    )
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    with EventEmitter(redis_url, STREAM) as emitter:
        for duration in (0.5, 1.5):
            emitter.emit("completed", ts=time.time(), queue="q", job_type="t", duration=duration)

    def completed():
        return [
            point.as_double or point.as_int
            for labels, point in _points(receiver, "queue_jobs_completed_total", "sum")
            if labels.get("job_type") == "t"
        ]

    assert wait_for(lambda: 2 in completed())
    histograms = wait_for(lambda: _points(receiver, "queue_job_execution_seconds", "histogram"))
    labels, point = histograms[-1]
    assert labels == {"system": "app", "queue": "q", "job_type": "t", "priority": ""}
    assert (point.count, point.sum) == (2, 2.0)
    assert list(point.explicit_bounds)[:3] == [0.005, 0.01, 0.025]
