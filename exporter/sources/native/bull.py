"""Bull's finished jobs as throughput, failures, retries and runtimes.

Bull (the `bull` package, 3.x and 4.x) records no event stream: its events go over Pub/Sub
only. What it keeps is each finished job: moveToFinished adds the job id to
`<prefix>:<queue>:completed` or `:failed`, a zset scored by the job's finishedOn (ms, the
worker's clock), and writes finishedOn into the job's hash, whose processedOn is when its last
attempt started, attemptsMade how many attempts failed, timestamp and delay when it was
created and for how long it was held back. A failed attempt with attempts left leaves no
record but the job's attemptsMade (Bull moves the job to delayed or wait).

Every read takes each queue's members scored from LOOKBACK_MS before the highest score seen
on, and counts the ids not seen in that window before: a completion, or a final failure
(error type `other` when Bull failed it for stalling, `timeout` for its timeout, else
`non_retryable`), with the execution time (finishedOn - processedOn), the time since the job
could first run (timestamp + delay) and the attempts; the attempts that failed before are
counted then as retryable failures and retries. Members scored further back than LOOKBACK_MS
behind the newest (a worker's clock that far behind) are not counted. The reader's first read
is its baseline: what finished before is not counted; a queue that shows later counts its
finished jobs in full. Jobs removed on completion or
failure (removeOnComplete: true) leave no record and are not counted; a keep-count smaller
than what finishes in one interval loses the excess.

Queues are those with an `<prefix>:<queue>:id` counter, as for the preset. Workers come from
the connections Bull names `<prefix>:<base64 of the queue name>` (CLIENT SETNAME,
lib/worker.js), which `Queue.getWorkers()` lists from CLIENT LIST; one CLIENT LIST per read
serves every queue (bullmq_workers.py's form, without BullMQ's `:w:` names). getWorkers()
counts connections, not workers: Bull 4 names a worker's blocking connection only, Bull 3
every connection of every Queue (a producer's too, a worker's three). So a worker here is a
named connection whose last command is BRPOPLPUSH, the blocking one each worker has, in the
reader's database (CLIENT LIST lists every database's): idle while blocked waiting for its
next job, else busy (one slot each: CLIENT LIST does not tell a worker's concurrency).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis

from exporter import numbers
from exporter.events.metrics import apply
from exporter.events.wire import Event
from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.key_groups import key_regex, literal, scan_glob
from exporter.sources.native.bullmq_workers import client_list_refused, worker_connections
from exporter.sources.native.config import BullReaderConfig
from exporter.sources.native.framework import MAX_KEYS, MAX_QUEUES, RedisReader, Signals

log = logging.getLogger(__name__)
FINISHED = ("completed", "failed")
SCAN_COUNT = 1000
# How far behind the newest finishedOn a member is still looked for: Bull's scores come from
# each worker's own clock, and a finish is written after its time was taken.
LOOKBACK_MS = 60_000
# New members taken per finished set and read; the rest at the next read (the window moves
# only as far as what was taken).
MAX_NEW = 10_000
_JOB_FIELDS = ("name", "timestamp", "delay", "processedOn", "finishedOn", "attemptsMade")
_STALLED = b"job stalled more than allowable limit"
_TIMED_OUT = b"Promise timed out after"
# failedReason is read up to here: a reason is a message, not the job's payload
_MAX_REASON = 4096


@dataclass(slots=True)
class _Window:
    """One finished set's members seen scored within LOOKBACK_MS of the highest score."""

    high: float | None = None
    seen: dict[bytes, float] = field(default_factory=dict)

    def take(self, members: list[tuple[bytes, float]], latest_ms: float) -> list[bytes]:
        """The members not seen before; the window moves on to the newest score that is no
        later than `latest_ms` (a member scored far ahead would blind it to every finish)."""
        new = [member for member, _ in members if member not in self.seen]
        for member, score in members:
            self.seen[member] = score
            if score <= latest_ms:
                self.high = score if self.high is None else max(self.high, score)
        if self.high is not None:
            floor = self.high - LOOKBACK_MS
            self.seen = {m: s for m, s in self.seen.items() if s >= floor}
        return new

    @property
    def floor(self) -> float | str:
        return "-inf" if self.high is None else self.high - LOOKBACK_MS


