"""Exemplars: what they cost a /metrics render and the store's memory, in the same run.

    .venv/bin/python bench/exemplars.py [--job-types 500] [--rounds 9] [--without-exemplars]

The event families of `--job-types` job types (one system, 50 queues), in the default
configuration (cap 10,000 samples per metric): the completed and failed counters and the
execution, wait and total histograms, fed through EventMetrics as the consumer feeds them.

Render, timed by the CPU it costs (the steadier figure on a shared host; a render is one
thread's work) in interleaved rounds after a warm-up round (medians):
- plain: a plain text writer of the same samples, one f-string per line (the floor);
- text, OpenMetrics: `Telemetry.render` of the store whose events carried no traceparent;
- OpenMetrics with exemplars: the same store, every bucket of every histogram series and every
  counter series keeping an exemplar (the most a store can hold).
All bodies parse back (prometheus_client's parsers) to the plain writer's samples; the
exemplars parse back to those put in, and the text body carries none.

Memory (tracemalloc): the store's bytes per histogram series and per counter series, without
exemplars and with one in every slot, each of its own trace (no id string shared).

Ingest: the CPU a `completed` event costs through metrics.apply and EventMetrics.record, in
batches of 1,000 (5 queues x 20 job types), with a traceparent (three exemplars: execution,
total, the counter) and without; parsing excluded (docs/benchmarks.md has the traceparent's
parse cost). Best of 7 interleaved rounds of 3 x 20 batches.

`--without-exemplars`: the render figures without exemplars alone, with nothing this
script needs from the store's exemplar API (the code before it ran them too).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.exposition import interleaved
from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics, Tally, apply
from exporter.output.health import HealthBoard
from exporter.output.store import HistogramFamily, NumberFamily
from exporter.output.telemetry import Telemetry

COUNTERS = ("queue_jobs_completed_total", "queue_jobs_failed_total")
HISTOGRAMS = ("queue_job_execution_seconds", "queue_job_wait_seconds", "queue_job_total_seconds")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def job_labels(n: int, metric: str) -> tuple[str, ...]:
    job = ("app", f"queue-{n % 50}", f"type-{n}", "")
    return (*job, "timeout") if metric == "queue_jobs_failed_total" else job


def filled(job_types: int) -> Telemetry:
    """A store holding the event families of `job_types` job types, without exemplars."""
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, {})
    tally = Tally()
    for n in range(job_types):
        for metric in COUNTERS:
            tally.count(metric, job_labels(n, metric), float(n % 7 + 1))
        for metric in HISTOGRAMS:
            for k in range(20):  # spread over the buckets
                tally.observe(metric, job_labels(n, metric), (n * 7 + k * 13) % 400 / 1.3)
    metrics.record("app:events", tally, metrics.worker_registry(60.0, 100))
    return telemetry


def every_slot_exemplified(telemetry: Telemetry, job_types: int) -> dict[Any, Any]:
    """An exemplar in every slot: one observation of its own trace per bucket of each histogram
    series, one per counter series. Returns what each slot should read back."""
    from exporter.output.store import Exemplar

    store = telemetry.store
    exemplars: dict[tuple[str, tuple[str, ...]], list[Exemplar]] = {}
    trace = 0
    for n in range(job_types):
        for metric in (*COUNTERS, *HISTOGRAMS):
            bounds = store.buckets(metric) if metric in HISTOGRAMS else ()
            values = [*bounds, bounds[-1] * 2] if bounds else [1.0]
            kept = exemplars[(metric, job_labels(n, metric))] = []
            for value in values:
                trace += 1
                kept.append(Exemplar(value, f"{trace:032x}", f"{trace:016x}", time.time()))
    counts = {key: 1.0 for key in exemplars if key[0] in COUNTERS}
    observations = {
        key: [exemplar.value for exemplar in kept]
        for key, kept in exemplars.items()
        if key[0] in HISTOGRAMS
    }
    store.apply(counts, observations, exemplars)
    return exemplars


def plain_writer(telemetry: Telemetry) -> bytes:
    """The event families' samples, one f-string per line, no escaping, no exemplars."""
    out = []
    for family in telemetry.store.families():
        spec = family.spec
        out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {spec.kind}\n")
        names = spec.labels
        if isinstance(family, NumberFamily):
            for labels, value in family.series.items():
                pairs = ",".join(f'{k}="{v}"' for k, v in zip(names, labels, strict=True))
                out.append(f"{spec.name}{{{pairs}}} {value}\n")
        elif isinstance(family, HistogramFamily):
            les = [*map(str, map(float, family.bounds)), "+Inf"]
            for labels, (buckets, total, count) in family.series.items():
                pairs = ",".join(f'{k}="{v}"' for k, v in zip(names, labels, strict=True))
                for le, cumulative in zip(les, accumulate(buckets), strict=True):
                    out.append(f'{spec.name}_bucket{{{pairs},le="{le}"}} {cumulative}\n')
                out.append(f"{spec.name}_count{{{pairs}}} {count}\n")
                out.append(f"{spec.name}_sum{{{pairs}}} {total}\n")
    return "".join(out).encode()


