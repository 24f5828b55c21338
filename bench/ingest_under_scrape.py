"""Event ingestion while /metrics is scraped, against the same ingestion unscraped, same run.

    .venv/bin/python bench/ingest_under_scrape.py [--events 300000] [--job-types 250] [--rounds 2]

A redis-server of the benchmark's own holds one stream pre-loaded with `--events` v1 events of
bench/event_ingest.py's mix over 5 queues x `--job-types` job types x 4 priorities (5,000
label sets by default). An exporter in its default configuration (the whole app, HTTP server
included; cap 10,000 samples per metric) reads the stream from its start in a consumer group
of its own; a run ends when that group has every entry delivered and acknowledged. Runs
alternate, after a warm-up run: unscraped, then with /metrics fetched every `--scrape-every`
seconds over HTTP with gzip, as Prometheus does. Prints the lifecycle/s of both, their ratio
(the bound: 0.8x), and the size and duration of the scrapes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_ingest import preload
from exporter.config import settings as config_module
from exporter.runtime.app import App
from tests.private_redis import PrivateRedis

STREAM = "bench:ingest_under_scrape"


class Scraper(threading.Thread):
    """GET /metrics with gzip every `every` seconds until stopped; sizes and durations kept."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.every = every
        self.stopped = threading.Event()
        self.sizes: list[int] = []
        self.durations: list[float] = []

    def run(self) -> None:
        request = urllib.request.Request(self.url, headers={"Accept-Encoding": "gzip"})
        while not self.stopped.wait(self.every):
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=60) as reply:
                self.sizes.append(len(reply.read()))
            self.durations.append(time.perf_counter() - started)


def ingest(url: str, group: str, events: int, scrape_every: float | None) -> tuple[float, Scraper]:
    """Events/s of one exporter reading the stream to its end, scraped or not."""
    config = config_module.from_dict(
        {
            "listen_address": "127.0.0.1:0",
            "sources": {
                "redis": {"url": url},
                "events": {
                    "streams": [{"key": STREAM, "system": "bench", "group": group, "start": "0"}]
                },
            },
        }
    )
    client = redis.Redis.from_url(url)
    app = App(config)
    scraper = Scraper(app.server.port, scrape_every or 0.0)
    started = time.perf_counter()
    app.start()
    if scrape_every is not None:
        scraper.start()
    while not _group_done(client, group, events):
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    scraper.stopped.set()
    if scraper.is_alive():
        scraper.join()
    app.shutdown()
    client.close()
    return events / elapsed, scraper


def _group_done(client: redis.Redis, group: str, events: int) -> bool:
    for info in client.xinfo_groups(STREAM):
        if info["name"].decode() == group:
            return bool(info["entries-read"] == events and info["pending"] == 0)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--job-types", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            job_types = [f"type-{n}" for n in range(args.job_types)]
            preload(client, STREAM, args.events, job_types)
            client.close()
            ingest(server.url, "warm-up", args.events, args.scrape_every)
            rates: dict[str, list[float]] = {"unscraped": [], "scraped": []}
            scrapers = []
            for round_ in range(args.rounds):
                rate, _ = ingest(server.url, f"plain-{round_}", args.events, None)
                rates["unscraped"].append(rate)
                rate, scraper = ingest(
                    server.url, f"scraped-{round_}", args.events, args.scrape_every
                )
                rates["scraped"].append(rate)
                scrapers.append(scraper)
        finally:
            server.stop()

    unscraped = statistics.median(rates["unscraped"])
    scraped = statistics.median(rates["scraped"])
    sizes = [size for scraper in scrapers for size in scraper.sizes]
    durations = [duration for scraper in scrapers for duration in scraper.durations]
    label_sets = 5 * args.job_types * 4
    print(f"{args.events:,} events over {label_sets:,} label sets, medians of {args.rounds} runs")
    print(f"unscraped: {unscraped:,.0f} lifecycle/s")
    print(
        f"scraped every {args.scrape_every:g} s: {scraped:,.0f} lifecycle/s = "
        f"{scraped / unscraped:.2f}x unscraped (bound 0.8x)"
    )
    if durations:
        print(
            f"{len(durations)} scrapes: median {statistics.median(durations) * 1000:.0f} ms, "
            f"max {max(durations) * 1000:.0f} ms, up to {max(sizes) / 2**20:.1f} MiB gzipped"
        )


if __name__ == "__main__":
    main()
