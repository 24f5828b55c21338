"""The consumer's batch path apart from Redis: decode, tally and store against the floor's decode.

    .venv/bin/python bench/event_decode.py [--events 100000] [--rounds 7]
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='functools_reduce*' \\
        .venv/bin/python bench/event_decode.py --events 10000 --rounds 2 --only exporter

bench/event_ingest.py measures end to end, where Redis's CPU and a loaded host's noise weigh on
both sides. This reads the same stream's replies once (XRANGE, flat field lists as hiredis parses
them), then runs on fresh copies of them (new bytes objects, as from the socket): the exporter's
batch path (StreamConsumer._stream_entries and _apply: parse, validation, tallies, the store,
the self-metrics) and bench/event_ingest.py's floor decode, interleaved, the fastest round of
each by this thread's CPU time, after a check that both counted the same. Each side runs inside
functools.reduce, so callgrind's --toggle-collect counts the instructions of that side alone
(--only picks one side; divide by events x rounds).
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_ingest import STREAM, exporter_result, floor_decode, preload
from bench.key_sampling import RawRedis, private_redis
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.streams import consumer as consumer_module
from exporter.sources.streams.config import EventsSourceConfig, StreamConfig

Batch = list[list[Any]]


def read_batches(url: str, batch: int) -> list[Batch]:
    raw, batches, after = RawRedis(url), [], "-"
    while reply := raw.pipeline([("XRANGE", STREAM, after, "+", "COUNT", batch)])[0]:
        batches.append(reply)
        after = "(" + reply[-1][0].decode()
    raw.close()
    return batches


def fresh(batches: list[Batch]) -> list[Batch]:
    """New objects with the same bytes: no hash computed yet, as in a reply off the socket."""
    return [[[bytes(entry_id), [bytes(x) for x in flat]] for entry_id, flat in b] for b in batches]


def exporter_side(url: str) -> tuple[Telemetry, Any]:
    settings = EventsSourceConfig(
        streams=[StreamConfig(key=STREAM, system="bench", group="g", start="0")], consumer="b"
    )
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, settings.buckets())
    consumer = consumer_module.StreamConsumer(
        settings.streams[0], settings, RedisConnectionConfig(url=url), metrics
    )
    key = STREAM.encode()
    client = redis.Redis.from_url(url)  # what _apply reads with (a Runner-Q hash): unused here

    def one(_: Any, batch: Batch) -> None:
        consumer._apply(client, consumer_module._stream_entries([[key, batch]]))

    return telemetry, one


def floor_side() -> tuple[dict[tuple[str, str, str, str], int], Any]:
    """bench/event_ingest.py's bare loop's decode, batch by batch: the counts it fills, and
    the step."""
    counts: dict[tuple[str, str, str, str], int] = {}

    def one(_: Any, batch: Batch) -> None:
        floor_decode(batch, counts)

    return counts, one


def cpu(step: Any, batches: list[Batch]) -> float:
    started = time.thread_time()
    functools.reduce(step, batches, None)
    return time.thread_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=("exporter", "bare"))
    args = parser.parse_args()
    with private_redis() as url:
        preload(redis.Redis.from_url(url), STREAM, args.events)
        batches = read_batches(url, args.batch)
        telemetry, exporter = exporter_side(url)
        gc.freeze()  # as `serve` does once start-up is done
        counted, bare = floor_side()
        if args.only is None:  # both once, then the same counts by event and label set
            cpu(exporter, fresh(batches))
            cpu(bare, fresh(batches))
            assert exporter_result(telemetry)[0] == counted, "the two counted differently"
        times: dict[str, list[float]] = {"exporter": [], "bare": []}
        for _ in range(args.rounds):
            for name, step in (("bare", bare), ("exporter", exporter)):
                if args.only in (None, name):
                    times[name].append(cpu(step, fresh(batches)))
    for name, values in times.items():
        if values:
            print(f"{name:<9} {min(values) / args.events * 1e6:6.2f} µs of CPU per event (fastest)")
    if times["bare"] and times["exporter"]:
        print(f"exporter / bare: {min(times['exporter']) / min(times['bare']):.2f}")


if __name__ == "__main__":
    main()
