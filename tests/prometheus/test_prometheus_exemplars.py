"""From a slow bucket to the trace of a slow job: a real Prometheus with exemplar storage.

A real Prometheus (`--enable-feature=exemplar-storage`) scrapes the exporter (it asks for
OpenMetrics, the one format that carries exemplars). Jobs run inside real OpenTelemetry SDK
spans and report through the producer library, which takes each event's traceparent from the
active span; the trace ids the test compares with are the spans' own. Prometheus' answer to
`/api/v1/query_exemplars` must name the slowest jobs' traces in the top buckets, and the
text format (0.0.4) the same exporter serves must carry no exemplar.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from exporter.lifecycle.producer import EventEmitter
from exporter.runtime.app import App
from tests.conftest import scrape, wait_for
from tests.prometheus.test_prometheus_e2e import SCRAPE_JOB, Prometheus

STREAM = "shop:events"
QUEUE = {"queue": "billing", "job_type": "invoice"}
# The slow jobs, one per top bucket of queue_job_execution_seconds (le 60, 300, 3600, +Inf).
SLOW = {"60.0": 45.0, "300.0": 200.0, "3600.0": 1000.0, "+Inf": 5000.0}
FAST = [0.003, 0.02, 0.07, 0.2, 0.4]  # the bounds below 1 s, several jobs each


def _run_jobs(emitter: EventEmitter, durations: list[float]) -> dict[str, float]:
    """Each job's completion reported inside a span of its own: trace id -> duration."""
    tracer = TracerProvider().get_tracer("tests")  # a real SDK span, no global provider set
    traces = {}
    for duration in durations:
        with tracer.start_as_current_span("invoice") as span:
            emitter.emit("completed", **QUEUE, duration=duration)
        traces[f"{span.get_span_context().trace_id:032x}"] = duration
    return traces


def _exemplars(prometheus: Prometheus, query: str, since: float) -> list[dict[str, Any]]:
    """(series labels, exemplar) pairs Prometheus holds for `query` since `since`."""
    data = prometheus.api(
        "query_exemplars", query=query, start=str(since - 60), end=str(time.time() + 60)
    )
    return [
        {"series": found["seriesLabels"], **exemplar}
        for found in data
        for exemplar in found["exemplars"]
    ]


def test_query_exemplars_names_the_slowest_jobs_traces(
    redis_url: str, run_exporter: Callable[..., App], tmp_path: Path
) -> None:
    app = run_exporter(
        {
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": STREAM, "system": "shop"}], "block_ms": 50},
            }
        }
    )
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    prometheus = Prometheus(
        tmp_path, [f"127.0.0.1:{app.server.port}"], ("--enable-feature=exemplar-storage",)
    )
    try:
        wait_for(prometheus.ready, timeout=30)
        wait_for(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), timeout=60)
        since = time.time()
        emitter = EventEmitter(redis_url, STREAM, system="shop")
        # The slow jobs first: the fast ones after them must not push them out.
        slow = _run_jobs(emitter, list(SLOW.values()))
        fast = _run_jobs(emitter, FAST * 8)
        emitter.close()
        assert emitter.sent == len(slow) + len(fast)

        selector = f'{{job="{SCRAPE_JOB}",system="shop",queue="billing"}}'
        buckets = f"queue_job_execution_seconds_bucket{selector}"

        def top_buckets() -> dict[str, dict[str, Any]]:
            found = _exemplars(prometheus, buckets, since)
            top = {e["series"]["le"]: e for e in found if e["series"]["le"] in SLOW}
            return top if len(top) == len(SLOW) else {}

        top = wait_for(top_buckets, timeout=60)
        for le, exemplar in top.items():
            trace_id = exemplar["labels"]["trace_id"]
            assert slow.get(trace_id) == SLOW[le], (le, exemplar, slow)
            assert float(exemplar["value"]) == SLOW[le]
            assert len(exemplar["labels"]["span_id"]) == 16
            assert since - 5 <= exemplar["timestamp"] <= time.time() + 5
        # Every exemplar Prometheus holds for the series is one of the workload's jobs, in the
        # bucket of its duration; the slow ones only in theirs.
        everything = _exemplars(prometheus, buckets, since)
        for exemplar in everything:
            duration = {**slow, **fast}[exemplar["labels"]["trace_id"]]
            assert float(exemplar["value"]) == duration
            le = exemplar["series"]["le"]
            assert duration <= (float("inf") if le == "+Inf" else float(le)), exemplar
        # The completions counter: the trace of one of them.
        completed = wait_for(
            lambda: _exemplars(prometheus, f"queue_jobs_completed_total{selector}", since)
        )
        assert {e["labels"]["trace_id"] for e in completed} <= {*slow, *fast}
        assert all(float(e["value"]) == 1 for e in completed)
    finally:
        prometheus.stop()

    text = scrape(app.server.port)  # no Accept header: the 0.0.4 text format
    assert 'queue_job_execution_seconds_bucket{system="shop",queue="billing"' in text
    assert " # {" not in text and "trace_id" not in text