def read_back(body: bytes, openmetrics: bool) -> tuple[Samples, dict[Any, Any]]:
    """The event families' samples and their exemplars (name, labels, le -> exemplar)."""
    parse = parse_om if openmetrics else parse_text
    samples: Samples = {}
    exemplars = {}
    for family in parse(body.decode()):
        for sample in family.samples:
            if sample.name.startswith("queue_exporter_") or sample.name.endswith("_created"):
                continue
            key = (sample.name, frozenset(sample.labels.items()))
            samples[key] = sample.value
            if sample.exemplar is not None:
                exemplars[key] = sample.exemplar
    return samples, exemplars


def render_speed(job_types: int, rounds: int, exemplars: bool) -> None:
    bare = filled(job_types)
    expected, _ = read_back(plain_writer(bare), False)
    for openmetrics in (False, True):
        samples, kept = read_back(bare.render(openmetrics), openmetrics)
        assert samples == expected and not kept, "the renders hold other samples"
    candidates: dict[str, Callable[[], object]] = {
        "plain": lambda: plain_writer(bare),
        "text": lambda: bare.render(False),
        "openmetrics": lambda: bare.render(True),
    }
    if exemplars:
        traced = filled(job_types)
        wanted = every_slot_exemplified(traced, job_types)
        samples, kept = read_back(traced.render(True), True)
        assert len(kept) == sum(map(len, wanted.values())), (len(kept), len(wanted))
        assert not read_back(traced.render(False), False)[1], "exemplars in the text format"
        candidates["openmetrics, exemplars"] = lambda: traced.render(True)
    medians = interleaved(candidates, rounds, time.process_time)
    plain = medians["plain"]
    print(f"{len(expected):,} event samples ({job_types:,} job types); medians of {rounds}")
    for name, median in medians.items():
        print(
            f"{name + ':':24} {median * 1000:7.2f} ms CPU = {median / plain:.2f}x the plain writer"
        )


def store_bytes(build: Callable[[], Telemetry]) -> tuple[int, Telemetry]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    telemetry = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, telemetry


def memory(job_types: int) -> None:
    bare, kept_bare = store_bytes(lambda: filled(job_types))

    def with_exemplars() -> Telemetry:
        telemetry = filled(job_types)
        every_slot_exemplified(telemetry, job_types)
        return telemetry

    traced, kept_traced = store_bytes(with_exemplars)
    histogram_series = len(HISTOGRAMS) * job_types
    counter_series = len(COUNTERS) * job_types
    slots = len(kept_traced.store.buckets(HISTOGRAMS[0])) + 1
    # The exemplars' share, split by slots: a histogram series has `slots`, a counter one.
    per_slot = (traced - bare) / (histogram_series * slots + counter_series)
    print(
        f"store: {bare / 1024:,.0f} KiB without exemplars, {traced / 1024:,.0f} KiB with one in every slot"
    )
    print(
        f"per histogram series ({slots} slots): +{per_slot * slots:,.0f} bytes; per counter series: +{per_slot:,.0f} bytes"
    )
    print(
        f"({per_slot:,.0f} bytes per exemplar: its tuple, value, time, trace and span id strings)"
    )
    for telemetry in (kept_bare, kept_traced):
        telemetry.shutdown()


def completed_events(traced: bool) -> list[wire.Event]:
    """1,000 `completed` events as the consumer parses them, each of its own trace if traced."""
    now = time.time()
    events = []
    for n in range(1000):
        fields: dict[str, wire.FieldValue] = {"queue": f"q{n % 5}", "job_type": f"t{n % 20}"}
        fields |= {"duration": (n % 97) / 10, "enqueued_at": now - 5}
        if traced:
            fields["traceparent"] = f"00-{n + 1:032x}-{n + 1:016x}-01"
        entry = wire.encode("completed", fields, ts=now)
        events.append(wire.parse({key.encode(): value.encode() for key, value in entry.items()}))
    return events


def ingest_cost() -> None:
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, {})
    workers = metrics.worker_registry(60.0, 100)
    batches = {traced: completed_events(traced) for traced in (False, True)}

    def batch(traced: bool) -> None:
        tally = Tally()
        for event in batches[traced]:
            apply(tally, event, "app")
        metrics.record("app:events", tally, workers)

    best: dict[bool, float] = {False: float("inf"), True: float("inf")}
    for _ in range(7):
        for traced in (False, True):
            for _ in range(3):
                started = time.process_time()
                for _ in range(20):
                    batch(traced)
                best[traced] = min(best[traced], (time.process_time() - started) / 20_000)
    untraced, traced = best[False] * 1e6, best[True] * 1e6
    print(f"ingest, CPU per completed event: {untraced:.2f} µs untraced, {traced:.2f} µs traced")
    telemetry.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-types", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--without-exemplars", action="store_true")
    args = parser.parse_args()
    render_speed(args.job_types, args.rounds, not args.without_exemplars)
    if not args.without_exemplars:
        memory(args.job_types)
        ingest_cost()


if __name__ == "__main__":
    main()
