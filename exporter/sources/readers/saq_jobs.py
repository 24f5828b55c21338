"""SAQ's finished jobs as execution and wait times, each job observed once.

SAQ (0.26, saq/queue/redis.py and sources/runner.py) keeps each job as a JSON string at
`saq:job:<queue>:<key>`: `queued` is set when it is enqueued (ms, not reset by a retry),
`started` when a worker takes it (ms, reset to 0 by a retry, so only the last attempt's start
is kept), `completed` when it finishes (ms), `attempts` counts the attempts, `scheduled` is
when it is due (epoch seconds, 0: at once). It stays in the `saq:<queue>:incomplete` zset
until it finishes; the finish (`_finish`, one MULTI) removes it from there and writes the
record again with SETEX for the job's `ttl` (600 s by default), SET for ttl 0 (kept for ever)
or deletes it (ttl -1: no record to read). There is no set of finished jobs.

A read looks for finished records only when one may have finished: at the first read, once
a live worker's counts moved since the last look (a worker counts a job after its `_finish`
wrote the record, and writes its counts every `worker_info` timer), and LOOK_AGAIN_AFTER after
the last look whatever the counts (a job finished where no counts show it). A read that does
not look sends none of what follows: over 30,000 kept jobs an idle read got 2.1 KB from Redis,
not 1.13 MB (tests/sources/readers/test_native_saq.py). A look lists the job keys (a SCAN of saq:*), asks the
remaining life (PTTL) of each between two readings of Redis' clock (TIME), and asks
`incomplete` (ZSCORE) about those with none: a finished record is one with a ttl, or one
without that is no longer incomplete. PTTL, TIME or ZSCORE refused (an ACL without them)
costs the runtimes alone: the look is given up, said as the reader's silence (its log, the
status page, queue_exporter_native_silent), and tried again LOOK_AGAIN_AFTER later.
A record's expiry is known to within the time Redis took over those PTTLs (Redis' own clock:
how late this process ran, or how long its SCAN took, does not move it), so a record written
again a few milliseconds or more after its last finish is told from the same record read
again. Only the finished records not seen before
(a key not remembered, or one whose expiry moved: written again) are read (GET), at most
MAX_READS per read, the rest at the next. A record is observed once per `completed`: one
remembered with the same or an earlier `completed` is not observed again, so a job updated
after it finished, or read again, counts once. The reader's first read is its baseline: what
finished before is remembered (its expiry) without being read, with the baseline's time as
its `completed`. A remembered key that is gone, or seen incomplete again (a key enqueued
again), is forgotten.

Each kept record is read once for its `status` (those kept before the baseline too, MAX_READS
a read, a look at every read until all are read), so the failed ones SAQ keeps are counted
(`failed`): those whose expiry, by Redis' clock, is still ahead.

What is observed, per queue and function (job_type): `queue_job_execution_seconds`
(completed - started, the last attempt's) for every finished job that started, and
`queue_job_wait_seconds` (started - max(queued, scheduled)) for a job that finished at its
first attempt: a retried job's last start follows earlier attempts and backoffs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from exporter.core import numbers
from exporter.sources.readers.framework import MAX_KEYS, MAX_QUEUES, Progress, Signals
from exporter.sources.redis_keys.groups import key_regex

JOB_PREFIX = "saq:job:"
INCOMPLETE_KEYS = "saq:{value}:incomplete"
SCAN_COUNT = 1000
# Seconds after which a read looks for finished records whatever the workers' counts: a job
# finished where no live worker's counts show it (finished by a client, or by a worker gone
# before it wrote its counts, whose leaving shows) is observed within this, while its record is
# kept (600 s by default). A look refused (PTTL) is tried again this often, not at every read.
LOOK_AGAIN_AFTER = 300.0
RUNTIMES = 'queue_job_execution_seconds, queue_job_wait_seconds and queue_depth{state="failed"}'
# Finished records read (GET) per read; the rest at the next read.
MAX_READS = 10_000
# A job's JSON: its kwargs and result, usually small; larger is refused, not parsed.
MAX_JOB_BYTES = 1 << 20
# PTTL's rounding: an expiry read twice may differ by this much without a write between.
PTTL_ROUNDING_MS = 1
FINISHED = ("complete", "failed", "aborted")


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


@dataclass(frozen=True, slots=True)
class _Look:
    """The last read that looked for finished records: the live workers' counts it read, when
    (time.monotonic()), and why the look was refused (None: it was made)."""

    counts: Mapping[Hashable, float]
    at: float
    refused: str | None
    queues: tuple[str, ...] = ()  # the queues whose job keys it listed


class CommandRefused(Exception):
    """A command only the runtimes and the failed count need was refused (the ACL, or a
    server without it): they are not served, every other series is."""

    def __init__(self, command: str, error: Exception) -> None:
        lines = str(error).splitlines()
        first_line = lines[0][:200] if lines else type(error).__name__
        name = command.upper()
        super().__init__(
            f"{name} refused ({first_line}): {RUNTIMES} are not served, every other series is; "
            f"the ACL needs +{command} on saq:job:* (or the server its {name} command)"
        )


@dataclass(frozen=True, slots=True)
class JobKey:
    queue: str
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

    def __init__(self, system: str) -> None:
        self.system = system
        # What the last successful read saw; a read works on a copy (`_seen`), which becomes
        # it once the read succeeded: a read that fails observed nothing, its records are read
        # again.
        self._progress: Progress[dict[str, _Seen]] = Progress()
        self._seen: dict[str, _Seen] = {}
        self._look: Progress[_Look] = Progress()
        self._unread = False  # kept records' statuses left to read after the last look
        self._counted = False  # `_seen` tells the failed records (a look made, not refused)
        self._clock_ms = 0.0  # Redis' clock less this process' (time.time()), as last read
        self._queues: list[str] = []  # the queues whose job keys the last look listed
        self._left: set[str] = set()  # queues of records the last look left to the next

    def read(
        self,
        client: redis.Redis,
        queues: list[str],
        counts: Mapping[Hashable, float],
        signals: Signals,
    ) -> list[JobRecord]:
        """The records finished since the last read (none on the first read: the baseline,
        taken as finished now), looked for only when one may have finished (`_looks`: the
        live workers' `counts` moved). A command only this needs refused costs this alone
        (signals.silent says why); other backend errors raise."""
        now = time.monotonic()
        last = self._look.at
        if last is not None and not _looks(last, counts, now, self._unread):
            signals.silent = last.refused
            self._seen = dict(self._progress.at or {})  # the failed records of the last look
            self._counted = last.refused is None and self._progress.at is not None
            self._queues = list(last.queues)
            return []
        keys, known = job_keys(client, queues, signals)
        present = {job.key for job in keys}
        self._seen = {
            key: seen for key, seen in (self._progress.at or {}).items() if key in present
        }
        try:
            expiries, clock_ms = self._expiries(client, keys)
        except CommandRefused as refused:
            signals.silent = str(refused)
            self._look.move(signals, _Look(dict(counts), now, str(refused)))
            self._counted = False
            return []
        self._counted = True
        if clock_ms is not None:
            self._clock_ms = clock_ms
        self._look.move(signals, _Look(dict(counts), now, None, tuple(known)))
        self._queues = known
        baseline = self._progress.baseline
        self._progress.move(signals, self._seen)
        wanted = []
        for job in keys:
            if job.key not in expiries:
                continue
            if self._changed(job, expiries):
                if baseline:  # finished before: remembered, its status read, not observed
                    self._seen[job.key] = _Seen(job.queue, expiries[job.key], signals.now * 1000)
                wanted.append(JobRecord(job, expiries[job.key], None, status_only=baseline))
            elif self._seen[job.key].failed is None:
                wanted.append(JobRecord(job, expiries[job.key], None, status_only=True))
        # records left to the next read: their queues' failed counts wait for them
        self._left = {record.job.queue for record in wanted[MAX_READS:]}
        wanted = wanted[:MAX_READS]
        pipe = client.pipeline(transaction=False)
        for record in wanted:
            pipe.get(record.job.key)  # not MGET: a record of another type must say so
        replies = pipe.execute(raise_on_error=False) if wanted else []
        return [
            JobRecord(record.job, record.expiry, raw, record.status_only)
            for record, raw in zip(wanted, replies, strict=True)
        ]

    def failed(self) -> tuple[dict[str, int], list[str]] | None:
        """The failed records kept per queue (each queue of the last look), by Redis' clock
        (as last measured), of each queue whose every kept record's status was read, and the
        queues left to read; None when this read tells none (no look made yet, or refused). A
        record gone without a worker's counts moving (deleted, its key enqueued again) leaves
        the count at the next look."""
        if not self._counted:
            return None
        redis_ms = time.time() * 1000 + self._clock_ms
        failed = dict.fromkeys(self._queues, 0)
        unread = set(self._left)
        for seen in self._seen.values():
            if seen.failed is None:
                unread.add(seen.queue)
            elif seen.failed and (seen.expiry is None or seen.expiry.at_ms > redis_ms):
                failed[seen.queue] = failed.get(seen.queue, 0) + 1
        self._unread = bool(unread)
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
                raise _refusal("pttl", life)
        endless = [job for job, life in zip(keys, lives, strict=True) if life == -1]
        pipe = client.pipeline(transaction=False)
        for job in endless:
            pipe.zscore(f"saq:{job.queue}:incomplete", job.key)
        scores = pipe.execute(raise_on_error=False) if endless else []
        for score in scores:
            if isinstance(score, Exception) and _refused(score):
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
        again until it is written again."""
        key, queue = record.job.key, record.job.queue
        seen = self._seen.get(key)
        before = seen.completed_ms if seen else -math.inf
        self._seen[key] = _Seen(queue, record.expiry, before, failed=False)  # if unreadable
        job = _job(record.raw)
        if job is None:  # gone, or not finished yet (aborting): read again
            self._seen.pop(key)
            return
        self._seen[key].failed = job["status"] == "failed"
        if record.status_only:
            return
        latest = signals.latest * 1000
        completed = numbers.epoch(job["completed"], latest)
        if completed <= before:
            return  # the same finish, written again (or one before the baseline)
        self._seen[key].completed_ms = completed
        function = job.get("function", "")
        if not isinstance(function, str) or job.get("queue", queue) != queue:
            raise numbers.InvalidValue("bad_value", "function or queue is no name of this job")
        for metric, value in _times(job, completed, latest):
            signals.tally.observe(metric, (self.system, queue, function, ""), value)


def _looks(last: _Look, counts: Mapping[Hashable, float], now: float, unread: bool) -> bool:
    """Whether a read looks for finished records, after the `last` look: once a live worker's
    counts moved since (a worker counts a job after it wrote its finished record, and writes
    its counts every few seconds; a worker gone or new moves them too), while kept records'
    statuses are left to read (MAX_READS a read), and LOOK_AGAIN_AFTER after the last look
    whatever the counts; while a command is refused, only then."""
    if now - last.at >= LOOK_AGAIN_AFTER:
        return True
    return last.refused is None and (unread or last.counts != counts)


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
    lengths = sorted({len(queue) for queue in queues if queue}, reverse=True)
    keys = []
    for name in signals.names(names, MAX_KEYS, "job keys"):  # the read's deadline checked
        rest = name[len(JOB_PREFIX) :]
        for length in lengths:
            if length < len(rest) and rest[length] == ":" and rest[:length] in queues:
                keys.append(JobKey(rest[:length], name))
                break
    return keys


def _refused(error: Exception) -> bool:
    """A command refused: by the ACL (NOPERM), or unknown to the server (renamed)."""
    text = str(error).lower()
    return isinstance(error, redis.exceptions.NoPermissionError) or text.startswith(
        ("noperm", "unknown command")
    )


def _refusal(command: str, error: Exception) -> Exception:
    """What an error reply of a command only runtimes need raises."""
    return CommandRefused(command, error) if _refused(error) else error


def _clock_ms(reply: Any) -> float:
    """Redis' TIME (seconds, microseconds) in ms; an error reply raises (CommandRefused when
    TIME was refused)."""
    if isinstance(reply, Exception):
        raise _refusal("time", reply)
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
