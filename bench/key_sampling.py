"""Key sampling cost, as ratios against references measured in the same run.

    .venv/bin/python bench/key_sampling.py [--sizes 10000,100000] [--unrelated 100000] [--runs 3]

For each size: N Orchestrata queue lists (one JSON item each) among `--unrelated` other keys,
in a redis-server of the benchmark's own. Timed, median of --runs:
- bare: SCAN MATCH + pipelined LLEN + LINDEX 0 in rounds of 1000, no parsing (the floor);
- exporter: one full cycle of the orchestrata preset (depth and head age of every list, plus its
  dead-letter pattern);
- redis_exporter: a /metrics scrape of Debian's prometheus-redis-exporter --check-keys over the
  same keys (skipped, and said so, when the binary is absent).
The /metrics render has its own benchmark: bench/exposition.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import config as config_module
from exporter.health import HealthBoard
from exporter.sources.redis_keys import RedisKeySampler
from exporter.telemetry import Telemetry
from tests.private_redis import PrivateRedis, free_port

QUEUE_GLOB = "orchestrata:queue:*"


@contextmanager
def private_redis(*extra_args: str) -> Iterator[str]:
    """A redis-server of the benchmark's own (a free port, a temp dir); its URL."""
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory), *extra_args).start()
        try:
            yield server.url
        finally:
            server.stop()


def median_seconds(action: Callable[[], object], runs: int) -> float:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def load_keys(client: redis.Redis, queues: int, unrelated: int) -> None:
    client.flushdb()
    item = json.dumps(
        {
            "packet": {"n": 1},
            "queued_at": "2026-11-29T18:00:00+00:00",
            "priority": 2,
            "recipient": "r",
            "message_id": "m",
        }
    )
    pipe = client.pipeline(transaction=False)
    for index in range(queues):
        pipe.rpush(f"orchestrata:queue:recipient-{index}:p{index % 6}", item)
        if index % 5000 == 4999:
            pipe.execute()
    for index in range(unrelated):
        pipe.set(f"session:{index}", "x")
        if index % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def bare_loop(client: redis.Redis) -> int:
    keys = list(dict.fromkeys(client.scan_iter(match=QUEUE_GLOB, count=1000)))
    for start in range(0, len(keys), 500):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 500]:
            pipe.llen(key)
            pipe.lindex(key, 0)
        pipe.execute()
    return len(keys)


def redis_exporter_scrape(url: str, runs: int) -> float | None:
    binary = shutil.which("prometheus-redis-exporter")
    if binary is None:
        return None
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"-redis.addr={url}",
            f"-check-keys={QUEUE_GLOB}",
            f"-web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)

        def scrape() -> None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=600) as reply:
                reply.read()

        return median_seconds(scrape, runs)
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--unrelated", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    with private_redis() as url:
        client = redis.Redis.from_url(url)
        print(
            f"{'queue keys':>10} {'bare s':>8} {'exporter s':>10} {'ratio':>6} "
            f"{'redis_exporter s':>16} {'speed-up':>8}"
        )
        for size in (int(s) for s in args.sizes.split(",")):
            load_keys(client, size, args.unrelated)
            config = config_module.from_dict(
                {"presets": ["orchestrata"], "sources": {"redis": {"url": url}}}
            )
            assert config.sources.redis is not None
            sampler = RedisKeySampler(config.sources.redis, Telemetry(HealthBoard()), 15.0)
            assert bare_loop(client) == size
            bare = median_seconds(lambda: bare_loop(client), args.runs)
            ours = median_seconds(sampler.sample, args.runs)
            peer = redis_exporter_scrape(url, args.runs)
            peer_text = f"{peer:16.2f} {peer / ours:7.1f}x" if peer else f"{'absent':>16}"
            print(f"{size:>10} {bare:8.3f} {ours:10.3f} {ours / bare:5.2f}x {peer_text}")
            sampler.close()

        client.close()


if __name__ == "__main__":
    main()
