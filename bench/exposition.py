"""/metrics render cost, as ratios against references measured in the same run.

    .venv/bin/python bench/exposition.py [--series 75000] [--rounds 7]

The exporter in its default configuration (cap 10,000 samples per metric) holds `--series`
sampled series spread evenly over the ten sampled families (the shape of the Attune preset's
65k + 10k series). Timed in interleaved rounds after a warm-up round, medians shown:
- plain: a plain text writer, one f-string per series, no escaping (the floor);
- exporter: `Telemetry.render(False)`, the whole /metrics body (self-metrics included);
- prometheus_client: a custom collector yielding the same families, `generate_latest`.
All three outputs are parsed back and must hold the same samples.

First, with the same sampled series plus event counters and histograms for `--job-types`
job types (the cap folds most of them): the process's RSS before the first scrape and after
`--scrapes` + 10 scrapes (the bound: 1.3x), and four concurrent scrapes against one alone
(they share one render).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.lifecycle.metrics import EventMetrics, Tally
from exporter.output.catalog import SAMPLED, MetricSpec
from exporter.output.health import HealthBoard
from exporter.output.samples import LabelValues, SampleSet
from exporter.output.telemetry import Telemetry

Data = dict[MetricSpec, list[tuple[LabelValues, float]]]


def sampled_data(series: int) -> Data:
    per_family = series // len(SAMPLED)
    data: Data = {}
    for spec in SAMPLED:
        rows = []
        for n in range(per_family):
            values = {"system": "attune", "queue": f"pack.action_{n}", "priority": str(n % 4)}
            values |= {"state": "pending", "status": "running", "job_type": ""}
            rows.append((tuple(values[name] for name in spec.labels), float(n * 7 % 1000)))
        data[spec] = rows
    return data


def plain_writer(data: Data) -> bytes:
    out = []
    for spec, rows in data.items():
        out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {spec.kind}\n")
        names = spec.labels
        for labels, value in rows:
            pairs = ",".join(f'{name}="{label}"' for name, label in zip(names, labels, strict=True))
            out.append(f"{spec.name}{{{pairs}}} {value}\n")
    return "".join(out).encode()


def reference_registry(data: Data) -> CollectorRegistry:
    class Reference:
        def collect(self) -> Iterable[Metric]:
            for spec, rows in data.items():
                family: Metric
                if spec.kind == "counter":
                    family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
                else:
                    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
                for labels, value in rows:
                    family.add_metric(labels, value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reference())  # type: ignore[arg-type]
    return registry


def exporter_telemetry(data: Data) -> Telemetry:
    telemetry = Telemetry(HealthBoard())
    samples = SampleSet()
    for spec, rows in data.items():
        for labels, value in rows:
            samples.add_labelled(spec, labels, value)
    telemetry.publish("postgres:attune", samples)
    return telemetry


def read_back(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if not sample.name.startswith("queue_exporter_") and not sample.name.endswith("_created")
    }


def interleaved(
    candidates: dict[str, Callable[[], object]],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Each candidate's median time by `clock`, run in turn `rounds` times after a warm-up."""
    timings: dict[str, list[float]] = {name: [] for name in candidates}
    for round_ in range(rounds + 1):
        for name, action in candidates.items():
            started = clock()
            action()
            if round_:  # round 0 warms up
                timings[name].append(clock() - started)
    return {name: statistics.median(values) for name, values in timings.items()}


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def fill_histograms(telemetry: Telemetry, job_types: int) -> None:
    """Event counters and histograms for `job_types` label sets (the cap folds the rest)."""
    EventMetrics(telemetry, {})
    tally = Tally()
    for n in range(job_types):
        job = ("app", f"queue-{n % 50}", f"type-{n}", "")
        tally.count("queue_jobs_completed_total", job)
        for metric in ("queue_job_execution_seconds", "queue_job_wait_seconds"):
            tally.observe(metric, job, (n % 100) / 10)
    telemetry.store.apply(tally.counts, tally.observations)


def concurrent_scrapes(telemetry: Telemetry, scrapers: int) -> float:
    threads = [threading.Thread(target=telemetry.render, args=(False,)) for _ in range(scrapers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=75_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--job-types", type=int, default=100_000)
    args = parser.parse_args()
    data = sampled_data(args.series)
    memory_and_concurrency(data, args.job_types, args.scrapes)
    speed(data, args.rounds)


def memory_and_concurrency(data: Data, job_types: int, scrapes: int) -> None:
    """RSS before the first scrape and after many; four concurrent scrapes against one."""
    telemetry = exporter_telemetry(data)
    fill_histograms(telemetry, job_types)
    gc.collect()
    before = rss_mib()
    body = telemetry.render(False)
    samples = body.count(b"\n") - body.count(b"\n#")
    del body
    single = statistics.median(concurrent_scrapes(telemetry, 1) for _ in range(3))
    for _ in range(scrapes):
        telemetry.render(False)
    four = statistics.median(concurrent_scrapes(telemetry, 4) for _ in range(3))
    gc.collect()
    after = rss_mib()
    print(f"sampled series plus {job_types:,} job types of events (folded by the cap): "
          f"one scrape {samples:,} samples")  # fmt: skip
    print(f"RSS before the first scrape {before:.0f} MiB, after {scrapes + 10} scrapes "
          f"{after:.0f} MiB: {after / before:.2f}x (bound 1.3x)")  # fmt: skip
    print(f"four concurrent scrapes {four:.3f} s against one alone {single:.3f} s: "
          f"{four / single:.2f}x")  # fmt: skip
    telemetry.shutdown()


def speed(data: Data, rounds: int) -> None:
    reference = reference_registry(data)
    telemetry = exporter_telemetry(data)
    expected = read_back(plain_writer(data))
    assert len(expected) == sum(map(len, data.values()))
    assert read_back(telemetry.render(False)) == expected, "exporter: other samples"
    assert read_back(generate_latest(reference)) == expected, "prometheus_client: other samples"
    medians = interleaved(
        {
            "plain": lambda: plain_writer(data),
            "exporter": lambda: telemetry.render(False),
            "prometheus_client": lambda: generate_latest(reference),
        },
        rounds,
    )
    plain, ours, theirs = medians["plain"], medians["exporter"], medians["prometheus_client"]
    print(f"{len(expected):,} sampled series, same samples from all three; medians of {rounds}")
    print(f"plain text writer:  {plain:.3f} s")
    print(f"exporter render:    {ours:.3f} s = {ours / plain:.2f}x the plain writer")
    print(f"prometheus_client:  {theirs:.3f} s = {theirs / ours:.1f}x the exporter's time")
    telemetry.shutdown()


if __name__ == "__main__":
    main()
