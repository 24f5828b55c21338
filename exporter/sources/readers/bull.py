"""Bull's finished jobs as throughput, failures, retries and runtimes.

Bull (the `bull` package, 3.x and 4.x) records no event stream: its events go over Pub/Sub
only. What it keeps is each finished job: moveToFinished adds the job id to
`<prefix>:<queue>:completed` or `:failed`, a zset scored by the job's finishedOn (ms, the
worker's clock), and writes finishedOn into the job's hash, whose processedOn is when its last
attempt started, attemptsMade how many attempts failed, timestamp and delay when it was
created and for how long it was held back. A failed attempt with attempts left leaves no
record but the job's attemptsMade (Bull moves the job to delayed or wait).

Every read goes on from where the last one got to in each queue's finished sets, in the set's
own order (score, then member), and counts the ids it had not counted: a completion, or a
final failure (error type `other` when Bull failed it for stalling, `timeout` for its timeout,
else `non_retryable`), with the execution time (finishedOn - processedOn), the time since the
job could first run (timestamp + delay) and the attempts; the attempts that failed before are
counted then as retryable failures and retries. What a read fetches is what is new, not what
it counted before (_Window): the members past its cursor, at most MAX_NEW new ones, the rest at
the next read; and since a finish is scored by the worker's clock when the job ended, written a
moment later (or by a worker whose clock is behind), members scored up to LOOKBACK_MS behind
the cursor (its own score included) are looked for with one ZCOUNT per CHUNK counted members,
and only a range whose count changed is fetched again (while the reader keeps up, the ranges
of the last LOOKBACK_MS only: an idle queue costs no ZCOUNT). Members scored further back than
that (a worker's clock that far behind) are not counted. The reader's first read is its baseline, at
the newest members: what finished before is not counted; a queue that shows later counts its
finished jobs in full. The window moves only once the whole read succeeded (framework.Progress):
a read that fails after fetching the new members, reading the jobs or counting them counts them
at the next read. Jobs removed on completion or failure (removeOnComplete: true) leave no
record and are not counted; a keep-count smaller than what finishes before the reader gets to
it loses the excess: when the set was trimmed past the cursor of a read that left a backlog,
that is counted (`over_limit`, once per set and read).

Queues are those with an `<prefix>:<queue>:id` counter, as for the preset. Workers come from
the connections Bull names `<prefix>:<base64 of the queue name>` (CLIENT SETNAME,
lib/worker.js), which `Queue.getWorkers()` lists from CLIENT LIST; one CLIENT LIST per read
serves every queue (bullmq_workers.py's form, without BullMQ's `:w:` names). getWorkers()
counts connections, not workers: Bull 4 names a worker's blocking connection only, Bull 3
every connection of every Queue (a producer's too, a worker's three). So a worker here is a
named connection whose last command is BRPOPLPUSH, the blocking one each worker has, in the
reader's database (CLIENT LIST lists every database's): idle while blocked waiting for its
next job, else busy. No slots: CLIENT LIST does not tell a worker's concurrency, so no
queue_worker_slots or utilization is served (none made up).
"""

from __future__ import annotations

import itertools
import logging
import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from exporter.core import numbers
from exporter.lifecycle.metrics import apply
from exporter.lifecycle.wire import Event
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bullmq_workers import client_list_refused, worker_connections
from exporter.sources.readers.config import BullReaderConfig
from exporter.sources.readers.framework import MAX_KEYS, MAX_QUEUES, Progress, RedisReader, Signals
from exporter.sources.redis_keys.groups import key_regex, literal, scan_glob

log = logging.getLogger(__name__)
FINISHED = ("completed", "failed")
SCAN_COUNT = 1000
# How far behind the cursor a late member is still looked for: Bull's scores come from each
# worker's own clock, and a finish is written after its time was taken.
LOOKBACK_MS = 60_000
# New members taken per finished set and read; the rest at the next read (the window moves
# only as far as what was taken).
MAX_NEW = 10_000
# Counted members a window remembers (the newest), to tell a late member from a counted one.
MAX_REMEMBERED = 50_000
# Remembered members per ZCOUNT of the late check: a range whose count changed is fetched again,
# this many members besides the late ones.
CHUNK = 1_000
_JOB_FIELDS = ("name", "timestamp", "delay", "processedOn", "finishedOn", "attemptsMade")
_STALLED = b"job stalled more than allowable limit"
_TIMED_OUT = b"Promise timed out after"
# failedReason is read up to here: a reason is a message, not the job's payload
_MAX_REASON = 4096
_Scored = list[tuple[bytes, float]]


