"""Event ingest benchmark: the consumer against the bare XREADGROUP + XACK loop, same stream, same run.

    .venv/bin/python bench/event_ingest.py [--events 1000000] [--redis-url redis://127.0.0.1:6379/0]

Pre-loads a stream with a realistic mix (4 events per job: enqueued, dequeued, started with
enqueued_at, completed or failed with a duration and often an attempt: ~2.5 histogram
observations per job; 5 queues x 20 job types x 4 priorities = 400 label sets), then reads
it in three consumer groups: the bare loop, the exporter's consumer, and (with
--sdk-variant) the consumer recording into OpenTelemetry SDK instruments per observation.
Also measures the producer's cost per emit call. Prints events/s and ratios; the keys it
writes (bench:event_ingest*) are deleted at the end. Database 0 by default: the test suite
claims empty databases from 15 down.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import redis

from exporter.events.config import EventsSourceConfig, StreamConfig
from exporter.events.consumer import StreamConsumer
from exporter.events.metrics import EventMetrics
from exporter.events.producer import EventEmitter
from exporter.health import HealthBoard
from exporter.redis_connection import RedisConnectionConfig
from exporter.store import MetricStore
from exporter.telemetry import Telemetry

QUEUES = [f"queue-{n}" for n in range(5)]
JOB_TYPES = [f"job_type_{n}" for n in range(20)]
PRIORITIES = ["low", "normal", "high", "critical"]
ERROR_TYPES = ["retryable", "non_retryable", "timeout", "other"]


def job_events(
    rng: random.Random, now: float, job_types: list[str] = JOB_TYPES
) -> list[dict[str, str]]:
    labels = {
        "queue": rng.choice(QUEUES),
        "job_type": rng.choice(job_types),
        "priority": rng.choice(PRIORITIES),
    }
    job_id = f"{rng.getrandbits(64):016x}"
    enqueued = now - rng.uniform(1, 60)
    started = enqueued + rng.expovariate(1 / 2)
    common = {"v": "1", "system": "bench", "job_id": job_id, **labels}
    end: dict[str, str] = {"ts": repr(started + 0.5), "duration": repr(rng.expovariate(2))}
    if rng.random() < 0.5:
        end["attempt"] = str(rng.randint(1, 3))
    if rng.random() < 0.9:
        end["event"] = "completed"
    else:
        end["event"] = "failed"
        end["error_type"] = rng.choice(ERROR_TYPES)
    return [
        {**common, "event": "enqueued", "ts": repr(enqueued)},
        {**common, "event": "dequeued", "ts": repr(started), "worker": "w1"},
        {**common, "event": "started", "ts": repr(started), "enqueued_at": repr(enqueued)},
        {**common, **end},
    ]


def preload(
    client: redis.Redis, stream: str, events: int, job_types: list[str] = JOB_TYPES
) -> None:
    rng = random.Random(42)
    now = time.time() - 100
    pipe = client.pipeline(transaction=False)
    written = 0
    while written < events:
        for entry in job_events(rng, now, job_types):
            if written == events:
                break
            pipe.xadd(stream, entry)  # type: ignore[arg-type]
            written += 1
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()


def bare_loop(client: redis.Redis, stream: str, group: str, batch: int) -> int:
    client.xgroup_create(stream, group, id="0")
    read = 0
    while True:
        reply: Any = client.xreadgroup(group, "bare", {stream: ">"}, count=batch)
        if not reply or not reply[0][1]:
            return read
        entries = reply[0][1]
        client.xack(stream, group, *[entry_id for entry_id, _ in entries])
        read += len(entries)


class SdkStore(MetricStore):
    """The alternative measured: counters pre-aggregated per batch (one add per label set),
    histograms through the SDK's Histogram.record per observation."""

    def __init__(self, telemetry: Telemetry) -> None:
        super().__init__(telemetry.store.guard)
        self._meter = telemetry.meter
        self._instruments: dict[str, Any] = {}

    def apply(self, counts: Any, observations: Any) -> None:
        from exporter.catalog import BY_NAME

        for (metric, labels), amount in counts.items():
            attributes = dict(zip(BY_NAME[metric].labels, labels, strict=True))
            self._instrument(metric, "counter").add(amount, attributes)
        for (metric, labels), values in observations.items():
            attributes = dict(zip(BY_NAME[metric].labels, labels, strict=True))
            histogram = self._instrument(metric, "histogram")
            for value in values:
                histogram.record(value, attributes)

    def _instrument(self, name: str, kind: str) -> Any:
        if name not in self._instruments:
            create = (
                self._meter.create_histogram if kind == "histogram" else self._meter.create_counter
            )
            self._instruments[name] = create(name)
        return self._instruments[name]


