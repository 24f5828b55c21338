"""Key sampling cost, as ratios against references measured in the same run.

    .venv/bin/python bench/key_sampling.py [--sizes 10000,100000] [--unrelated 100000] [--runs 3]

For each size: N Orchestrata queue lists (one JSON item each) among `--unrelated` other keys,
in a redis-server of the benchmark's own. After a warm-up of each, bare loop and exporter cycle
run in turn --runs times (median); each is timed by the clock and by the CPU it costs, this
process's and the redis-server's together (the steadier figure on a shared host):
- bare: SCAN MATCH of the preset's two patterns + pipelined LLEN + LINDEX 0 in rounds of 1000
  commands over a raw socket, hiredis packing and parsing, no parsing of items (the floor);
- exporter: one full cycle of the orchestrata preset in its default configuration (depth and
  head age of every list, the head reads in one bounded script per round, plus a SCAN for its
  dead-letter pattern), checked to find the same keys and depths as the bare loop;
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
from urllib.parse import urlsplit

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import config as config_module
from exporter.health import HealthBoard
from exporter.sources.redis_keys import RedisKeySampler
from exporter.telemetry import Telemetry
from tests.private_redis import PrivateRedis, free_port

QUEUE_GLOB = "orchestrata:queue:*"
# The preset's two key groups: queue lists and dead-letter lists (none here, but scanned for).
PRESET_GLOBS = (QUEUE_GLOB, "orchestrata:dlq:*")


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


class RawRedis:
    """One socket, hiredis to pack commands and parse replies: nothing between them."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.reader = hiredis.Reader()

    def pipeline(self, commands: list[tuple[object, ...]]) -> list[object]:
        self.sock.sendall(b"".join(hiredis.pack_command(command) for command in commands))
        replies: list[object] = []
        while len(replies) < len(commands):
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(65536))
            else:
                replies.append(reply)
        return replies

    def close(self) -> None:
        self.sock.close()


def bare_loop(raw: RawRedis) -> dict[bytes, tuple[int, bytes | None]]:
    """Depth and head item of every key of the preset's patterns, read in rounds of 1000
    commands as SCAN goes."""
    found: dict[bytes, tuple[int, bytes | None]] = {}
    pending: list[bytes] = []

    def read_round() -> None:
        commands = [c for key in pending for c in (("LLEN", key), ("LINDEX", key, 0))]
        replies = raw.pipeline(commands)
        for index, key in enumerate(pending):
            found[key] = (replies[2 * index], replies[2 * index + 1])  # type: ignore[assignment]
        pending.clear()

    for glob in PRESET_GLOBS:
        cursor: object = b"0"
        while True:
            [(cursor, keys)] = raw.pipeline([("SCAN", cursor, "MATCH", glob, "COUNT", 1000)])
            pending.extend(key for key in keys if key not in found)  # SCAN may repeat a key
            if len(pending) >= 500:
                read_round()
            if cursor == b"0":
                break
    if pending:
        read_round()
    return found


class CostClock:
    """Wall time, and CPU time of this process plus the redis-server's (INFO cpu)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def _server_cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def time(self, name: str, action: Callable[[], object]) -> object:
        cpu, server, wall = time.process_time(), self._server_cpu(), time.perf_counter()
        result = action()
        self.wall.setdefault(name, []).append(time.perf_counter() - wall)
        cpu_used = time.process_time() - cpu + self._server_cpu() - server
        self.cpu.setdefault(name, []).append(cpu_used)
        return result

    def median(self, kind: str, name: str) -> float:
        return statistics.median((self.wall if kind == "wall" else self.cpu)[name])


def same_result(found: dict[bytes, tuple[int, bytes | None]], samples: object) -> None:
    """The exporter's cycle saw the keys and depths the bare loop saw, and an age per head."""
    series = {
        (spec.name, labels): value
        for spec, part in samples.metrics()  # type: ignore[attr-defined]
        for labels, value in part.items()
    }
    depths = [value for (name, _), value in series.items() if name == "queue_depth"]
    ages = [value for (name, _), value in series.items() if name == "queue_oldest_age_seconds"]
    assert len(depths) == len(found), (len(depths), len(found))
    assert sum(depths) == sum(depth for depth, _ in found.values())
    assert len(ages) == sum(head is not None for _, head in found.values())


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
            f"{'bare cpu s':>10} {'exporter cpu s':>14} {'ratio':>6} "
            f"{'redis_exporter s':>16} {'speed-up':>8}"
        )
        for size in (int(s) for s in args.sizes.split(",")):
            load_keys(client, size, args.unrelated)
            config = config_module.from_dict(
                {"presets": ["orchestrata"], "sources": {"redis": {"url": url}}}
            )
            assert config.sources.redis is not None
            sampler = RedisKeySampler(config.sources.redis, Telemetry(HealthBoard()), 15.0)
            raw = RawRedis(url)
            found = bare_loop(raw)  # the warm-up of each, and the check that they agree
            assert len(found) == size
            same_result(found, sampler.sample())
            clock = CostClock(client)
            for _ in range(args.runs):
                clock.time("bare", lambda: bare_loop(raw))  # noqa: B023  # called at once
                clock.time("exporter", sampler.sample)
            bare, ours = clock.median("wall", "bare"), clock.median("wall", "exporter")
            bare_cpu, ours_cpu = clock.median("cpu", "bare"), clock.median("cpu", "exporter")
            peer = redis_exporter_scrape(url, args.runs)
            peer_text = f"{peer:16.2f} {peer / ours:7.1f}x" if peer else f"{'absent':>16}"
            print(
                f"{size:>10} {bare:8.3f} {ours:10.3f} {ours / bare:5.2f}x "
                f"{bare_cpu:10.3f} {ours_cpu:14.3f} {ours_cpu / bare_cpu:5.2f}x {peer_text}"
            )
            raw.close()
            sampler.close()

        client.close()


if __name__ == "__main__":
    main()