@dataclass(frozen=True, slots=True)
class _Range:
    """Scores from `low` to `high` (`high` itself too when `closed`: the cursor's own), and
    how many counted members the window remembers in them."""

    low: float
    high: float
    closed: bool
    remembered: int

    def holds(self, score: float) -> bool:
        return self.low <= score < self.high or (self.closed and score == self.high)

    def args(self) -> tuple[str, str]:
        """Its bounds as ZCOUNT and ZRANGEBYSCORE take them."""
        return repr(self.low), repr(self.high) if self.closed else f"({self.high!r}"

    def count_in(self, scores: list[float]) -> int:
        """How many of `scores` (sorted) it holds."""
        upto = bisect_right(scores, self.high) if self.closed else bisect_left(scores, self.high)
        return max(upto - bisect_left(scores, self.low), 0)


@dataclass(frozen=True, slots=True)
class _Window:
    """What the reader counted of one finished set. `cursor`: every member scored up to it
    (from `floor` on) was taken (None: nothing taken yet, the set is read from its start).
    `members`: the members counted (or taken at the baseline) scored from `floor` on, at most
    MAX_REMEMBERED of them, the newest; a member scored beyond the latest time a record may
    name is remembered but never moves the cursor (one far ahead would blind it to every
    finish). `behind`: the last read left new members for the next."""

    cursor: float | None = None
    floor: float = -math.inf
    members: Mapping[bytes, float] = field(default_factory=dict)
    behind: bool = False

    def gone_below(self, lowest: list[tuple[bytes, float]]) -> list[float]:
        """The scores (sorted) of remembered members ordered before the set's lowest member
        now (none: the set is empty): trimmed since (Bull's removeOnComplete: <count> removes
        the lowest), so the late check does not take their absence for a late member's
        presence."""
        if not lowest:
            return sorted(self.members.values())
        first = (float(lowest[0][1]), lowest[0][0])
        return sorted(s for m, s in self.members.items() if (s, m) < first)

    def without(self, lowest: list[tuple[bytes, float]]) -> _Window:
        """This window without the members trimmed since (gone_below)."""
        if not lowest:
            return replace(self, members={})
        first = (float(lowest[0][1]), lowest[0][0])
        kept = {m: s for m, s in self.members.items() if (s, m) >= first}
        return replace(self, members=kept)

    def ahead(self) -> int:
        """Remembered members the fetch from the cursor returns again (those scored ahead of
        the latest time, which never move it): they are skipped."""
        cursor = -math.inf if self.cursor is None else self.cursor
        return sum(1 for score in self.members.values() if score > cursor)

    def ranges(self, since_ms: float) -> list[_Range]:
        """The ranges from the floor to the cursor (included), CHUNK remembered members each,
        whose count the late check compares. Of a window not behind, those ending after
        `since_ms` only: a member written now scored further back is not looked for (an idle
        queue costs no late check)."""
        if self.cursor is None:
            return []
        cursor = self.cursor
        below = sorted(score for score in self.members.values() if score <= cursor)
        bounds = sorted({self.floor, *below[CHUNK::CHUNK]} - {cursor}) or [cursor]
        ranges = []
        for low, high in zip(bounds, [*bounds[1:], cursor], strict=True):
            closed = high == cursor
            upto = bisect_right(below, high) if closed else bisect_left(below, high)
            ranges.append(_Range(low, high, closed, upto - bisect_left(below, low)))
        return [r for r in ranges if self.behind or r.high > since_ms]

    def moved(
        self,
        fetched: _Scored,
        limit: int,
        refetched: dict[_Range, tuple[_Scored, bool]],
        latest_ms: float,
    ) -> tuple[_Window, list[bytes], bool]:
        """The window after a read, the members it counts (in the set's order), and whether
        late members it left unread fell behind its floor (lost). `fetched`: those past the
        cursor (`limit` at most); `refetched`: the ranges up to it fetched again, and whether
        their fetch was cut at its limit (more left for the next read)."""
        members = dict(self.members)
        unread_from = math.inf  # late members from this score on may be left for later reads
        for scores, (part, cut) in refetched.items():
            # A fetch cut at its limit read its range up to its last score, where more may be
            # unread (they count at a later read: the range's count still differs).
            reread_to = part[-1][1] if cut and part else math.inf
            unread_from = min(unread_from, reread_to)
            # what the range holds now, as far as it was read: trimmed members are forgotten
            gone = [m for m, s in members.items() if scores.holds(s) and s < reread_to]
            for member in gone:
                del members[member]
        late = list(itertools.chain(*(part for part, _ in refetched.values())))
        members.update(late)
        members.update(fetched)
        read = (m for m, _ in [*late, *fetched])
        new = [m for m in dict.fromkeys(read) if m not in self.members and m in members]
        cursor = self.cursor
        for _, score in fetched:
            if score <= latest_ms:
                cursor = score if cursor is None else max(cursor, score)
        behind = len(fetched) >= limit or unread_from < math.inf
        window = _window(cursor, members, behind, latest_ms, self.floor)
        return window, new, window.floor > unread_from