class BullReader(RedisReader):
    def __init__(self, config: BullReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:bull"
        self.config = config
        self._prefix = config.prefix
        self._windows: dict[tuple[str, str], _Window] = {}
        self._baseline_taken = False

    def read(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues = self._queues(client, signals)
            if self.config.workers:
                self._workers(client, queues, signals)
            finished = self._finished(client, queues, signals)
            jobs = self._jobs(client, finished, signals)
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise
        self._baseline_taken = True
        for queue in queues:  # the series exist from the first read
            labels = (self.config.system, queue, "", "")
            signals.tally.count("queue_jobs_completed_total", labels, 0.0)
        for (queue, target, job_id), job in zip(finished, jobs, strict=True):
            key = f"{self._prefix}:{queue}:{job_id.decode('utf-8', 'replace')}"
            with signals.record(key):  # a job of another type or garbled costs itself
                if isinstance(job, Exception):
                    raise job
                self._emit(signals, queue, target, job)
        signals.tally.consumed += len(finished)

    def _workers(self, client: redis.Redis, queues: list[str], signals: Signals) -> None:
        try:
            clients = client.client_list()
        except redis.ResponseError as error:  # NOPERM, or no CLIENT: the worker count alone
            signals.silent = client_list_refused(error)
            return
        blocking = [c for c in clients if c.get("cmd") == "brpoplpush"]
        database = self.connection.database
        for worker in worker_connections(blocking, self._prefix, queues, database):
            busy = int(not worker.waiting)
            signals.worker(self.config.system, worker.queue, worker.identity, busy, 1)

    def _queues(self, client: redis.Redis, signals: Signals) -> list[str]:
        pattern = f"{literal(self._prefix)}:{{value}}:id"
        regex = key_regex(pattern)
        glob = f"{scan_glob(literal(self._prefix))}:*:id"
        found = set()
        scan = client.scan_iter(match=glob, count=SCAN_COUNT)
        for key in signals.names(scan, MAX_KEYS, f"keys {glob}"):
            match = regex.match(key.decode("utf-8", "replace"))
            if match:
                found.add(match.group("value"))
        return signals.at_most(sorted(found), MAX_QUEUES, "queues")

    def _finished(
        self, client: redis.Redis, queues: list[str], signals: Signals
    ) -> list[tuple[str, str, bytes]]:
        """(queue, completed|failed, job id) of each job finished since the last read. The
        first read is the baseline; a set first read later (a new queue) counts in full."""
        pipe = client.pipeline(transaction=False)
        order = [(queue, target) for queue in queues for target in FINISHED]
        for queue, target in order:
            window = self._windows.get((queue, target)) or _Window()
            pipe.zrangebyscore(
                f"{self._prefix}:{queue}:{target}", window.floor, "+inf",
                start=0, num=len(window.seen) + MAX_NEW, withscores=True,
            )  # fmt: skip
        finished: list[tuple[str, str, bytes]] = []
        for (queue, target), reply in zip(order, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(f"{self._prefix}:{queue}:{target}"):
                if isinstance(reply, Exception):
                    raise reply
                baseline = (queue, target) not in self._windows and not self._baseline_taken
                window = self._windows.setdefault((queue, target), _Window())
                scored = [(member, float(score)) for member, score in reply]
                new = window.take(scored, signals.latest * 1000)
                if not baseline:
                    finished += [(queue, target, job_id) for job_id in new]
        return finished

    def _jobs(
        self, client: redis.Redis, finished: list[tuple[str, str, bytes]], signals: Signals
    ) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for queue, target, job_id in finished:
            reason = "failedReason" if target == "failed" else "name"
            key = f"{self._prefix}:{queue}:".encode() + job_id
            pipe.hmget(key, (*_JOB_FIELDS, reason))
        return pipe.execute(raise_on_error=False) if finished else []

    def _emit(self, signals: Signals, queue: str, target: str, fields: list[Any]) -> None:
        name, created, delay, started, ended, attempts_made, reason = fields
        job_type = (name or b"").decode("utf-8", "replace")
        if job_type == "__default__":  # Bull's name for a job added without one
            job_type = ""
        labels = {"system": self.config.system, "queue": queue, "job_type": job_type}
        ended_at = _at(ended, signals.latest)
        started_at = _at(started, signals.latest)
        due_at = _at(created, signals.latest)
        if due_at is not None:
            due_at += _ms(delay) or 0.0
        execution = None
        if ended_at is not None and started_at is not None:
            execution = ended_at - started_at  # one clock's: a negative is refused (Event.of)
        failures = numbers.count(attempts_made or 0)
        error_type = "" if target == "completed" else _error_type(reason or b"")
        # a final failure is one of the attempts; a stall fails a job without one
        retries = failures if error_type in ("", "other") else max(failures - 1, 0)

        when = signals.now if ended_at is None else ended_at

        def event(what: str, **extra: Any) -> Event:
            return Event.of(what, when, signals.latest, **labels, **extra)

        # every event built (its numbers checked) before any is counted: a refused one costs
        # the whole job
        if target == "completed":
            events = [event("completed", duration=execution, enqueued_at=due_at,
                            attempt=failures + 1)]  # fmt: skip
        else:
            events = [event("failed", error_type=error_type, duration=execution,
                            enqueued_at=due_at, attempt=max(failures, 1))]  # fmt: skip
            if error_type == "timeout":
                events.append(event("timed_out"))
        if retries:  # each failed attempt before, counted as the retried event counts it
            job = (self.config.system, queue, job_type, "")
            signals.tally.count("queue_jobs_failed_total", (*job, "retryable"), retries)
            signals.tally.count("queue_jobs_retried_total", job, retries)
        for built in events:
            apply(signals.tally, built, self.config.system)


def _ms(raw: bytes | None) -> float | None:
    """A span Bull wrote in ms, in seconds; None when absent."""
    if not raw:
        return None
    return numbers.finite(raw) / 1000.0


def _at(raw: bytes | None, latest: float) -> float | None:
    """A time Bull wrote in ms, in seconds, from 1970 to `latest` (numbers.epoch_ms); None
    when absent."""
    return numbers.epoch_ms(raw, latest) if raw else None


def _error_type(reason: bytes) -> str:
    reason = reason[:_MAX_REASON]
    if reason.startswith(_STALLED):
        return "other"  # the worker died or hung under the job
    if reason.startswith(_TIMED_OUT):
        return "timeout"
    return "non_retryable"  # the failed set holds jobs with no attempt left