def consumer_loop(
    redis_url: str, stream: str, group: str, batch: int, sdk_histograms: bool
) -> tuple[int, Telemetry]:
    telemetry = Telemetry(HealthBoard())
    if sdk_histograms:
        telemetry.store = SdkStore(telemetry)
    settings = EventsSourceConfig(
        streams=[StreamConfig(key=stream, system="bench", group=group, start="0")],
        batch_size=batch,
        consumer="bench",
    )
    metrics = EventMetrics(telemetry, settings.buckets())
    consumer = StreamConsumer(
        settings.streams[0], settings, RedisConnectionConfig(url=redis_url), metrics
    )
    applied = 0
    consumer._next_claim = consumer._next_stats = float("inf")  # measured: the read path only
    while True:
        got = consumer.poll()
        if not got and applied:
            break
        applied += got
    consumer.close()
    return applied, telemetry


def timed(function: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def producer_cost(client: redis.Redis, stream: str, calls: int) -> tuple[float, float]:
    """µs per emit() call and per job() context (started + completed)."""
    emitter = EventEmitter(client, stream, buffer_size=calls * 3, batch_size=1000)
    started = time.perf_counter()
    for n in range(calls):
        emitter.emit("enqueued", queue="emails", job_type="send", priority="high", job_id=n)
    per_emit = (time.perf_counter() - started) / calls * 1e6
    started = time.perf_counter()
    for _ in range(calls // 2):
        with emitter.job("emails", "send", priority="high", enqueued_at=1.7e9, attempt=1):
            pass
    per_job = (time.perf_counter() - started) / (calls // 2) * 1e6
    emitter.close(timeout=60)
    return per_emit, per_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each loop")
    parser.add_argument("--sdk-variant", action="store_true", help="also time SDK histograms")
    parser.add_argument("--producer-calls", type=int, default=100_000)
    args = parser.parse_args()

    client = redis.Redis.from_url(args.redis_url)
    stream = "bench:event_ingest"
    client.delete(stream, stream + ":producer")
    seconds, _ = timed(preload, client, stream, args.events)
    print(f"pre-loaded {args.events} events in {seconds:.1f}s ({args.events / seconds:,.0f}/s)")

    rates: dict[str, list[float]] = {"bare": [], "consumer": [], "sdk": []}
    try:
        for round_ in range(args.rounds):
            seconds, read = timed(bare_loop, client, stream, f"bare-{round_}", args.batch)
            rates["bare"].append(read / seconds)
            seconds, (applied, _) = timed(
                consumer_loop, args.redis_url, stream, f"exporter-{round_}", args.batch, False
            )
            rates["consumer"].append(applied / seconds)
            if args.sdk_variant:
                seconds, (applied, _) = timed(
                    consumer_loop, args.redis_url, stream, f"sdk-{round_}", args.batch, True
                )
                rates["sdk"].append(applied / seconds)
        per_emit, per_job = producer_cost(client, stream + ":producer", args.producer_calls)
    finally:
        client.delete(stream, stream + ":producer")
        client.close()

    bare = statistics.median(rates["bare"])
    print(f"bare XREADGROUP + XACK loop: {bare:,.0f} events/s")
    for name, label in (("consumer", "exporter consumer"), ("sdk", "SDK histograms variant")):
        if rates[name]:
            rate = statistics.median(rates[name])
            print(f"{label}: {rate:,.0f} events/s = {rate / bare:.2f}x the bare loop")
    print(f"producer: {per_emit:.2f} µs per emit(), {per_job:.2f} µs per job() (2 events)")


if __name__ == "__main__":
    main()
