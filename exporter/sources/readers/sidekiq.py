"""Sidekiq's own counters and process records as lifecycle signals.

Sidekiq keeps, in Redis, what its Web UI shows: `stat:processed` and `stat:failed` (every
job a process ran, and those that raised, flushed by each process's heartbeat every 5 s), and
the `processes` set of live process identities, each a hash with `busy` (threads working),
`beat` and `info` (JSON: `concurrency`, `queues`), expiring 60 s after the process stops
beating. The reader turns the two counters into increments (the first read is the baseline,
a counter that went down after `Sidekiq::Stats#reset` counts from zero) and each live process
into a worker of every queue it serves (of those the preset's queues param selects). Per-queue latency is the preset's key group
(`queue_oldest_age_seconds`), and jobs being worked on its work-hash group.

Sidekiq 6 records no runtime per job in Redis (7.1's metrics do), so this reader feeds no
execution-time histogram; the counters carry no queue, so they are served with none (an empty
`queue` label: no queue that does not exist is named) and a failure's class is unknown (`error_type="other"`: retried or dead alike).
"""

from __future__ import annotations

import json
import logging

import redis

from exporter.core import numbers
from exporter.lifecycle.wire import ERROR_TYPES
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.members import members_of
from exporter.sources.readers.config import SidekiqReaderConfig
from exporter.sources.readers.framework import (
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    CounterDeltas,
    RedisReader,
    Signals,
)

log = logging.getLogger(__name__)
# A process's info JSON (hostname, queues, labels, ...): a few hundred bytes, a KiB or two.
MAX_INFO_BYTES = 1 << 20

# Sidekiq counts every queue as one: the counters name no queue (an empty label, as absent)
NO_QUEUE = ""
FAILURE_CLASS = "other"
if FAILURE_CLASS not in ERROR_TYPES:
    raise RuntimeError(
        f"sidekiq reader: failure class {FAILURE_CLASS!r} is not in wire.ERROR_TYPES"
    )


class SidekiqReader(RedisReader):
    def __init__(self, config: SidekiqReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:sidekiq"
        self.config = config
        self._totals = CounterDeltas()

    def collect(self, signals: Signals) -> None:
        client = self._connect()
        try:
            self._counters(client, signals)
            self._processes(client, signals)
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise

    def _counters(self, client: redis.Redis, signals: Signals) -> None:
        namespace = self.config.namespace
        keys = (f"{namespace}stat:processed", f"{namespace}stat:failed")
        raw = client.mget(*keys)
        totals = {}
        for key, value in zip(keys, raw, strict=True):
            with signals.record(key):  # refused: this read counts neither; the next good one
                totals[key] = numbers.total(value) if value else 0.0  # counts what it missed
        if len(totals) < len(keys):
            return  # the baseline stays the last good read's
        processed, failed = totals.values()
        deltas = self._totals.update({"processed": processed, "failed": failed}, signals)
        new_failed = deltas.get("failed", 0.0)
        # processed counts every job run, failed or not
        new_completed = max(deltas.get("processed", 0.0) - new_failed, 0.0)
        # counted even when 0: the series exist from the first read, so the first jobs show
        # as an increase (a series born at its value has no rate)
        queue = (self.config.system, NO_QUEUE, "", "")
        signals.tally.count("queue_jobs_completed_total", queue, new_completed)
        signals.tally.count("queue_jobs_failed_total", (*queue, FAILURE_CLASS), new_failed)
        signals.tally.consumed += int(new_completed + new_failed)

    def _processes(self, client: redis.Redis, signals: Signals) -> None:
        namespace = self.config.namespace
        identities: list[bytes] = []
        with signals.record(f"{namespace}processes"):
            listing = members_of(client, f"{namespace}processes")  # SSCAN: up to the limit
            identities = sorted(signals.names(listing, MAX_WORKERS, "processes"))
        pipe = client.pipeline(transaction=False)
        for identity in identities:
            pipe.hmget(namespace.encode() + identity, ("info", "busy"))
        for identity, reply in zip(identities, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(namespace.encode() + identity):  # one bad process costs itself
                process = _process(reply)
                if process is None:
                    continue
                busy, concurrency, queues = process
                name = identity.decode("utf-8", "replace")
                signals.workers(
                    self.config.system, queues, name, busy, concurrency, self.config.queues
                )


def _process(reply: list[bytes | None] | Exception) -> tuple[int, int, list[str]] | None:
    """A process hash's busy threads, concurrency and queues; None once it expired."""
    if isinstance(reply, Exception):
        raise reply
    info_json, busy = reply
    if info_json is None:
        return None  # stopped beating: the hash expired
    if len(info_json) > MAX_INFO_BYTES:
        raise numbers.InvalidValue("oversized_field", f"info of {len(info_json)} bytes")
    info = json.loads(info_json)
    queues = info["queues"]
    if not isinstance(queues, list):
        raise numbers.InvalidValue("bad_value", "queues is not a list")
    names = [queue for queue in queues[: MAX_QUEUES_PER_WORKER + 1] if isinstance(queue, str)]
    return numbers.count(busy or 0), numbers.count(info["concurrency"]), names
