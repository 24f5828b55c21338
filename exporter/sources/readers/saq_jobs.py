"""SAQ's finished jobs as execution and wait times, each job observed once.

SAQ (0.26, saq/queue/redis.py and sources/runner.py) keeps each job as a JSON string at
`saq:job:<queue>:<key>`: `queued` is set when it is enqueued (ms, not reset by a retry),
`started` when a worker takes it (ms, reset to 0 by a retry, so only the last attempt's start
is kept), `completed` when it finishes (ms), `attempts` counts the attempts, `scheduled` is
when it is due (epoch seconds, 0: at once). It stays in the `saq:<queue>:incomplete` zset
until it finishes; the finish (`_finish`, one MULTI) removes it from there and writes the
record again with SETEX for the job's `ttl` (600 s by default), SET for ttl 0 (kept for ever)
or deletes it (ttl -1: no record to read). There is no set of finished jobs, but SAQ announces
every change of a job's status once it is written (`notify`: PUBLISH on the job's key, the
status as the message; after `_finish`'s MULTI, in `abort`, `_retry`, `_update`).

So the reader hears them (redis/subscription.py: PSUBSCRIBE saq:job:* on a connection of its own,
kept by a read cut off at its deadline) and reads only the jobs announced (GET, and PTTL for
how long the record is kept), MAX_READS a read, the rest at the next: a read fetches what
finished since the last one, not again what it counted (over 30,000 kept jobs, a read after 3
jobs finished cost 5.8-7.7 KB from Redis in all where looking through the kept records got
1.13 MB: tests/sources/readers/test_native_saq_windows.py). A job announced in another status is read only when it was
remembered finished (a key enqueued again: forgotten once its record says so).

A look lists the job keys (a SCAN of saq:*), asks the remaining life (PTTL) of each between
two readings of Redis' clock (TIME), and asks `incomplete` (ZSCORE) about those with none: a
finished record is one with a ttl, or one without that is no longer incomplete. It is made
only where announcements may be missing: the first read, once the subscription is confirmed
(the baseline: what finished before is remembered, its expiry, without being observed, with
the baseline's time as its `completed`), and after each gap in the subscription (Redis
restarted, the subscriber cut off at its output buffer limit, CLIENT KILL), counted in
queue_exporter_events_lost_total and named in the log: the catch-up look reads the records
not seen before (a key not remembered, or one whose expiry moved: written again), so the jobs
that finished during the gap are observed once, while their records are kept.
A record's expiry is known to within the time Redis took over those PTTLs (Redis' own clock),
so a record written again a few milliseconds or more after its last finish is told from the
same record read again. A record is observed once per `completed`: one remembered with the
same or an earlier `completed` is not observed again, so a job announced again, or read
again after a gap, counts once. A remembered key that is gone, or seen incomplete again, is
forgotten; so is one whose expiry passed (by Redis' clock). At most MAX_KEYS records are
remembered, MAX_ANNOUNCED announcements wait to be read: beyond, a read stops taking
announcements (they wait in Redis, until its output buffer limit cuts the subscriber off: a
gap), and the oldest remembered records are forgotten (over_limit, once a read).

PSUBSCRIBE, PTTL, TIME or ZSCORE refused (an ACL without them) costs the runtimes alone: said
as the reader's silence (its log, the status page, queue_exporter_native_silent), and tried
again LOOK_AGAIN_AFTER later; what was announced meanwhile is read then, while kept.

Each kept record is read once for its `status` (those kept before the baseline too, MAX_READS
a read, after the announced ones), so the failed ones SAQ keeps are counted (`failed`): those
whose expiry, by Redis' clock, is still ahead.

What is observed, per queue and function (job_type): `queue_job_execution_seconds`
(completed - started, the last attempt's) for every finished job that started, and
`queue_job_wait_seconds` (started - max(queued, scheduled)) for a job that finished at its
first attempt: a retried job's last start follows earlier attempts and backoffs.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from exporter.core import numbers
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.framework import MAX_KEYS, MAX_QUEUES, Progress, Signals
from exporter.sources.readers.saq_announcements import (
    FINISHED,
    JOB_PREFIX,
    Announcements,
    CommandRefused,
    refusal,
    refused,
)
from exporter.sources.redis_keys.groups import key_regex

INCOMPLETE_KEYS = "saq:{value}:incomplete"
SCAN_COUNT = 1000
# Seconds after which a refused command (PSUBSCRIBE, PTTL, TIME, ZSCORE) is tried again: not
# at every read.
LOOK_AGAIN_AFTER = 300.0
# Records read (GET) per read; the rest at the next read.
MAX_READS = 10_000
# A job's JSON: its kwargs and result, usually small; larger is refused, not parsed.
MAX_JOB_BYTES = 1 << 20
# PTTL's rounding: an expiry read twice may differ by this much without a write between.
PTTL_ROUNDING_MS = 1


@dataclass(slots=True)
class _Seen:
    queue: str
    expiry: Expiry | None  # when its record expires; None: kept for ever
    completed_ms: float  # its completion time (or the baseline's time) as last read
    failed: bool | None = None  # its status is failed; None: not read yet (kept before)


@dataclass(frozen=True, slots=True)
class Expiry:
    """When a record expires by Redis' clock, in ms: at `at_ms`, or up to `slack_ms` later
    (the time Redis took over the read's PTTLs)."""

    at_ms: float
    slack_ms: float

    def moved(self, other: Expiry) -> bool:
        """The record was written again between the two readings."""
        return abs(self.at_ms - other.at_ms) > self.slack_ms + other.slack_ms + PTTL_ROUNDING_MS

    def passed(self, redis_ms: float) -> bool:
        return self.at_ms + self.slack_ms < redis_ms


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A command the runtimes need was refused: which, why, and when (time.monotonic())."""

    command: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class JobKey:
    queue: str | None  # None: an announced job of a queue not known yet (its record tells)
    key: str


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A finished job's record as read: its JSON, or the error reply reading it gave;
    `status_only`: one kept since before the baseline, read for its status alone."""

    job: JobKey
    expiry: Expiry | None
    raw: Any
    status_only: bool = False


class FinishedJobs:
    """The finished job records of one reader, remembered between its reads."""

    def __init__(self, system: str, connection: RedisConnectionConfig) -> None:
        self.system = system
        # What the last successful read saw; a read works on a copy (`_seen`), which becomes
        # it once the read succeeded: a read that fails observed nothing, its records are read
        # again.
        self._progress: Progress[dict[str, _Seen]] = Progress()
        self._seen: dict[str, _Seen] = {}
        self.announcements = Announcements(connection)
        self._refusal: _Refusal | None = None
        self._counted = False  # `_seen` tells the failed records (this read was not refused)
        self._clock_ms = 0.0  # Redis' clock less this process' (time.time()), as last read
        self._queues: set[str] = set()  # the queues known: listed, and those of the last look
        self._left: set[str] = set()  # queues of records the last read left to the next

    def read(self, client: redis.Redis, queues: list[str], signals: Signals) -> list[JobRecord]:
        """The records finished since the last read (none on the first read: the baseline,
        taken as finished now): those SAQ announced, and after a gap those a look finds. A
        command only this needs refused costs this alone (signals.silent says why); other
        backend errors raise."""
        self._seen = dict(self._progress.at or {})
        self._counted = False
        self.announcements.interrupted = False
        now = time.monotonic()
        standing = self._refusal
        if standing is not None and now - standing.at >= LOOK_AGAIN_AFTER:
            standing = None  # tried again
        try:
            if standing is None or standing.command != "psubscribe":
                # taken while a command is refused too: they wait here, not in Redis' buffer
                self.announcements.take(self._seen, signals)
            if standing is not None:
                signals.silent = standing.reason
                return []
            if not self.announcements.confirmed:
                return []  # the baseline waits for it: what finishes after must be heard
            if self.announcements.look_due:
                self._look(client, queues, signals)
            self._queues |= set(queues)
            records = self._fetch(client, self._wanted(signals))
        except CommandRefused as error:
            signals.silent = str(error)
            self._refusal = _Refusal(error.command, str(error), now)
            return []
        self._refusal = None
        self._counted = True
        self._progress.move(signals, self._seen)
        self.announcements.read([record.job.key for record in records], signals)
        return records

    def interrupt(self) -> None:
        self.announcements.interrupted = True

    def close(self) -> None:
        self.announcements.close()

    def _look(self, client: redis.Redis, queues: list[str], signals: Signals) -> None:
        """Every finished record's expiry (a SCAN, PTTLs): the baseline remembers them (their
        statuses read later), a look after a gap makes those not seen as they are now (new,
        or written again) wait to be read, as if announced; gone ones are forgotten."""
        keys, known = job_keys(client, queues, signals)
        present = {job.key for job in keys}
        self._seen = {key: seen for key, seen in self._seen.items() if key in present}
        expiries, clock_ms = self._expiries(client, keys)
        if clock_ms is not None:
            self._clock_ms = clock_ms
        self._queues = set(known)
        baseline = self._progress.baseline
        for job in keys:
            if job.queue is None or job.key not in expiries or not self._changed(job, expiries):
                continue  # (a listed key's queue is known)
            if baseline:  # finished before: remembered, its status read, not observed
                self._seen[job.key] = _Seen(job.queue, expiries[job.key], signals.now * 1000)
            else:
                self.announcements.add(job.key)  # read as if announced
        self.announcements.looked(signals)

    def _wanted(self, signals: Signals) -> list[tuple[JobKey, bool]]:
        """What this read reads, each with whether for its status only: the announced jobs
        first, then the remembered records whose status was not read yet (kept before the
        baseline), MAX_READS at most; the
        oldest remembered are forgotten beyond MAX_KEYS (over_limit), and those whose
        record expired."""
        redis_ms = time.time() * 1000 + self._clock_ms
        for key in [key for key, seen in self._seen.items() if _expired(seen, redis_ms)]:
            del self._seen[key]
        if len(self._seen) > MAX_KEYS:
            signals.refuse_beyond("over_limit", "finished records remembered", f"> {MAX_KEYS}")
            for key in list(self._seen)[: len(self._seen) - MAX_KEYS]:
                del self._seen[key]
        lengths = _lengths(self._queues)
        wanted: list[tuple[JobKey, bool]] = []
        for key in itertools.islice(self.announcements.waiting, MAX_READS):
            seen = self._seen.get(key)
            queue = seen.queue if seen else _queue_of(key, lengths, self._queues)
            wanted.append((JobKey(queue, key), False))
        room = MAX_READS - len(wanted)
        kept = (
            JobKey(seen.queue, key)
            for key, seen in self._seen.items()
            if seen.failed is None and key not in self.announcements.waiting
        )
        wanted += ((job, True) for job in itertools.islice(kept, room))
        # records left to the next read: the failed counts wait for them (every queue's, when
        # announced ones are left: their queues are not worked out beyond what is read)
        if len(self.announcements.waiting) > MAX_READS:
            self._left = set(self._queues)
        else:
            self._left = {job.queue for job in kept if job.queue is not None}
        return wanted

    def _fetch(self, client: redis.Redis, wanted: list[tuple[JobKey, bool]]) -> list[JobRecord]:
        """Each record (GET) and its expiry (PTTL), between two readings of Redis' clock."""
        if not wanted:
            return []
        local_ms = time.time() * 1000
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for job, _ in wanted:
            pipe.get(job.key)  # not MGET: a record of another type must say so
            pipe.pttl(job.key)
        pipe.time()
        first, *replies, last = pipe.execute(raise_on_error=False)
        began_ms, ended_ms = _clock_ms(first), _clock_ms(last)
        self._clock_ms = began_ms - local_ms
        records = []
        for index, (job, status_only) in enumerate(wanted):
            raw, life = replies[2 * index], replies[2 * index + 1]
            if isinstance(life, Exception):
                raise refusal("pttl", life)
            expiry = Expiry(began_ms + life, ended_ms - began_ms) if life >= 0 else None
            records.append(JobRecord(job, expiry, raw, status_only))
        return records

    def failed(self) -> tuple[dict[str, int], list[str]] | None:
        """The failed records kept per queue (each queue known), by Redis' clock (as last
        measured), of each queue whose every kept record's status was read, and the queues
        left to read; None when this read tells none (none read yet, or refused)."""
        if not self._counted:
            return None
        redis_ms = time.time() * 1000 + self._clock_ms
        failed = dict.fromkeys(sorted(self._queues), 0)
        unread = set(self._left)
        for seen in self._seen.values():
            if seen.failed is None:
                unread.add(seen.queue)
            elif seen.failed and not _expired(seen, redis_ms):
                failed[seen.queue] = failed.get(seen.queue, 0) + 1
        return {queue: n for queue, n in failed.items() if queue not in unread}, sorted(unread)

    def _expiries(
        self, client: redis.Redis, keys: list[JobKey]
    ) -> tuple[dict[str, Expiry | None], float | None]:
        """Each finished record's expiry (None: kept for ever), and Redis' clock less this
        process' (ms; None without a key); a key incomplete again (a key enqueued again) is
        forgotten, to be read once it finished. TIME, PTTL or ZSCORE refused raises
        CommandRefused."""
        if not keys:
            return {}, None
        local_ms = time.time() * 1000
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for job in keys:
            pipe.pttl(job.key)
        pipe.time()
        first, *lives, last = pipe.execute(raise_on_error=False)
        began_ms, ended_ms = _clock_ms(first), _clock_ms(last)
        for life in lives:
            if isinstance(life, Exception):
                # PTTL answers for a key of any type: an error is the backend's (NOPERM), and
                # taken for a record not finished it would leave every runtime unread, silently
                raise refusal("pttl", life)
        endless = [job for job, life in zip(keys, lives, strict=True) if life == -1]
        pipe = client.pipeline(transaction=False)
        for job in endless:
            pipe.zscore(f"saq:{job.queue}:incomplete", job.key)
        scores = pipe.execute(raise_on_error=False) if endless else []
        for score in scores:
            if isinstance(score, Exception) and refused(score):
                raise CommandRefused("zscore", score)
        expiries: dict[str, Expiry | None] = {}
        for job, life in zip(keys, lives, strict=True):
            if isinstance(life, int) and life >= 0:
                expiries[job.key] = Expiry(began_ms + life, ended_ms - began_ms)
        for job, score in zip(endless, scores, strict=True):
            if score is None:
                expiries[job.key] = None
            else:
                self._seen.pop(job.key, None)
        return expiries, began_ms - local_ms

    def _changed(self, job: JobKey, expiries: dict[str, Expiry | None]) -> bool:
        """A finished record not seen as it is now: new, or written again since."""
        seen, expiry = self._seen.get(job.key), expiries[job.key]
        if seen is None:
            return True
        if seen.expiry is None or expiry is None:
            return seen.expiry is not expiry
        return seen.expiry.moved(expiry)

    def observe(self, signals: Signals, record: JobRecord) -> None:
        """One finished record's times into the histograms, once per `completed`. A record
        that cannot be read raises (the caller's signals.record counts it), and is not read
        again until it is announced (or found written) again."""
        key = record.job.key
        seen = self._seen.pop(key, None)
        before = seen.completed_ms if seen else -math.inf
        job = _job(record.raw)
        if job is None:  # gone, or not finished (enqueued again, aborting): forgotten
            return
        queue = record.job.queue or _own_queue(job, key)
        if queue not in self._queues:
            if len(self._queues) >= MAX_QUEUES:
                raise numbers.InvalidValue("over_limit", f"more than {MAX_QUEUES} queues")
            self._queues.add(queue)
        self._seen[key] = _Seen(queue, record.expiry, before, job["status"] == "failed")
        if record.status_only:
            return
        latest = signals.latest * 1000
        completed = numbers.epoch(job["completed"], latest)
        if completed <= before:
            return  # the same finish, announced or written again (or one before the baseline)
        self._seen[key].completed_ms = completed
        function = job.get("function", "")
        if not isinstance(function, str) or job.get("queue", queue) != queue:
            raise numbers.InvalidValue("bad_value", "function or queue is no name of this job")
        for metric, value in _times(job, completed, latest):
            signals.tally.observe(metric, (self.system, queue, function, ""), value)


def _expired(seen: _Seen, redis_ms: float) -> bool:
    return seen.expiry is not None and seen.expiry.passed(redis_ms)


def _own_queue(job: dict[str, Any], key: str) -> str:
    """The queue a record names, when its key is the one SAQ builds from it (job_id)."""
    queue, own = job.get("queue"), job.get("key")
    if not isinstance(queue, str) or not isinstance(own, str) or not queue:
        raise numbers.InvalidValue("bad_value", "a job that names no queue or key")
    if key != f"{JOB_PREFIX}{queue}:{own}":
        raise numbers.InvalidValue("bad_value", "a job whose queue and key are not its key's")
    return queue


def job_keys(
    client: redis.Redis, queues: list[str], signals: Signals
) -> tuple[list[JobKey], list[str]]:
    """Every job's key of the `queues` and of those with unfinished jobs (one SCAN of saq:*,
    MAX_KEYS keys at most: Signals.names), and these queues."""
    incomplete = key_regex(INCOMPLETE_KEYS)
    with_jobs, names = set(), []
    scan = client.scan_iter(match="saq:*", count=SCAN_COUNT)
    for raw in signals.names(scan, MAX_KEYS, "keys saq:*"):
        key = raw.decode("utf-8", "replace")
        if key.startswith(JOB_PREFIX):
            names.append(key)
        elif match := incomplete.match(key):
            with_jobs.add(match.group("value"))
    known = set(queues) | set(signals.at_most(sorted(with_jobs), MAX_QUEUES, "queues with jobs"))
    return _of_known_queues(sorted(set(names)), known, signals), sorted(known)


def _of_known_queues(names: list[str], queues: set[str], signals: Signals) -> list[JobKey]:
    """Each job key (`saq:job:<queue>:<key>`) of a known queue: a queue's name and a job's
    key may both hold colons (SAQ's cron keys are `cron:<function>`), so the longest known
    queue the key starts with (followed by a colon) is the job's. Each known length is tried
    once, so a key costs the number of lengths times its length (names are at most
    MAX_NAME_BYTES: Signals.names), whatever colons it holds."""
    lengths = _lengths(queues)
    keys = []
    for name in signals.names(names, MAX_KEYS, "job keys"):  # the read's deadline checked
        queue = _queue_of(name, lengths, queues)
        if queue is not None:
            keys.append(JobKey(queue, name))
    return keys


def _lengths(queues: set[str]) -> list[int]:
    """The lengths of the known queues' names, longest first (_queue_of)."""
    return sorted({len(queue) for queue in queues if queue}, reverse=True)


def _queue_of(name: str, lengths: list[int], queues: set[str]) -> str | None:
    """The longest known queue a job key starts with (after saq:job:, followed by a colon),
    or None."""
    rest = name[len(JOB_PREFIX) :]
    for length in lengths:
        if length < len(rest) and rest[length] == ":" and rest[:length] in queues:
            return rest[:length]
    return None


def _clock_ms(reply: Any) -> float:
    """Redis' TIME (seconds, microseconds) in ms; an error reply raises (CommandRefused when
    TIME was refused)."""
    if isinstance(reply, Exception):
        raise refusal("time", reply)
    seconds, microseconds = reply
    return int(seconds) * 1000 + int(microseconds) / 1000


def _job(raw: Any) -> dict[str, Any] | None:
    """A finished job's record; None once it expired or while it is not finished (aborting)."""
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        return None
    if len(raw) > MAX_JOB_BYTES:
        raise numbers.InvalidValue("oversized_field", f"a job of {len(raw)} bytes")
    job = json.loads(raw)
    if not isinstance(job, dict):
        raise numbers.InvalidValue("bad_value", "a job that is not an object")
    if job.get("status") not in FINISHED or not job.get("completed"):
        return None
    return job


def _times(job: dict[str, Any], completed: float, latest: float) -> Iterable[tuple[str, float]]:
    """(histogram, seconds) of one finished job; every value checked before any is yielded,
    so a refused one costs the whole job."""
    if not job.get("started"):
        return []  # aborted before it ran
    started = numbers.epoch(job["started"], latest)
    times = [("queue_job_execution_seconds", numbers.seconds((completed - started) / 1000))]
    if numbers.count(job.get("attempts", 0)) == 1:
        queued = numbers.epoch(job.get("queued", 0), latest)
        due = numbers.due(job.get("scheduled", 0)) * 1000
        wait = (started - max(queued, due)) / 1000
        times.append(("queue_job_wait_seconds", numbers.seconds(max(wait, 0.0))))
    return times
