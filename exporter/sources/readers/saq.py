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

Runtimes come from each finished job's own record (saq_jobs.py), read once SAQ announced
it finished: `queue_job_execution_seconds` and `queue_job_wait_seconds` (`runtimes: false`
turns this off).
The live workers are `queue_workers` of their queue, busy while an active job names them
(saq_workers.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Hashable
from typing import cast

import redis

from exporter.core import numbers
from exporter.lifecycle.wire import ERROR_TYPES
from exporter.output.catalog import BY_NAME
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import SaqReaderConfig
from exporter.sources.readers.framework import (
    MAX_KEYS,
    MAX_QUEUES,
    MAX_WORKERS,
    CounterDeltas,
    RedisReader,
    Signals,
)
from exporter.sources.readers.saq_jobs import (
    INCOMPLETE_KEYS,
    MAX_READS,
    SCAN_COUNT,
    FinishedJobs,
    JobRecord,
)
from exporter.sources.readers.saq_workers import (
    MAX_ACTIVE_JOBS,
    SAQ_WITH_WORKER_ID,
    active_jobs,
    worker_id,
)
from exporter.sources.redis_keys.groups import key_regex

log = logging.getLogger(__name__)
DEPTH = BY_NAME["queue_depth"]
# A worker's info JSON: its stats and metadata, a few hundred bytes.
MAX_INFO_BYTES = 1 << 20
STATS_KEYS = "saq:{value}:stats"
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
        self._jobs = FinishedJobs(config.system, connection)

    def collect(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues, with_jobs = self._queues(client, signals)
            counts: dict[Hashable, float] = {}
            room, jobs_room = MAX_WORKERS, MAX_ACTIVE_JOBS  # read over every queue
            for queue in queues:
                live = self._workers(client, queue, room, signals)
                room -= len(live)
                for _, stats in live:
                    counts.update(stats)
                jobs_room -= self._busy_or_idle(client, queue, live, jobs_room, signals)
            finished: list[JobRecord] = []
            if self.config.runtimes:
                finished = self._jobs.read(client, sorted({*queues, *with_jobs}), signals)
        except (redis.ConnectionError, redis.TimeoutError):
            super().close()  # the subscription stays: its connection is not this one
            raise
        deltas = self._totals.update(self._remembered(counts, signals.now), signals)
        self._count(queues, deltas, signals)
        for record in finished:
            with signals.record(record.job.key):  # a job of another type or garbled costs itself
                self._jobs.observe(signals, record)
        if self.config.runtimes:
            self._failed(signals)

    def interrupt(self) -> None:
        """The read in progress fails now if it waits on Redis' keys; taking announcements
        stops at the next, keeping the subscription."""
        self._jobs.interrupt()
        super().interrupt()

    def close(self) -> None:
        self._jobs.close()
        super().close()

    def _failed(self, signals: Signals) -> None:
        """The failed jobs SAQ keeps, as queue_depth{state="failed"} (saq_jobs.py)."""
        told = self._jobs.failed()
        if told is None:
            return
        failed, unread = told
        for queue, count in failed.items():
            signals.samples.add_labelled(DEPTH, (self.config.system, queue, "", "failed"), count)
        if unread:
            signals.caveat = (
                f"failed jobs of {len(unread)} queue(s) ({', '.join(unread[:3])}) not served "
                f"yet: the statuses of their kept records are read {MAX_READS:,} a read"
            )

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

    def _queues(self, client: redis.Redis, signals: Signals) -> tuple[list[str], list[str]]:
        """The listed queues and every queue with live workers' stats, and the queues with
        unfinished jobs (their `incomplete` zset: their failed jobs are counted too),
        MAX_QUEUES each at most (a SCAN of the zsets saq:*, MAX_KEYS at most: Signals.names;
        the job records, strings, are not sent)."""
        stats, incomplete = key_regex(STATS_KEYS), key_regex(INCOMPLETE_KEYS)
        found, with_jobs = set(self.config.queues), set()
        scan = client.scan_iter(match="saq:*", count=SCAN_COUNT, _type="zset")
        for raw in signals.names(scan, MAX_KEYS, "zsets saq:*"):
            key = raw.decode("utf-8", "replace")
            if match := stats.match(key):
                found.add(match.group("value"))
            elif match := incomplete.match(key):
                with_jobs.add(match.group("value"))
        return (
            signals.at_most(sorted(found), MAX_QUEUES, "queues with stats"),
            signals.at_most(sorted(with_jobs), MAX_QUEUES, "queues with jobs"),
        )

    def _workers(
        self, client: redis.Redis, queue: str, room: int, signals: Signals
    ) -> list[tuple[str, dict[Hashable, float]]]:
        """Each live worker's record key and counts, by (queue, record key, stat): `room`
        workers at most, those whose record expires first (a worker writes it every few
        seconds, so a live one's expiry is near), the rest refused (over_limit, once for the
        queue). A record gone is no live worker; one that cannot be read costs itself."""
        stats_key = f"saq:{queue}:stats"
        keys: list[bytes] = []
        with signals.record(stats_key):
            now_ms = int(time.time() * 1000)
            found: list[bytes] = client.zrangebyscore(  # type: ignore[assignment]
                stats_key, now_ms, "+inf", start=0, num=room + 1
            )
            keys = list(signals.names(found, room, f"workers of {stats_key}"))
        if not keys:
            return []
        workers: list[tuple[str, dict[Hashable, float]]] = []
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)  # not MGET: a record of another type must say so (WRONGTYPE)
        for key, raw in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            name = key.decode("utf-8", "replace")
            with signals.record(key):  # a bad record costs itself: its last counts stand in
                stats = _stats(raw)
                if stats is not None:
                    workers.append((name, {(queue, name, stat): n for stat, n in stats.items()}))
        return workers

    def _busy_or_idle(
        self,
        client: redis.Redis,
        queue: str,
        live: list[tuple[str, dict[Hashable, float]]],
        room: int,
        signals: Signals,
    ) -> int:
        """The queue's live workers into queue_workers, busy while an active job names them
        (saq_workers.py); none when that cannot be told. The active jobs read (`room` at most)."""
        if not live:
            return 0
        if room <= 0:
            signals.refuse_beyond("over_limit", f"active jobs of {queue}", "no room left")
            return 0
        running, read = active_jobs(client, queue, room, signals)
        if running is None:
            signals.caveat = (
                f"an active job of queue {queue!r} names no worker (SAQ before "
                f"{SAQ_WITH_WORKER_ID}): its workers are not served, busy or idle"
            )
            return read
        for name, _ in live:
            runs = running.get(worker_id(queue, name), 0)
            signals.worker(self.config.system, queue, name, runs, None)
        return read

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


def _stats(raw: bytes | str | Exception | None) -> dict[str, float] | None:
    """A worker info's counts; None once it expired."""
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        return None
    if len(raw) > MAX_INFO_BYTES:
        raise numbers.InvalidValue("oversized_field", f"worker info of {len(raw)} bytes")
    stats = json.loads(raw)["stats"]
    if not isinstance(stats, dict):
        raise numbers.InvalidValue("bad_value", "stats is not an object")
    return {stat: numbers.total(stats[stat]) for stat in COUNTERS if stat in stats}
