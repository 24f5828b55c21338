"""What an idle read of RQ's registries costs the RQ reader, by what they keep (issue 40).

    .venv/bin/python bench/native_rq_windows.py [--kept 300,3000,30000] [--reads 5]

Against a private redis-server: one queue whose finished and failed registries keep --kept
jobs each (RQ's layout: scored by their end plus result_ttl 500 s and failure_ttl a year, a ms
apart), a reader's baseline, then --reads idle reads (nothing finishes): the bytes the server
sent per idle read (total_net_output_bytes, less the INFO reply that measures it), and the
median time of a read. The floor is the
leanest loop that reads the same records and tells an idle registry from a changed one: the
reader's listings (rq:queues, rq:workers, rq:rl-keys), the started registry whole, a ZCARD and
the newest member of each finished and failed registry (it misses what a count hides, the
reader does not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_FILL = """
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  local id = ARGV[4] .. i
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + i / 1000, id)
  redis.call('HSET', 'rq:job:' .. id, 'description', 'jobs.f()', 'origin', 'default',
             'status', 'finished', 'ended_at', '2026-01-01T00:00:01.000000Z')
end
"""


def _sent(client: object) -> int:
    return int(client.info("stats")["total_net_output_bytes"])  # type: ignore[attr-defined]


def _info_reply(client: object) -> int:
    """The bytes of one INFO reply, which every figure taken between two INFOs holds."""
    first = _sent(client)
    return _sent(client) - first


def _floor(client: object) -> None:
    pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
    for key in ("rq:queues", "rq:workers", "rq:rl-keys"):
        pipe.smembers(key)
    pipe.zrange("rq:wip:default", 0, -1, withscores=True)
    for registry in ("finished", "failed"):
        pipe.zcard(f"rq:{registry}:default")
        pipe.zrange(f"rq:{registry}:default", -1, -1, withscores=True)
    pipe.execute()


def measure(kept: int, reads: int) -> dict[str, float]:
    import redis

    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers.config import RqReaderConfig
    from exporter.sources.readers.framework import Signals
    from exporter.sources.readers.rq import RqReader
    from tests.private_redis import PrivateRedis

    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            client = redis.Redis.from_url(server.url)
            client.sadd("rq:queues", "rq:queue:default")
            now = time.time()
            for registry, ttl in (("finished", 500), ("failed", 31_536_000)):
                for first in range(0, kept, 2_500):
                    last = min(first + 2_500, kept) - 1
                    key = f"rq:{registry}:default"
                    client.eval(_FILL, 1, key, now + ttl - kept / 1000, first, last, registry)
            reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=server.url))
            reader.read(Signals())  # the baseline
            sizes, times = [], []
            for _ in range(reads):
                before, started = _sent(client), time.perf_counter()
                reader.read(Signals())
                times.append(time.perf_counter() - started)
                sizes.append(_sent(client) - before)
            reader.close()
            floor_before = _sent(client)
            _floor(client)
            floor = _sent(client) - floor_before
            info = _info_reply(client)
            return {"bytes": statistics.median(sizes) - info, "floor_bytes": floor - info,
                    "read_s": statistics.median(times)}  # fmt: skip
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", default="300,3000,30000")
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    for kept in (int(text) for text in args.kept.split(",")):
        figures = measure(kept, args.reads)
        print(
            f"kept {kept:>6} a registry: an idle read {figures['bytes']:.0f} bytes "
            f"(floor {figures['floor_bytes']:.0f}), {figures['read_s'] * 1000:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
