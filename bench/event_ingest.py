"""Event ingestion: the exporter's consumer against the leanest loop doing the same work, same run.

    .venv/bin/python bench/event_ingest.py [--events 1000000] [--rounds 3] [--batch 1000]

A redis-server of the benchmark's own holds one stream pre-loaded with a realistic mix (4
events per job: enqueued, dequeued, started with enqueued_at, completed or failed with a
duration and often an attempt; 5 queues x 20 job types x 4 priorities = 400 label sets). Two
loops read all of it, each in a consumer group of its own, in turn: a warm-up of each (which
also checks that both counted the same events), then `--rounds` interleaved rounds; medians.

- bare: the floor. One socket, hiredis to pack commands and parse replies; each round trip
  acknowledges the last batch and reads the next (XACK + XREADGROUP COUNT batch), and every
  entry's fields are decoded as the exporter decodes them (version and event name checked,
  labels decoded, ts, enqueued_at, duration and attempt as numbers) into counts by event and
  label set and the sums of execution and wait times.
- exporter: the events consumer in its default configuration (the stream read from its start,
  as `start: "0"`; claims and group stats on at their default intervals): position check,
  parsing and validation, tallies, the metrics store, its own self-metrics, the final ack.

Each is timed by the clock and by the CPU it costs, this process's and the redis-server's
together (the steadier figure on a shared host). Also measures the producer's cost per emit
call, and with --sdk-variant the consumer recording into OpenTelemetry SDK instruments.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import CostClock, RawRedis, private_redis
from exporter.lifecycle.metrics import EventMetrics
from exporter.lifecycle.producer import EventEmitter
from exporter.output.health import HealthBoard
from exporter.output.store import HistogramFamily, MetricStore, NumberFamily
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams.config import EventsSourceConfig, StreamConfig
from exporter.sources.streams.consumer import StreamConsumer

STREAM = "bench:event_ingest"
QUEUES = [f"queue-{n}" for n in range(5)]
JOB_TYPES = [f"job_type_{n}" for n in range(20)]
PRIORITIES = ["low", "normal", "high", "critical"]
ERROR_TYPES = ["retryable", "non_retryable", "timeout", "other"]
JOB_COUNTERS = ("enqueued", "dequeued", "started", "completed", "failed")

# (event, queue, job_type, priority) -> events; execution seconds summed; wait seconds summed.
Result = tuple[dict[tuple[str, str, str, str], int], float, float]


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


def floor_decode(
    entries: list[Any], counts: dict[tuple[str, str, str, str], int]
) -> tuple[float, float]:
    """The floor's work on a batch: each entry decoded and counted by event and label set; the
    batch's execution and wait seconds summed."""
    execution = wait = 0.0
    for _, flat in entries:
        pairs = iter(flat)  # a Redis entry has whole pairs: no strict zip's check
        fields = dict(zip(pairs, pairs, strict=False))
        if fields[b"v"] != b"1":
            raise ValueError("not a v1 event")
        ts = float(fields[b"ts"])
        key = (
            fields[b"event"].decode(),
            fields[b"queue"].decode(),
            fields[b"job_type"].decode(),
            fields[b"priority"].decode(),
        )
        counts[key] = counts.get(key, 0) + 1
        enqueued_at, duration = fields.get(b"enqueued_at"), fields.get(b"duration")
        if enqueued_at is not None:
            wait += max(ts - float(enqueued_at), 0.0)
        if duration is not None:
            execution += float(duration)
        attempt = fields.get(b"attempt")
        if attempt is not None:
            int(attempt)
    return execution, wait


def bare_loop(raw: RawRedis, group: str, batch: int) -> Result:
    """Read, decode and count every entry; each round trip acks the batch before."""
    raw.pipeline([("XGROUP", "CREATE", STREAM, group, "0")])
    read = ("XREADGROUP", "GROUP", group, "bare", "COUNT", batch, "STREAMS", STREAM, ">")
    counts: dict[tuple[str, str, str, str], int] = {}
    execution = wait = 0.0
    acks: list[bytes] = []
    while True:
        commands: list[tuple[object, ...]] = [("XACK", STREAM, group, *acks)] if acks else []
        reply: Any = raw.pipeline([*commands, read])[-1]
        if not reply:
            return counts, execution, wait
        entries = reply[0][1]
        spent, waited = floor_decode(entries, counts)
        execution += spent
        wait += waited
        acks = [entry_id for entry_id, _ in entries]


def consumer_loop(url: str, group: str, telemetry: Telemetry) -> int:
    """The consumer in its default configuration, polled until it has applied everything."""
    settings = EventsSourceConfig(
        streams=[StreamConfig(key=STREAM, system="bench", group=group, start="0")],
        consumer="bench",
    )
    metrics = EventMetrics(telemetry, settings.buckets())
    consumer = StreamConsumer(
        settings.streams[0],
        settings,
        RedisConnectionConfig(url=url),
        metrics,
        telemetry.health,
        telemetry.count_error,
    )
    applied = 0
    while True:
        got = consumer.poll()
        if not got and applied:
            break
        applied += got
    consumer.close()  # acknowledges the last batch
    return applied


