"""The bull preset's sampling cost at many queues, as a ratio against the leanest loop doing
the same work, in the same run (issue 26's bound: at most 1.5x the floor at 10k queues).

    .venv/bin/python bench/preset_sampling.py [--queues 10000] [--runs 5]

The bull preset is the largest of the Redis presets added for issue 26 (six key groups per
queue, queues found from their id counters, ages from a follow-up read of the job hash each
waiting list's next job names). Each queue here is a Bull queue as Bull writes it: its id
counter, a waiting job (its id in the wait list, its hash with a timestamp), a delayed job and
a completed one; its paused, active and failed keys do not exist (read as 0), as in most
queues. In a redis-server of the benchmark's own, after a warm-up of each, run in turn
`--runs` times (medians), each timed by the clock and by the CPU of this process and the
redis-server together:
- floor: the same useful work in the leanest loop, over a raw socket with hiredis: SCAN of the
  id counters, then per page of 1000 queues one round trip of the seven depths (LLEN, ZCARD),
  the due count (ZCOUNT) and the next job of the wait and paused lists (LINDEX -1) inside the
  bounded read-only script the exporter uses, then one round trip of the job hashes'
  timestamps (HGET in the same script); every timestamp turned into an age; GC paused;
- exporter: one full cycle of the bull preset in its default configuration, checked to give the
  floor's depths and ages.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from key_sampling import CostClock, RawRedis, private_redis

from exporter.config import settings as config_module
from exporter.redis.pipeline import bounded_reads, script_read
from exporter.sources.redis_keys.sampler import RedisKeySampler

MAX_ITEM_BYTES = 256 * 1024  # the exporter's default max_item_bytes
PAGE = 1000  # the exporter's default scan_count and pipeline_size
DEPTHS = (
    ("LLEN", "wait"),
    ("LLEN", "paused"),
    ("LLEN", "active"),
    ("ZCARD", "delayed"),
    ("ZCARD", "completed"),
    ("ZCARD", "failed"),
)
# queue -> (depths by key suffix, due delayed jobs, ages of the next wait and paused jobs)
Found = dict[str, tuple[dict[str, int], int, list[float]]]


# A speed benchmark of every key: the memory cap of a cycle (the source's max_keys) lifted.
EVERY_KEY = 10**9


def load_queues(client: redis.Redis, queues: int) -> None:
    client.flushdb()
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for index in range(queues):
        prefix = f"bull:queue-{index}"
        pipe.set(f"{prefix}:id", 3)
        pipe.hset(
            f"{prefix}:1", mapping={"name": "job", "data": "{}", "timestamp": now_ms - 60_000}
        )
        pipe.lpush(f"{prefix}:wait", "1")
        pipe.zadd(f"{prefix}:delayed", {"2": (now_ms + 3_600_000) * 4096})
        pipe.zadd(f"{prefix}:completed", {"3": now_ms})
        if index % 1000 == 999:
            pipe.execute()
    pipe.execute()


def floor_loop(raw: RawRedis) -> Found:
    found: Found = {}
    now = time.time()
    tail, timestamp = script_read("LINDEX", -1), script_read("HGET", "timestamp")
    gc.disable()
    try:
        queues: list[str] = []
        cursor: Any = b"0"
        while True:  # the id counters: the queues
            cursor, keys = raw.pipeline([("SCAN", cursor, "MATCH", "bull:*:id", "COUNT", PAGE)])[0]
            queues += [key.decode()[5:-3] for key in keys]
            if cursor == b"0":
                break
        queues = sorted(set(queues))
        for start in range(0, len(queues), PAGE):
            page = queues[start : start + PAGE]
            commands: list[tuple[Any, ...]] = []
            for queue in page:
                commands += [(command, f"bull:{queue}:{suffix}") for command, suffix in DEPTHS]
                commands.append(
                    ("ZCOUNT", f"bull:{queue}:delayed", "-inf", f"({now * 1000 * 4096!r}")
                )
            lists = [f"bull:{queue}:{name}" for queue in page for name in ("wait", "paused")]
            commands.append(bounded_reads(lists, [tail] * len(lists), MAX_ITEM_BYTES))
            replies = raw.pipeline(commands)
            heads = replies[-1]
            hashes = [
                (queue, f"bull:{queue}:{head.decode()}")
                for (queue, head) in zip([q for q in page for _ in (0, 1)], heads, strict=True)
                if head is not None
            ]
            stamps = (
                raw.pipeline(
                    [
                        bounded_reads(
                            [key for _, key in hashes], [timestamp] * len(hashes), MAX_ITEM_BYTES
                        )
                    ]
                )[0]
                if hashes
                else []
            )
            ages: dict[str, list[float]] = {}
            for (queue, _), stamp in zip(hashes, stamps, strict=True):
                ages.setdefault(queue, []).append(now - int(stamp) / 1000)
            step = len(DEPTHS) + 1
            for index, queue in enumerate(page):
                row = replies[index * step : (index + 1) * step]
                depths = {suffix: row[at] for at, (_, suffix) in enumerate(DEPTHS)}
                found[queue] = (depths, row[-1], ages.get(queue, []))
    finally:
        gc.enable()
    return found


def same_result(found: Found, samples: Any, seconds_apart: float) -> None:
    series = {spec.name: dict(part.items()) for spec, part in samples.metrics()}
    depths: dict[tuple[str, str], float] = {}
    for labels, depth in series["queue_depth"].items():
        depths[labels[1], labels[3]] = depths.get((labels[1], labels[3]), 0.0) + depth
    states = {
        "wait": "pending",
        "paused": "pending",
        "active": "active",
        "delayed": "scheduled",
        "completed": "completed",
        "failed": "failed",
    }
    expected: dict[tuple[str, str], float] = {}
    for queue, (by_key, _, _) in found.items():
        for suffix, depth in by_key.items():
            key = (queue, states[suffix])
            expected[key] = expected.get(key, 0.0) + depth
    if depths != expected:
        raise RuntimeError(f"depths differ: {len(depths)} series against {len(expected)}")
    ages = {labels[1]: age for labels, age in series["queue_oldest_age_seconds"].items()}
    for queue, (_, _, floor_ages) in found.items():
        if abs(ages[queue] - max(floor_ages)) > seconds_apart:
            raise RuntimeError(f"{queue}: age {ages[queue]} against {max(floor_ages)}")
    due = series.get("queue_scheduled_due", {})
    if sum(due.values()) != sum(d for _, d, _ in found.values()):
        raise RuntimeError("due counts differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with private_redis() as url:
        client = redis.Redis.from_url(url)
        load_queues(client, args.queues)
        config = config_module.from_dict(
            {"presets": ["bull"], "sources": {"redis": {"url": url, "max_keys": EVERY_KEY}}}
        )
        assert config.sources.redis is not None and not isinstance(config.sources.redis, list)
        sampler = RedisKeySampler(config.sources.redis, 15.0)
        raw = RawRedis(url)
        gc.freeze()  # as `serve` does once start-up is done (exporter/runtime/app.py)
        found_at = time.time()
        found = floor_loop(raw)
        if len(found) != args.queues:
            raise RuntimeError(f"the floor found {len(found)} queues of {args.queues}")
        same_result(found, sampler.sample().samples, time.time() - found_at + 1)
        clock = CostClock(client)
        for _ in range(args.runs):
            clock.time("floor", lambda: floor_loop(raw))
            cycle = clock.time("exporter", sampler.sample)
            same_result(found, cycle.samples, time.time() - found_at + 1)
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"bull preset, {args.queues} queues ({args.queues * 6} keys read), load {load}")
        for kind in ("wall", "cpu"):
            floor, exporter = clock.median(kind, "floor"), clock.median(kind, "exporter")
            print(
                f"  {kind:4}: floor {floor:.3f} s, exporter {exporter:.3f} s, ratio {exporter / floor:.2f}x"
            )
        raw.close()
        sampler.close()


if __name__ == "__main__":
    main()
