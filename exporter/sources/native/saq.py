"""SAQ's worker stats as throughput, failures and retries.

Each SAQ worker writes, every `worker_info` timer (10 s by default), the counts of its queue
object (`complete`, `failed`, `retried`, `aborted` since it started) as JSON in
`saq:<queue>:worker_info:<worker id>`, and lists that key in the `saq:<queue>:stats` zset
scored by when it expires (ms). The reader reads every live worker of every queue (the listed
ones and each queue with a stats zset) and turns each worker's counts into increments: the
first read is the baseline, a worker new since the last read counts in full (a restarted worker
has a new id and counts from zero), a count that went down counts from zero. A worker whose
record lapsed or cannot be read keeps its last counts for FORGET_AFTER, so it is not counted
again in full when it shows again.

SAQ records no runtime per job outside the job itself and no busy/idle per worker, so this
reader feeds no histogram and no `queue_workers`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Hashable
from typing import cast

import redis

from exporter import numbers
from exporter.events.wire import ERROR_TYPES
from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.key_groups import key_regex
from exporter.sources.native.config import SaqReaderConfig
from exporter.sources.native.framework import CounterDeltas, RedisReader, Signals

log = logging.getLogger(__name__)
# A worker's info JSON: its stats and metadata, a few hundred bytes.
MAX_INFO_BYTES = 1 << 20
STATS_KEYS = "saq:{value}:stats"
SCAN_COUNT = 1000
# Seconds a worker's last counts are remembered once its record is gone: a record that lapsed
# between two writes (its ttl is the write interval + 1 s) or could not be read for a while
# is not counted again in full when it shows again; a restarted worker has a new id.
FORGET_AFTER = 600.0
# SAQ's stats -> (metric, error_type): a final failure is not retried, a retry is a failed
# attempt that will run again, an abort was asked for (neither the job's fault nor retried)
COUNTERS = {
    "complete": (("queue_jobs_completed_total", None),),
    "failed": (("queue_jobs_failed_total", "non_retryable"),),
    "retried": (("queue_jobs_failed_total", "retryable"), ("queue_jobs_retried_total", None)),
    "aborted": (("queue_jobs_failed_total", "other"),),
}
if not {kind for metrics in COUNTERS.values() for _, kind in metrics if kind} <= set(ERROR_TYPES):
    raise RuntimeError("saq reader: an error type is not in wire.ERROR_TYPES")


class SaqReader(RedisReader):
    def __init__(self, config: SaqReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:saq"
        self.config = config
        self._totals = CounterDeltas()
        # each worker's counts as last read, and when (signals.now)
        self._last: dict[Hashable, tuple[float, float]] = {}

    def read(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues = self._queues(client)
            counts: dict[Hashable, float] = {}
            for queue in queues:
                counts.update(self._workers(client, queue, signals))
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise
        deltas = self._totals.update(self._remembered(counts, signals.now))
        self._count(queues, deltas, signals)

    def _remembered(self, counts: dict[Hashable, float], now: float) -> dict[Hashable, float]:
        """This read's counts, and the last ones of workers not read now (their record
        lapsed between two writes, or could not be read) for FORGET_AFTER: one that shows
        again is not counted again in full."""
        for identity, value in counts.items():
            self._last[identity] = (value, now)
        for identity, (_, seen) in list(self._last.items()):
            if now - seen > FORGET_AFTER:
                del self._last[identity]
        return {identity: value for identity, (value, _) in self._last.items()}

    def _queues(self, client: redis.Redis) -> list[str]:
        """The listed queues and every queue with live workers' stats."""
        regex = key_regex(STATS_KEYS)
        found = set(self.config.queues)
        for key in client.scan_iter(match="saq:*:stats", count=SCAN_COUNT):
            match = regex.match(key.decode("utf-8", "replace"))
            if match:
                found.add(match.group("value"))
        return sorted(found)

    def _workers(self, client: redis.Redis, queue: str, signals: Signals) -> dict[Hashable, float]:
        """Each live worker's counts, by (queue, worker key, stat)."""
        stats_key = f"saq:{queue}:stats"
        keys: list[bytes] = []
        with signals.record(stats_key):
            now_ms = int(time.time() * 1000)
            found: list[bytes] = client.zrangebyscore(stats_key, now_ms, "+inf")  # type: ignore[assignment]
            keys = found
        if not keys:
            return {}
        counts: dict[Hashable, float] = {}
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)  # not MGET: a record of another type must say so (WRONGTYPE)
        for key, raw in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            name = key.decode("utf-8", "replace")
            with signals.record(key):  # a bad record costs itself: its last counts stand in
                counts.update({(queue, name, stat): n for stat, n in _stats(raw).items()})
        return counts

    def _count(self, queues: list[str], deltas: dict[Hashable, float], signals: Signals) -> None:
        added: dict[tuple[str, str], float] = {}
        for identity, delta in deltas.items():
            queue, _, stat = cast(tuple[str, str, str], identity)
            added[queue, stat] = added.get((queue, stat), 0.0) + delta
        for queue in queues:
            # counted even when 0: the series exist from the first read, so the first jobs
            # show as an increase
            labels = (self.config.system, queue, "", "")
            for stat, metrics in COUNTERS.items():
                amount = added.get((queue, stat), 0.0)
                for metric, error_type in metrics:
                    signals.tally.count(
                        metric, (*labels, error_type) if error_type else labels, amount
                    )
                if stat != "retried":
                    signals.tally.consumed += int(amount)


def _stats(raw: bytes | str | Exception | None) -> dict[str, float]:
    """A worker info's counts; none once it expired."""
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        return {}
    if len(raw) > MAX_INFO_BYTES:
        raise numbers.InvalidValue("oversized_field", f"worker info of {len(raw)} bytes")
    stats = json.loads(raw)["stats"]
    if not isinstance(stats, dict):
        raise numbers.InvalidValue("bad_value", "stats is not an object")
    return {stat: numbers.total(stats[stat]) for stat in COUNTERS if stat in stats}