def exporter_result(telemetry: Telemetry) -> Result:
    """The store's job counters and the sums of its execution and wait histograms."""
    counts: dict[tuple[str, str, str, str], int] = {}
    execution = wait = 0.0
    for family in telemetry.store.families():
        name = family.spec.name
        if isinstance(family, NumberFamily) and name.startswith("queue_jobs_"):
            event = name.removeprefix("queue_jobs_").removesuffix("_total")
            if event in JOB_COUNTERS:
                for labels, value in family.series.items():
                    key = (event, labels[1], labels[2], labels[3])
                    counts[key] = counts.get(key, 0) + int(value)
        elif isinstance(family, HistogramFamily) and name == "queue_job_execution_seconds":
            execution = sum(point[1] for point in family.series.values())
        elif isinstance(family, HistogramFamily) and name == "queue_job_wait_seconds":
            wait = sum(point[1] for point in family.series.values())
    return counts, execution, wait


def same_result(bare: Result, ours: Result, client: redis.Redis, events: int) -> None:
    """Both counted every event once, the same way; both groups acknowledged all of it."""
    assert bare[0] == ours[0], "the loops counted different events"
    assert sum(bare[0].values()) == events, (sum(bare[0].values()), events)
    for mine, theirs in zip(bare[1:], ours[1:], strict=True):
        assert abs(mine - theirs) <= 1e-6 * max(abs(mine), 1.0), (mine, theirs)
    for group in client.xinfo_groups(STREAM):
        assert group["pending"] == 0, group


class SdkStore(MetricStore):
    """The alternative measured: counters pre-aggregated per batch (one add per label set),
    histograms through the SDK's Histogram.record per observation. The plain entries of the
    frequent events go to the series they hold (`held`, the store's own), as in the exporter:
    this times the SDK for the others only."""

    def __init__(self, telemetry: Telemetry) -> None:
        super().__init__(telemetry.store.guard)
        self._meter = telemetry.meter
        self._instruments: dict[str, Any] = {}

    def apply(
        self, counts: Any, observations: Any, exemplars: Any = None, held: Any = None
    ) -> None:
        """The batch into SDK instruments (exemplars: not kept by this variant)."""
        from exporter.output.catalog import BY_NAME

        super().apply({}, {}, None, held)

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
    parser.add_argument("--batch", type=int, default=1000, help="the bare loop's COUNT")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each")
    parser.add_argument("--sdk-variant", action="store_true", help="also time SDK histograms")
    parser.add_argument("--producer-calls", type=int, default=100_000)
    args = parser.parse_args()

    with private_redis() as url:
        client = redis.Redis.from_url(url)
        started = time.perf_counter()
        preload(client, STREAM, args.events)
        seconds = time.perf_counter() - started
        print(f"pre-loaded {args.events:,} events in {seconds:.1f}s")
        raw = RawRedis(url)
        clock = CostClock(client)
        groups = iter(range(1_000_000))
        gc.freeze()  # as `serve` does once start-up is done (exporter/runtime/app.py)

        def exporter(store: type[MetricStore] | None = None) -> Result:
            telemetry = Telemetry(HealthBoard())
            if store is not None:
                telemetry.store = store(telemetry)  # type: ignore[call-arg]
            applied = consumer_loop(url, f"exporter-{next(groups)}", telemetry)
            assert applied == args.events, (applied, args.events)
            return exporter_result(telemetry)

        def bare() -> Result:
            return bare_loop(raw, f"bare-{next(groups)}", args.batch)

        same_result(bare(), exporter(), client, args.events)  # the warm-up of each
        for _ in range(args.rounds):
            clock.time("bare", bare)
            clock.time("exporter", exporter)
            if args.sdk_variant:
                clock.time("sdk", lambda: exporter(SdkStore))  # type: ignore[type-abstract]
        per_emit, per_job = producer_cost(client, STREAM + ":producer", args.producer_calls)
        raw.close()
        client.close()

    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"load average {load}; medians of {args.rounds} interleaved rounds")
    print(f"{'':<28} {'lifecycle/s':>10} {'ratio':>6} {'CPU µs/event':>13} {'ratio':>6}")
    bare_rate = args.events / clock.median("wall", "bare")
    bare_cpu = clock.median("cpu", "bare") / args.events * 1e6
    for name, label in (
        ("bare", "bare hiredis loop"),
        ("exporter", "exporter consumer"),
        ("sdk", "SDK histograms variant"),
    ):
        if name not in clock.wall:
            continue
        rate = args.events / clock.median("wall", name)
        cpu = clock.median("cpu", name) / args.events * 1e6
        print(
            f"{label:<28} {rate:>10,.0f} {rate / bare_rate:5.2f}x {cpu:>13.2f} {bare_cpu / cpu:5.2f}x"
        )
    print(f"producer: {per_emit:.2f} µs per emit(), {per_job:.2f} µs per job() (2 events)")


if __name__ == "__main__":
    main()
