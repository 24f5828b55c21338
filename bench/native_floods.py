"""What floods of hostile records cost the native readers and SQL collectors, bounded and not
(issue 23's attacks 10, 11 and 15, kombu's unacked hash and RQ's registries).

    .venv/bin/python bench/native_floods.py [--hostnames 400000] [--queues 300000]
        [--rows 1000000] [--entries 200000] [--postgres DSN] [--cases celery,rq,...]

Each case runs in a process of its own (its RSS is its own), twice: with the limits the
exporter ships, and with the limit lifted (the constant set past the flood, as the code was
before the limit existed), against a private redis-server or the given PostgreSQL:
- celery: heartbeats from --hostnames distinct hostnames, 50,000 a read; RSS after an idle
  read and after the flood was read (the worker table: MAX_WORKERS);
- rq: one worker hash listing --queues queues beside a busy worker; a read's median time over
  5 reads, against a read without the flood (queues per worker: MAX_QUEUES_PER_WORKER);
- sql: a collector whose query returns --rows rows; peak RSS of a run, against a run of a
  query of max_rows rows (collector max_rows, 10,000 here);
- unacked: kombu's `unacked` hash flooded with --entries entries; peak RSS and time of a read,
  against a read of a handful (entries per read: MAX_UNACKED);
- registry: --entries members flooded into RQ's finished registry between two reads, scored
  below the newest it counted (a shorter TTL's); peak RSS and time of the read that meets them,
  against a read of empty registries (new members per registry and read: rq_windows.MAX_NEW).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 2**20


def _rss(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _envelope(body: object) -> bytes:
    raw = base64.b64encode(json.dumps(body).encode()).decode()
    properties = {"body_encoding": "base64", "delivery_tag": "x"}
    return json.dumps({"body": raw, "headers": {}, "properties": properties}).encode()


def celery(hostnames: int, bounded: bool) -> dict[str, float]:
    import redis

    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers import celery as celery_module
    from exporter.sources.readers.config import CeleryReaderConfig
    from exporter.sources.readers.framework import Signals
    from tests.private_redis import PrivateRedis

    if not bounded:
        celery_module.MAX_WORKERS = hostnames + 1
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            config = CeleryReaderConfig()
            reader = celery_module.CeleryReader(config, RedisConnectionConfig(url=server.url), 20.0)
            reader.read(Signals())
            idle = _rss()
            channel = "/0.celeryev/worker.heartbeat"
            now = time.time()
            took, reported, refused = 0.0, 0, 0
            # 50,000 hostnames a read: more at once overflows Redis's output buffer for a
            # subscriber (client-output-buffer-limit pubsub 32mb), which drops the reader
            for first in range(0, hostnames, 50_000):
                for start in range(first, min(first + 50_000, hostnames), 5000):
                    batch = [
                        {"type": "worker-heartbeat", "timestamp": now, "hostname": f"w{i}"}
                        for i in range(start, min(start + 5000, hostnames))
                    ]
                    client.publish(channel, _envelope(batch))
                started = time.perf_counter()
                signals = Signals()
                reader.read(signals)
                took = max(took, time.perf_counter() - started)
                reported = len(signals.tally.heartbeats)
                refused += sum(signals.tally.invalid.values())
            reader.close()
            return {
                "idle_mib": idle / MIB,
                "after_mib": _rss() / MIB,
                "ratio": _rss() / idle,
                "workers_reported": reported,
                "refused": refused,
                "longest_read_s": took,
            }
        finally:
            server.stop()


def rq(queues: int, bounded: bool) -> dict[str, float]:
    import redis

    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers import framework
    from exporter.sources.readers import rq as rq_module
    from exporter.sources.readers.config import RqReaderConfig
    from exporter.sources.readers.framework import Signals
    from tests.private_redis import PrivateRedis

    if not bounded:
        framework.MAX_QUEUES_PER_WORKER = rq_module.MAX_QUEUES_PER_WORKER = queues + 1
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            client.sadd("rq:workers", "rq:worker:busy", "rq:worker:flood")
            client.hset("rq:worker:busy", mapping={"state": "busy", "queues": "default"})
            reader = rq_module.RqReader(RqReaderConfig(), RedisConnectionConfig(url=server.url))

            def median_read() -> float:
                times = []
                for _ in range(5):
                    started = time.perf_counter()
                    reader.read(Signals())
                    times.append(time.perf_counter() - started)
                return statistics.median(times)

            reader.read(Signals())
            reference = median_read()
            flood = ",".join(f"q{index}" for index in range(queues))
            client.hset("rq:worker:flood", mapping={"state": "idle", "queues": flood})
            flooded = median_read()
            reader.close()
            return {"reference_s": reference, "flood_s": flooded, "ratio": flooded / reference}
        finally:
            server.stop()


def sql(rows: int, bounded: bool, dsn: str) -> dict[str, float]:
    from exporter.sources.postgres import source as postgres
    from exporter.sources.postgres.config import PostgresSourceConfig

    max_rows = 10_000

    def collector(count: int) -> dict[str, object]:
        query = f"SELECT 'q' || i AS queue, i::float8 AS depth FROM generate_series(1, {count}) i"
        return {
            "name": f"rows{count}",
            "query": query,
            "labels": ["queue"],
            "values": [{"column": "depth", "metric": f"bench_depth_{count}"}],
            "max_rows": max_rows if bounded else rows + 1,
        }

    config = PostgresSourceConfig.model_validate(
        {"dsn": dsn, "collectors": [collector(max_rows), collector(rows)]}
    )
    reference, flood = postgres.build_sources(config, 5.0)
    try:
        _reset_peak()
        reference.sample()
        idle = _rss("VmHWM")
        _reset_peak()
        started = time.perf_counter()
        flood.sample()
        took = time.perf_counter() - started
        peak = _rss("VmHWM")
        return {"reference_peak_mib": idle / MIB, "flood_peak_mib": peak / MIB,
                "ratio": peak / idle, "run_s": took}  # fmt: skip
    finally:
        reference.close()
        flood.close()


def _fill(client: Any, script: str, key: str, entries: int, argument: object) -> None:
    """Written by Redis itself (a Lua loop): the bench's process stays as it was."""
    loop = f"for i = 1, {entries} do {script} end"
    client.eval(loop, 1, key, argument)


