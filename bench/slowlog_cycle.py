"""The longest single Redis command of one sampling cycle over a large keyspace, from SLOWLOG.

    .venv/bin/python bench/slowlog_cycle.py [--queues 100000] [--unrelated 100000]

A redis-server of the benchmark's own runs with `slowlog-log-slower-than 0`, so it logs every
command with its execution time (in the server, network excluded). It holds `--queues`
Orchestrata queue lists among `--unrelated` other keys; one full cycle of the orchestrata
preset runs with the default scan_count and pipeline_size; then the log is read back and
the longest commands are printed by command name. What matters to the observed Redis is that
no single command blocks it for long: SCAN COUNT and the pipelined per-key reads are each
short, however large the keyspace.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import load_keys, private_redis
from exporter.config import settings as config_module
from exporter.sources.redis_keys.sampler import RedisKeySampler

# A speed benchmark of every key: the memory cap of a cycle (the source's max_keys) lifted.
EVERY_KEY = 10**9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--unrelated", type=int, default=100_000)
    parser.add_argument("--scan-count", type=int, default=1000, help="sources.redis.scan_count")
    args = parser.parse_args()

    slowlog = ("--slowlog-log-slower-than", "0", "--slowlog-max-len", "2000000")
    with private_redis(*slowlog) as url:
        client = redis.Redis.from_url(url)
        load_keys(client, args.queues, args.unrelated)
        config = config_module.from_dict(
            {
                "presets": ["orchestrata"],
                "sources": {
                    "redis": {"url": url, "scan_count": args.scan_count, "max_keys": EVERY_KEY}
                },
            }
        )
        assert config.sources.redis is not None
        sampler = RedisKeySampler(config.sources.redis, 15.0)
        client.slowlog_reset()
        started = time.perf_counter()
        samples = sampler.sample().samples
        cycle = time.perf_counter() - started
        entries = client.slowlog_get(-1)
        sampler.close()
        report(entries, cycle, len(samples), args)


def report(entries: list[dict[str, object]], cycle: float, series: int, args: object) -> None:
    by_command: dict[str, list[int]] = collections.defaultdict(list)
    cycle_entries = []
    for entry in entries:
        words = bytes(entry["command"]).split()  # type: ignore[call-overload]
        name = words[0].decode().upper() if words else "?"
        if name == "SLOWLOG":  # the benchmark's own
            continue
        cycle_entries.append(entry)
        by_command[name].append(int(entry["duration"]))  # type: ignore[call-overload]
    longest = max(cycle_entries, key=lambda entry: int(entry["duration"]))  # type: ignore[call-overload]
    print(
        f"{args.queues} queue keys among {args.unrelated} others, "  # type: ignore[attr-defined]
        f"scan_count {args.scan_count}: cycle {cycle:.2f}s, "  # type: ignore[attr-defined]
        f"{series} series, {sum(len(d) for d in by_command.values())} commands logged"
    )
    print(f"{'command':>12} {'count':>8} {'p50 us':>8} {'p99 us':>8} {'max us':>8}")
    for name, durations in sorted(by_command.items(), key=lambda item: -max(item[1])):
        durations.sort()
        p50 = durations[len(durations) // 2]
        p99 = durations[min(len(durations) - 1, int(len(durations) * 0.99))]
        print(f"{name:>12} {len(durations):>8} {p50:>8} {p99:>8} {durations[-1]:>8}")
    command = bytes(longest["command"]).decode(errors="replace")[:120]  # type: ignore[call-overload]
    print(f"longest: {longest['duration']} us: {command}")


if __name__ == "__main__":
    main()
