"""One read of the Bull native reader at many queues, as a ratio against the leanest loop
doing the same reads, in the same run.

    .venv/bin/python bench/native_bull.py [--queues 10000] [--new 1] [--runs 5]

The queues are bench/preset_sampling.py's (each a Bull queue as Bull writes it: its id
counter, a waiting, a delayed and a completed job), in a redis-server of the benchmark's own;
both readers take their baseline first. Then, `--runs` times after a warm-up round, `--new`
jobs per queue finish (each a job hash with Bull's fields and its id in the completed zset,
scored by its finishedOn) and both read them, in turn, the order swapped every round, each
timed by the clock and by the CPU of this process and the redis-server together (medians):
- floor: the same reads in the leanest loop, over a raw socket with hiredis: SCAN of the id
  counters, one CLIENT LIST (its BRPOPLPUSH connections), one round trip of a ZRANGEBYSCORE
  per queue's completed and failed set (from the same window as the reader's), one round trip
  of an HMGET per newly finished job's hash; each job's execution time summed per queue; GC
  paused;
- reader: `BullReader.read` (exporter/sources/readers/bull.py), workers on as the preset has
  it, checked every round to count the floor's jobs per queue with the floor's execution
  times.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from key_sampling import CostClock, RawRedis, private_redis
from preset_sampling import load_queues

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bull import LOOKBACK_MS, BullReader
from exporter.sources.readers.config import BullReaderConfig
from exporter.sources.readers.framework import Signals

PAGE = 1000
# what the reader's HMGET asks of a completed job's hash (a failed one's: failedReason last)
JOB_FIELDS = ("name", "timestamp", "delay", "processedOn", "finishedOn", "attemptsMade", "name")
# queue -> (jobs finished since the last read, their execution seconds summed)
Found = dict[str, tuple[int, float]]


class FloorReader:
    """The reads the Bull reader makes, and nothing else: the windows of seen members."""

    def __init__(self, raw: RawRedis) -> None:
        self.raw = raw
        self.windows: dict[bytes, tuple[float | None, dict[bytes, float]]] = {}
        self.baseline_taken = False

    def read(self) -> Found:
        gc.disable()
        try:
            return self._read()
        finally:
            gc.enable()

    def _read(self) -> Found:
        raw, queues, cursor = self.raw, set(), b"0"
        while True:
            cursor, keys = raw.pipeline([("SCAN", cursor, "MATCH", "bull:*:id", "COUNT", PAGE)])[0]
            queues.update(key[5:-3] for key in keys)
            if cursor == b"0":
                break
        listed = raw.pipeline([("CLIENT", "LIST")])[0]
        workers = [line for line in listed.split(b"\n") if b" cmd=brpoplpush" in line]
        sets = [
            b"bull:%s:%s" % (queue, end) for queue in queues for end in (b"completed", b"failed")
        ]
        commands = []
        for key in sets:
            high, seen = self.windows.get(key, (None, {}))
            floor = "-inf" if high is None else repr(high - LOOKBACK_MS)
            commands.append(("ZRANGEBYSCORE", key, floor, "+inf", "WITHSCORES", "LIMIT", 0,
                             len(seen) + 10_000))  # fmt: skip
        latest = time.time() * 1000 + 300_000
        new: list[bytes] = []
        for key, reply in zip(sets, raw.pipeline(commands), strict=True):
            high, seen = self.windows.get(key, (None, {}))
            for member, score in zip(reply[::2], reply[1::2], strict=True):
                if member not in seen:
                    new.append(key.rsplit(b":", 1)[0] + b":" + member)
                seen[member] = value = float(score)
                if value <= latest:
                    high = value if high is None else max(high, value)
            if high is not None:
                seen = {m: s for m, s in seen.items() if s >= high - LOOKBACK_MS}
            self.windows[key] = (high, seen)
        if not self.baseline_taken:  # what finished before is not counted
            self.baseline_taken = True
            return {}
        found: Found = {}
        hashes = raw.pipeline([("HMGET", job, *JOB_FIELDS) for job in new]) if new else []
        for job, got in zip(new, hashes, strict=True):
            started, ended = got[3], got[4]
            queue = job[5:].rsplit(b":", 1)[0].decode()
            count, total = found.get(queue, (0, 0.0))
            if started and ended:
                total += max(float(ended) - float(started), 0.0) / 1000
            found[queue] = (count + 1, total)
        del workers  # read as the reader reads it; the benchmark runs none
        return found


def finish_jobs(client: redis.Redis, queues: int, round_: int, new: int) -> None:
    """`new` jobs per queue finished now, as Bull's moveToFinished leaves them."""
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    for index in range(queues):
        prefix = f"bull:queue-{index}"
        for job in range(new):
            job_id = f"r{round_}-{job}"
            started = now_ms - 1000 - (index + job) % 500
            fields = {"name": "job", "data": "{}", "timestamp": started - 2000, "delay": 0,
                      "processedOn": started, "finishedOn": now_ms, "attemptsMade": 0}  # fmt: skip
            pipe.hset(f"{prefix}:{job_id}", mapping=fields)
            pipe.zadd(f"{prefix}:completed", {job_id: now_ms})
        if index % 1000 == 999:
            pipe.execute()
    pipe.execute()