def unacked(entries: int, bounded: bool) -> dict[str, float]:
    import redis

    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers import celery as celery_module
    from exporter.sources.readers.config import CeleryReaderConfig
    from exporter.sources.readers.framework import Signals
    from tests.private_redis import PrivateRedis

    if not bounded:
        celery_module.MAX_UNACKED = entries + 1
    message = {"headers": {"id": "ID"}, "body": "x" * 200, "properties": {}}
    entry = json.dumps([message, "", "flood"])
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            client.hset("unacked", "good", entry)
            config, connection = CeleryReaderConfig(), RedisConnectionConfig(url=server.url)
            reader = celery_module.CeleryReader(config, connection, 20.0)
            _reset_peak()
            started = time.perf_counter()
            reader.read(Signals())
            reference = time.perf_counter() - started
            idle = _rss("VmHWM")
            script = "redis.call('HSET', KEYS[1], 'f' .. i, (ARGV[1]:gsub('ID', 'f' .. i)))"
            _fill(client, script, "unacked", entries, entry)
            _reset_peak()
            started = time.perf_counter()
            reader.read(Signals())
            took = time.perf_counter() - started
            peak = _rss("VmHWM")
            reader.close()
            return {"idle_peak_mib": idle / MIB, "flood_peak_mib": peak / MIB,
                    "ratio": peak / idle, "reference_s": reference, "read_s": took}  # fmt: skip
        finally:
            server.stop()


def registry(entries: int, bounded: bool) -> dict[str, float]:
    import redis

    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers import rq as rq_module
    from exporter.sources.readers import rq_windows
    from exporter.sources.readers.config import RqReaderConfig
    from exporter.sources.readers.framework import Signals
    from tests.private_redis import PrivateRedis

    if not bounded:
        rq_windows.MAX_NEW = rq_windows.MAX_REMEMBERED = entries + 1
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            client.sadd("rq:queues", "rq:queue:default")
            reader = rq_module.RqReader(RqReaderConfig(), RedisConnectionConfig(url=server.url))
            reader.read(Signals())
            _reset_peak()
            started = time.perf_counter()
            reader.read(Signals())
            reference = time.perf_counter() - started
            idle = _rss("VmHWM")
            script = "redis.call('ZADD', KEYS[1], ARGV[1] + i / 1000, 'flood' .. i)"
            _fill(client, script, "rq:finished:default", entries, time.time())
            _reset_peak()
            started = time.perf_counter()
            reader.read(Signals())
            took = time.perf_counter() - started
            peak = _rss("VmHWM")
            reader.close()
            return {"idle_peak_mib": idle / MIB, "flood_peak_mib": peak / MIB,
                    "ratio": peak / idle, "reference_s": reference, "read_s": took}  # fmt: skip
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostnames", type=int, default=400_000)
    parser.add_argument("--queues", type=int, default=300_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--postgres", default="host=127.0.0.1 user=postgres dbname=postgres")
    parser.add_argument("--cases", default="celery,rq,sql,unacked,registry")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--unbounded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        bounded = not args.unbounded
        result = {
            "celery": lambda: celery(args.hostnames, bounded),
            "rq": lambda: rq(args.queues, bounded),
            "sql": lambda: sql(args.rows, bounded, args.postgres),
            "unacked": lambda: unacked(args.entries, bounded),
            "registry": lambda: registry(args.entries, bounded),
        }[args.case]()
        print(json.dumps(result))
        return
    for case in args.cases.split(","):
        for unbounded in (False, True):
            command = [sys.executable, __file__, "--case", case, *sys.argv[1:]]
            command += ["--unbounded"] if unbounded else []
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            figures = json.loads(done.stdout)
            shown = ", ".join(f"{key} {value:.3g}" for key, value in figures.items())
            print(f"{case:7} {'unbounded' if unbounded else 'bounded':9} {shown}", flush=True)


if __name__ == "__main__":
    main()
