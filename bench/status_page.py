"""/status.json cost, as a ratio against a /metrics render of the same data, in the same run.

    .venv/bin/python bench/status_page.py [--queues 10000] [--rounds 7]

The exporter in its default configuration holds `--queues` queue_depth and as many
queue_oldest_age_seconds series. Timed in interleaved rounds after a warm-up round, medians:
- render: `Telemetry.render(False)`, the whole /metrics body;
- status: one build of the page's document as JSON, uncached (the page reads the health board,
  the self-metrics' registry and the top queues from the store; no render, no parsing). Served,
  a build is shared by every request for a second (status_page.CACHE_SECONDS);
- parse-all: the same facts taken by parsing the whole exposition, the way the page first did.
The top queue of the page must be the deepest queue of the data.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.http.status_page import StatusPage
from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet
from exporter.output.telemetry import Telemetry


def loaded_telemetry(queues: int) -> Telemetry:
    telemetry = Telemetry(HealthBoard())
    samples = SampleSet()
    for n in range(queues):
        labels = ("orchestrata", f"queue-{n}", str(n % 4), "pending")
        samples.add_labelled(BY_NAME["queue_depth"], labels, float(n * 7 % 10007))
        samples.add_labelled(BY_NAME["queue_oldest_age_seconds"], labels, float(n % 600))
    telemetry.publish("redis", samples)
    return telemetry


def parse_all(telemetry: Telemetry) -> int:
    text = telemetry.render(False).decode()
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    telemetry = loaded_telemetry(args.queues)
    page = StatusPage(telemetry.health, telemetry.own_samples, telemetry.store.snapshot_series)
    top = json.loads(page.json())["top_depth"][0]
    assert top["value"] == max(n * 7 % 10007 for n in range(args.queues)), top
    runs: dict[str, Callable[[], object]] = {
        "render": lambda: telemetry.render(False),
        "status": lambda: json.dumps(page.document()),
        "parse-all": lambda: parse_all(telemetry),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_number in range(args.rounds + 1):  # round 0 warms up
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            if round_number:
                times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{args.queues} queues: render {median['render']:.3f}s, /status.json "
        f"{median['status']:.3f}s ({median['status'] / median['render']:.2f}x the render), "
        f"parsing the whole exposition {median['parse-all']:.3f}s "
        f"({median['parse-all'] / median['render']:.1f}x)"
    )
    telemetry.shutdown()


if __name__ == "__main__":
    main()
