"""Resque's own counters and worker records as lifecycle signals, running depth and ages.

Resque keeps, under its namespace (`resque:` by default), what resque-web shows:
`stat:processed` and `stat:failed` (node-resque counts a job that succeeded in the one and one
that failed in the other; its retry plugin moves a retried failure from processed to failed),
the `workers` set of worker ids (`<host>:<pid>:<queues>`, the queues joined by commas, `*`
before any queue exists), and per worker `worker:<id>`, the job it runs (JSON: `queue`, `run_at`,
`payload`), deleted when the job ends. The reader turns the two counters into increments (the
first read is the baseline; stat:processed down by at most one per listed worker counts
nothing and keeps its baseline, since the retry plugin takes one back for a moment; down
further, a reset, it counts from zero) and each listed worker into a worker of every
queue it serves, busy while its record holds a job, one job at a time (a Resque worker runs one).
The jobs running are served as `queue_depth{state="active"}` per queue (every queue of the
`queues` set reads 0 when none runs), the earliest `run_at` as the longest running job's age.

A worker killed without leaving stays listed (node-resque's scheduler cleans it up after an hour
without a ping; resque-web lists it too) and counts until then: its pings are not read, since a
job that holds Node's event loop stops them while its worker lives. The counters carry no queue, so
they are served with none, and a failure's class is unknown (`error_type="other"`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Hashable
from datetime import datetime

import redis

from exporter.core import numbers
from exporter.core.item_time import TimeParseError, parse_time
from exporter.lifecycle.wire import ERROR_TYPES
from exporter.output.catalog import BY_NAME
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.members import members_of
from exporter.sources.readers.config import ResqueReaderConfig
from exporter.sources.readers.framework import (
    MAX_NAME_BYTES,
    MAX_QUEUES,
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    CounterDeltas,
    RedisReader,
    Signals,
)
from exporter.sources.redis_keys.values import names, selects

log = logging.getLogger(__name__)
DEPTH = BY_NAME["queue_depth"]
OLDEST_AGE = BY_NAME["queue_oldest_age_seconds"]
# A running job's record: the job's JSON (class, queue, args) and a few fields around it.
MAX_RECORD_BYTES = 1 << 20
# node-resque writes run_at as JavaScript's Date.toString(): "Sun Dec 06 2026 12:40:00
# GMT+0000 (Coordinated Universal Time)"; Ruby's Resque as ISO-8601.
JS_DATE = "%a %b %d %Y %H:%M:%S GMT%z"
MAX_RUN_AT_CHARS = 128  # either, with the longest time zone name
# A Resque worker runs one job at a time (node-resque's refuses a second while working).
SLOTS_PER_WORKER = 1
# Resque counts every queue as one: the counters name no queue (an empty label, as absent)
NO_QUEUE = ""
FAILURE_CLASS = "other"
if FAILURE_CLASS not in ERROR_TYPES:
    raise RuntimeError(f"resque reader: failure class {FAILURE_CLASS!r} is not in ERROR_TYPES")


class ResqueReader(RedisReader):
    def __init__(self, config: ResqueReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:resque"
        self.config = config
        self._totals = CounterDeltas()

    def key(self, *parts: str) -> str:
        return ":".join((self.config.namespace, *parts))

    def collect(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues = self._queues(client, signals)
            workers = self._workers(client, signals, queues)
            self._counters(client, signals, workers)
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise

    def _counters(self, client: redis.Redis, signals: Signals, workers: int) -> None:
        """The counters' increments; stat:processed down by at most one per listed worker is
        the retry plugin's dip (each worker takes back one job at a time), not a reset."""
        keys = (self.key("stat", "processed"), self.key("stat", "failed"))
        raw = client.mget(*keys)
        totals = []
        for key, value in zip(keys, raw, strict=True):
            with signals.record(key):  # refused: this read counts neither; the next good one
                totals.append(numbers.total(value) if value else 0.0)  # counts what it missed
        if len(totals) < len(keys):
            return  # the baseline stays the last good read's
        processed, failed = totals
        counts: dict[Hashable, float] = {"processed": processed, "failed": failed}
        deltas = self._totals.update(counts, signals, dip=max(workers, 1))
        new_completed = deltas.get("processed", 0.0)  # node-resque: successes only
        new_failed = deltas.get("failed", 0.0)
        # counted even when 0: the series exist from the first read, so the first jobs show
        # as an increase (a series born at its value has no rate)
        labels = (self.config.system, NO_QUEUE, "", "")
        signals.tally.count("queue_jobs_completed_total", labels, new_completed)
        signals.tally.count("queue_jobs_failed_total", (*labels, FAILURE_CLASS), new_failed)
        signals.tally.consumed += int(new_completed + new_failed)

    def _queues(self, client: redis.Redis, signals: Signals) -> list[str]:
        """The queues of the `queues` set, at most MAX_QUEUES (the rest refused)."""
        found: list[str] = []
        with signals.record(self.key("queues")):
            listing = members_of(client, self.key("queues"))
            for name in signals.names(listing, MAX_QUEUES, "queues"):
                found.append(name.decode("utf-8", "replace"))
        return sorted(found)

    def _workers(self, client: redis.Redis, signals: Signals, queues: list[str]) -> int:
        """Each listed worker and the job it runs; how many are listed."""
        ids: list[bytes] = []
        with signals.record(self.key("workers")):
            listing = members_of(client, self.key("workers"))
            ids = sorted(signals.names(listing, MAX_WORKERS, "workers"))
        pipe = client.pipeline(transaction=False)
        prefix = self.key("worker", "").encode()
        for worker_id in ids:
            pipe.get(prefix + worker_id)
        selection = self.config.queues
        running: Counter[str] = Counter({queue: 0 for queue in [*queues, *names(selection)]})
        since: dict[str, float] = {}  # per queue, when its longest running job started
        for worker_id, reply in zip(ids, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(prefix + worker_id):  # one bad worker costs itself
                name, served = _worker_id(worker_id.decode("utf-8", "replace"))
                job = running_job(reply, signals.latest)
                served = queues if served == ["*"] else served  # every queue, as its worker polls
                busy = 0 if job is None else 1
                signals.workers(self.config.system, served, name, busy, SLOTS_PER_WORKER, selection)
                if job is not None:
                    queue, started = job
                    running[queue] += 1
                    since[queue] = min(started, since.get(queue, started))
        system = self.config.system
        for queue, count in sorted(running.items()):
            if selects(selection, queue):  # the preset's queues param narrows what is served
                signals.samples.add_labelled(DEPTH, (system, queue, "", "active"), count)
                if queue in since:
                    age = max(0.0, signals.now - since[queue])  # a worker's clock a bit ahead
                    signals.samples.add_labelled(OLDEST_AGE, (system, queue, "", "active"), age)
        return len(ids)


def _worker_id(worker_id: str) -> tuple[str, list[str]]:
    """A worker id's name (`<host>:<pid>`) and queues, split as node-resque's Queue.workers()
    splits it (a name of one part serves no queue listed)."""
    parts = worker_id.split(":", 2)
    if len(parts) < 3:
        return parts[0], parts[1:]
    host, pid, queues = parts
    served = queues.split(",", MAX_QUEUES_PER_WORKER + 1)  # at_most refuses what is beyond
    return f"{host}:{pid}", [queue for queue in served if queue]


def running_job(reply: bytes | Exception | None, latest: float) -> tuple[str, float] | None:
    """The queue of the job a worker runs and when it started; None when it runs none."""
    if isinstance(reply, Exception):
        raise reply
    if reply is None:
        return None  # idle: node-resque deletes the record when a job ends
    if len(reply) > MAX_RECORD_BYTES:
        raise numbers.InvalidValue("oversized_field", f"a record of {len(reply)} bytes")
    record = json.loads(reply)
    queue, run_at = record["queue"], record["run_at"]
    if not isinstance(queue, str) or not isinstance(run_at, str):
        raise numbers.InvalidValue("bad_value", "queue or run_at is not a string")
    if len(queue.encode()) > MAX_NAME_BYTES:  # a label no queue name needs
        raise numbers.InvalidValue("oversized_field", f"a queue name of {len(queue)} characters")
    return queue, numbers.epoch(_run_at(run_at), latest)


def _run_at(text: str) -> float:
    """A run_at, ISO-8601 (Ruby's Resque) or JavaScript's Date.toString() (node-resque)."""
    if len(text) > MAX_RUN_AT_CHARS:
        raise numbers.InvalidValue("bad_value", f"a run_at of {len(text)} characters")
    try:
        return parse_time(text, "iso")
    except TimeParseError:
        pass
    try:
        # the time zone's name in brackets follows; the offset before it says it all
        return datetime.strptime(text.split(" (", 1)[0], JS_DATE).timestamp()
    except ValueError:
        raise numbers.InvalidValue("bad_value", f"run_at {text[:64]!r}") from None