def _window(
    cursor: float | None,
    members: dict[bytes, float],
    behind: bool,
    latest_ms: float,
    known_from: float = -math.inf,
) -> _Window:
    """A window keeping the members from LOOKBACK_MS before the cursor on (from `known_from`
    on, when only those were read), at most MAX_REMEMBERED of them (the newest; a cut never
    splits members of one score, so the late check's counts stay exact) and MAX_NEW scored
    ahead of the latest time."""
    if cursor is None:
        return _Window(None, -math.inf, members, behind)
    floor = max(cursor - LOOKBACK_MS, known_from)
    kept = sorted(((s, m) for m, s in members.items() if floor <= s <= latest_ms), reverse=True)
    if len(kept) > MAX_REMEMBERED:
        cut = kept[MAX_REMEMBERED][0]
        if cut < cursor:  # members at the cursor's own score are all kept
            floor = math.nextafter(cut, math.inf)
            kept = [(s, m) for s, m in kept if s > cut]
    ahead = sorted((s, m) for m, s in members.items() if s > latest_ms)[:MAX_NEW]
    return _Window(cursor, floor, {m: s for s, m in kept + ahead}, behind)


class BullReader(RedisReader):
    def __init__(self, config: BullReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:bull"
        self.config = config
        self._prefix = config.prefix
        self._windows: Progress[dict[tuple[str, str], _Window]] = Progress()

    def collect(self, signals: Signals) -> None:
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
            # capacity None: CLIENT LIST does not tell the worker's concurrency (no slot series)
            signals.worker(self.config.system, worker.queue, worker.identity, busy, None)

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
        """(queue, completed|failed, job id) of each job finished since the last read; the
        windows after this read, moved once it succeeded. The first read is the baseline; a
        set first read later (a new queue) counts in full."""
        windows = self._windows.at
        latest_ms, since_ms = signals.latest * 1000, (signals.now * 1000) - LOOKBACK_MS
        sets = [(queue, target) for queue in queues for target in FINISHED]
        if windows is None:
            self._windows.move(signals, self._baseline(client, sets, signals, latest_ms))
            return []
        olds = {found: windows.get(found) or _Window() for found in sets}
        checked = {found: old.ranges(since_ms) for found, old in olds.items()}
        limits = {found: old.ahead() + MAX_NEW for found, old in olds.items()}
        pipe = client.pipeline(transaction=False)
        for (queue, target), old in olds.items():
            key = f"{self._prefix}:{queue}:{target}"
            past = "-inf" if old.cursor is None else f"({old.cursor!r}"
            limit = limits[queue, target]
            pipe.zrangebyscore(key, past, "+inf", start=0, num=limit, withscores=True)
            for scores in checked[queue, target]:  # late members: a count that changed
                pipe.zcount(key, *scores.args())
            if old.behind or checked[queue, target]:
                # Its lowest member, after the counts (a trim in between costs a fetch, not a
                # miss): what was trimmed since, and whether past the cursor of a backlog.
                pipe.zrange(key, 0, 0, withscores=True)
        replies = iter(pipe.execute(raise_on_error=False))
        read: dict[tuple[str, str], tuple[_Scored, list[tuple[_Range, int]]]] = {}
        again = client.pipeline(transaction=False)
        for (queue, target), old in olds.items():
            key = f"{self._prefix}:{queue}:{target}"
            ranges = checked[queue, target]
            fetched = next(replies)
            counts = [next(replies) for _ in ranges]
            lowest = next(replies) if old.behind or ranges else None
            with signals.record(key):
                for reply in (fetched, lowest, *counts):
                    if isinstance(reply, Exception):
                        raise reply
                cursor = math.inf if old.cursor is None else old.cursor
                if old.behind and lowest and float(lowest[0][1]) > cursor:
                    # trimmed past the cursor before its backlog was read
                    signals.tally.refuse("over_limit")
                gone = [] if lowest is None else old.gone_below(lowest)
                if lowest is not None:
                    olds[queue, target] = old.without(lowest)
                changed = []
                for scores, count in zip(ranges, counts, strict=True):
                    if count != scores.remembered - scores.count_in(gone):
                        num = scores.remembered + MAX_NEW  # the remembered and MAX_NEW more
                        changed.append((scores, num))
                        again.zrangebyscore(key, *scores.args(), 0, num, withscores=True)
                read[queue, target] = ([(m, float(s)) for m, s in fetched], changed)
        refetched = iter(again.execute(raise_on_error=False) if len(again) else [])
        moved: dict[tuple[str, str], _Window] = {}
        finished: list[tuple[str, str, bytes]] = []
        for (queue, target), (fetched, changed) in read.items():
            old = olds[queue, target]
            again_read = {scores: (next(refetched), num) for scores, num in changed}
            with signals.record(f"{self._prefix}:{queue}:{target}"):
                late = {}
                for scores, (reply, num) in again_read.items():
                    if isinstance(reply, Exception):
                        raise reply
                    late[scores] = ([(m, float(s)) for m, s in reply], len(reply) >= num)
                limit = limits[queue, target]
                window, new, lost = old.moved(fetched, limit, late, latest_ms)
                if lost:  # late members left unread fell behind the floor: not counted
                    signals.tally.refuse("over_limit")
                moved[queue, target] = window
                finished += [(queue, target, job_id) for job_id in new]
        # a set not readable this read keeps its window (none: counted in full once readable)
        self._windows.move(signals, {**{s: w for s, w in windows.items() if s in olds}, **moved})
        return finished

    def _baseline(
        self,
        client: redis.Redis,
        sets: list[tuple[str, str]],
        signals: Signals,
        latest_ms: float,
    ) -> dict[tuple[str, str], _Window]:
        """Each set's window at its newest members: the MAX_NEW newest up to the latest time a
        record may name, and those beyond it (not counted later either)."""
        pipe = client.pipeline(transaction=False)
        for queue, target in sets:
            key = f"{self._prefix}:{queue}:{target}"
            pipe.zrevrangebyscore(key, repr(latest_ms), "-inf", 0, MAX_NEW, withscores=True)
            pipe.zrangebyscore(key, f"({latest_ms!r}", "+inf", 0, MAX_NEW, withscores=True)
        replies = iter(pipe.execute(raise_on_error=False))
        windows = {}
        for queue, target in sets:
            newest, ahead = next(replies), next(replies)
            with signals.record(f"{self._prefix}:{queue}:{target}"):
                for reply in (newest, ahead):
                    if isinstance(reply, Exception):
                        raise reply
                members = {m: float(s) for m, s in [*newest, *ahead]}
                cursor = float(newest[0][1]) if newest else None
                known_from = -math.inf
                if len(newest) >= MAX_NEW:  # more at the lowest score read may be unread
                    cut = float(newest[-1][1])
                    known_from = math.nextafter(cut, math.inf)
                    members = {m: s for m, s in members.items() if s > cut}
                    if cursor == cut:  # all of one score: the cursor passes that score
                        cursor = known_from
                # an empty set: its first members are all new (from its start)
                windows[queue, target] = _window(cursor, members, False, latest_ms, known_from)
        return windows

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
