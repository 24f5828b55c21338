"""The demo's status line counts what the store and the exporter's own instruments hold, as
/metrics serves them: the queues of queue_depth, every line of every family, the events."""

from __future__ import annotations

from exporter.demo.status import StatusLine
from exporter.lifecycle.metrics import EventMetrics, Tally
from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet
from exporter.output.telemetry import Telemetry
from tests.conftest import parse_exposition


def test_the_status_line_counts_what_metrics_serves():
    telemetry = Telemetry(HealthBoard())
    try:
        events = EventMetrics(telemetry, {"queue_job_wait_seconds": (1.0, 5.0)})
        workers = events.worker_registry(60.0, 100)
        events.declare_stream("events", workers)
        samples = SampleSet()
        depth = BY_NAME["queue_depth"]
        for queue, state in (("a", "pending"), ("a", "active"), ("b", "pending")):
            samples.add(depth, {"system": "s", "queue": queue, "state": state}, 1.0)
        telemetry.publish("redis", samples)
        tally = Tally(consumed=7)
        tally.observe("queue_job_wait_seconds", ("s", "a", "t", ""), 2.0)
        events.record("events", tally, workers)

        line = StatusLine(telemetry.own_samples, telemetry.store.families).render(1.0, 0)

        served = len(parse_exposition(telemetry.render(False).decode()))
        assert "   2 queues" in line, line
        assert f"{served:6d} series" in line, (line, served)
        assert "lifecycle/s" in line and " 0 lifecycle/s" not in line, line
    finally:
        telemetry.shutdown()