def reader_found(signals: Signals) -> Found:
    found: dict[str, list[float]] = {}
    for (metric, labels), amount in signals.tally.counts.items():
        if metric == "queue_jobs_completed_total" and amount:
            found.setdefault(labels[1], [0, 0.0])[0] += int(amount)
    for (metric, labels), values in signals.tally.observations.items():
        if metric == "queue_job_execution_seconds":
            found.setdefault(labels[1], [0, 0.0])[1] += sum(values)
    return {queue: (int(count), total) for queue, (count, total) in found.items()}


def same_result(found: Found, floor: Found, queues: int, new: int) -> None:
    if len(floor) != (queues if new else 0) or any(n != new for n, _ in floor.values()):
        raise RuntimeError(f"the floor found {len(floor)} queues' jobs, not {queues} x {new}")
    if found.keys() != floor.keys():
        raise RuntimeError(f"the reader counted {len(found)} queues, the floor {len(floor)}")
    for queue, (count, total) in floor.items():
        if found[queue][0] != count or abs(found[queue][1] - total) > 1e-6:
            raise RuntimeError(f"{queue}: reader {found[queue]}, floor {(count, total)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--new", type=int, default=1, help="jobs finished per queue per read")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with private_redis() as url:
        client = redis.Redis.from_url(url)
        load_queues(client, args.queues)
        reader = BullReader(BullReaderConfig(), RedisConnectionConfig(url=url))
        floor = FloorReader(RawRedis(url))
        gc.freeze()  # as `serve` does once start-up is done (exporter/runtime/app.py)
        reader.read(Signals())  # both baselines
        floor.read()
        clock = CostClock(client)
        for round_ in range(args.runs + 1):  # round 0: the warm-up, not counted
            finish_jobs(client, args.queues, round_, args.new)
            signals = Signals()
            name = "warm-up " if round_ == 0 else ""
            steps: list[tuple[str, Any]] = [
                (f"{name}reader", functools.partial(reader.read, signals)),
                (f"{name}floor", floor.read),
            ]
            results = {}
            for step, action in steps if round_ % 2 else steps[::-1]:
                results[step] = clock.time(step, action)
            same_result(reader_found(signals), results[f"{name}floor"], args.queues, args.new)
        load = Path("/proc/loadavg").read_text().split()[0]
        print(
            f"Bull reader, {args.queues} queues, {args.new} job(s) finished per queue and read, "
            f"{args.runs} runs, load {load}"
        )
        for kind in ("wall", "cpu"):
            low, high = clock.median(kind, "floor"), clock.median(kind, "reader")
            print(f"  {kind:4}: floor {low:.3f} s, reader {high:.3f} s, ratio {high / low:.2f}x")
        reader.close()
        floor.raw.close()


if __name__ == "__main__":
    main()
