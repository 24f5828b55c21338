"""A compressed soak: twelve hours of churn (queues, job types, error types and workers that
come and go) in a few seconds, with time driven by the event timestamps and an injected clock.

The event series stay within a bound set by the idle timeout, so do the SeriesGuard's slots
and the worker registry, and the process's RSS stops growing once warmed up.
"""

from __future__ import annotations

import gc
import os

from exporter.lifecycle.metrics import EventMetrics, Tally
from exporter.lifecycle.refusals import Refusals
from exporter.lifecycle.wire import encode
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.output.telemetry_config import LimitsConfig
from exporter.sources.readers.v1 import decode_v1
from exporter.sources.streams.config import EventsSourceConfig

STEP = 60.0  # one simulated minute per batch
HOURS = 12
IDLE_TIMEOUT = 900.0
STREAM = "soak:events"


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _batch(minute: int, now: float) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """One minute of events: 5 live queues (each lives ~50 min), 4 job types (~12 min),
    error types that rotate, and 20 workers (each ~40 min) heartbeating."""
    queues = [f"queue-{minute // 10 + i}" for i in range(5)]
    job_types = [f"type-{minute // 3 + i}" for i in range(4)]
    events: list[dict[str, str]] = []
    for index in range(150):
        queue, job_type = queues[index % 5], job_types[index % 4]
        job = {"queue": queue, "job_type": job_type, "priority": "default"}
        events.append(encode("enqueued", job, ts=now, validate=False))
        events.append(
            encode(
                "completed",
                {**job, "duration": 0.2, "enqueued_at": now - 3, "attempt": 1},
                ts=now,
                validate=False,
            )
        )
        if index % 25 == 0:
            error = f"error-{minute // 5}"  # unknown error types are folded into "other"
            events.append(encode("failed", {**job, "error_type": error}, ts=now, validate=False))
    for worker in range(20):
        events.append(
            encode(
                "worker_heartbeat",
                {
                    "queue": queues[worker % 5],
                    "worker": f"worker-{minute // 2 + worker}",
                    "active": worker % 3,
                    "capacity": 4,
                },
                ts=now,
                validate=False,
            )
        )
    return [
        (b"0-0", {key.encode(): value.encode() for key, value in entry.items()}) for entry in events
    ]


def test_twelve_hours_of_churn_stay_within_bounds():
    start = 1_700_000_000.0
    clock = Clock(start)
    telemetry = Telemetry(HealthBoard(), LimitsConfig(series_idle_timeout=IDLE_TIMEOUT))
    telemetry.store.clock = clock
    settings = EventsSourceConfig()
    metrics = EventMetrics(telemetry, settings.buckets())
    workers = metrics.worker_registry(timeout=120.0, max_workers=10_000)
    refusals = Refusals(STREAM)

    counts: list[int] = []
    rss: list[int] = []
    seen_queues: set[str] = set()
    for minute in range(int(HOURS * 3600 / STEP)):
        now = clock.now
        tally = Tally()
        decode_v1(_batch(minute, now), "app", now, settings.max_future, tally, refusals)
        assert not tally.invalid, tally.invalid
        metrics.record(STREAM, tally, workers)
        workers.prune(now)
        seen_queues.update(f"queue-{minute // 10 + i}" for i in range(5))
        counts.append(telemetry.store.series_count())
        if minute % 60 == 59:  # an hourly scrape renders (and sweeps) everything
            exposition = telemetry.render(False).decode()
            assert "queue_jobs_enqueued_total" in exposition
            gc.collect()
            rss.append(_rss_bytes())
        clock.now += STEP

    warm = int(2 * IDLE_TIMEOUT / STEP)
    plateau = max(counts[warm : warm * 3])
    assert max(counts[warm:]) <= plateau * 1.2, (plateau, max(counts[warm:]))
    # The churn was real: without expiry the series would have kept growing.
    assert len(seen_queues) > 70
    assert counts[-1] < len(seen_queues) * 4 * 3

    admitted = telemetry.store.guard.admitted_count()
    assert admitted <= plateau  # the guard's slots were released with the series
    assert len(workers._workers) <= 20 * 2
    # RSS: after the first hours, flat within a few MB (allocator noise), not growing per hour.
    assert rss[-1] - rss[2] < 16 * 1024 * 1024, [value // 1024 for value in rss]
    telemetry.shutdown()


def test_expiry_releases_guard_slots_so_new_series_are_admitted():
    clock = Clock(0.0)
    telemetry = Telemetry(
        HealthBoard(), LimitsConfig(series_idle_timeout=100.0, max_series_per_metric=3)
    )
    store = telemetry.store
    store.clock = clock
    metric = "queue_jobs_enqueued_total"
    store.apply({(metric, ("s", "a", "t", "p")): 1, (metric, ("s", "b", "t", "p")): 1}, {})
    store.apply({(metric, ("s", "c", "t", "p")): 1}, {})  # the cap: folded into overflow
    labels = {series for series in store._counters[metric]}
    assert ("__overflow__",) * 4 in labels

    clock.now = 200.0
    assert store.expire_idle() == 3
    store.apply({(metric, ("s", "c", "t", "p")): 1}, {})
    assert set(store._counters[metric]) == {("s", "c", "t", "p")}  # admitted now
    telemetry.shutdown()


def test_no_idle_timeout_keeps_every_series():
    clock = Clock(0.0)
    telemetry = Telemetry(HealthBoard(), LimitsConfig(series_idle_timeout=None))
    store = telemetry.store
    store.clock = clock
    store.apply({("queue_jobs_enqueued_total", ("s", "q", "t", "p")): 1}, {})
    clock.now = 10**9
    assert store.expire_idle() == 0
    assert store.series_count() == 1
    telemetry.shutdown()
