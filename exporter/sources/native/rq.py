"""RQ's own records as lifecycle signals: job registries and the worker registry.

Every read compares each queue's started (`rq:wip:<q>`), finished and failed registries with
the previous read: a job id new in finished is a completion, new in failed a final failure,
new in started a start; a job that left started for neither was put back for another attempt
(a retry). The job hash (`rq:job:<id>`) gives the job type (its description up to the
argument list), the enqueue, start and end times (wait and execution histograms); the latest
result (`rq:results:<id>`, RQ 1.12+, else the hash's exc_info) whether a failure was a timeout.
These are the jobs' own records, not a worker's counts, so a worker restart resets nothing.
The first read only takes the baseline: what finished before the exporter started is not
counted.

Workers come from `rq:workers` and their hashes (state busy or idle, the queues they serve),
and RQ 3's rate-limited jobs (`rq:rl:<key>:rate_limited`, held back per rate-limit key, not
per queue) are counted as pending under their job's queue, which no key group can see.

A record that cannot be read (a key of another type, a garbled job) costs itself only
(framework.py): a queue whose registries cannot all be read keeps its previous state until
they can, so its changes are counted once, then.

A started member in RQ 2+ is `<job id>:<execution id>` (RQ job ids hold no colon), so a job
retried and started again between two reads is still seen leaving; RQ 1 writes the job id.

Each registry is read up to MAX_REGISTRY members, its highest scored: RQ scores a member by
when it expires (its end or start plus its TTL), so with a common TTL the newest. A registry
that holds more is read as a window of its newest: a member scored below the lowest of a full
read was not read (neither new when it shows later, nor gone when it is no longer read), and
a full read whose lowest member is new may have left new members unread: counted once per read
as over_limit. So what a read holds and remembers is bounded per registry; registries within
the limit are read whole, as before.
"""

from __future__ import annotations

import math
import zlib
from base64 import b64decode
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from exporter import numbers
from exporter.catalog import BY_NAME
from exporter.events.metrics import apply
from exporter.events.wire import Event
from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.item_time import TimeParseError, parse_time
from exporter.sources.key_values import select
from exporter.sources.members import members_of
from exporter.sources.native.config import RQ_REGISTRIES, RqReaderConfig
from exporter.sources.native.framework import (
    MAX_KEYS,
    MAX_QUEUES,
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    RedisReader,
    Signals,
)

DEPTH = BY_NAME["queue_depth"]
_JOB_FIELDS = ("description", "enqueued_at", "started_at", "ended_at", "status", "exc_info")
# Failure text read to classify a failure (a traceback); beyond it nothing is decompressed.
_MAX_EXC_TEXT = 65536
# Members read and remembered per registry and read: the highest scored.
MAX_REGISTRY = 10_000
# Jobs whose hashes one pipeline reads: a read of 10,000 changes holds 1,000 replies at a time.
JOBS_PER_PIPELINE = 1_000


@dataclass(slots=True)
class _Registry:
    """One registry's members as one read saw them (member -> score)."""

    members: dict[str, float] = field(default_factory=dict)
    full: bool = False  # read at MAX_REGISTRY: members scored below the lowest were not read

    @property
    def floor(self) -> float:
        """The score below which this read saw nothing (members were, unread, when full)."""
        return min(self.members.values(), default=-math.inf) if self.full else -math.inf

    def added(self, before: _Registry) -> set[str]:
        """Members not in `before`, but those below its floor (there then, unread)."""
        floor = before.floor
        return {m for m, score in self.members.items() if m not in before.members and score > floor}

    def lost_unread(self, before: _Registry) -> bool:
        """True when this read was full and its lowest member is new: more may be beyond."""
        if not self.full:
            return False
        floor = self.floor
        return any(score == floor for score in (self.members[m] for m in self.added(before)))


@dataclass(slots=True)
class _Job:
    job_type: str = ""
    enqueued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    status: str = ""
    exc_text: str = ""


class RqReader(RedisReader):
    def __init__(self, config: RqReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:rq"
        self.config = config
        # (queue, registry) -> members at the previous read; None before the first read.
        self._previous: dict[tuple[str, str], _Registry] | None = None
        self._listed: list[str] = []  # the queues rq:queues named at the previous read

    def collect(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues = self._queues(client, signals)
            current = self._registries(client, queues, signals)
            self._workers(client, signals)
            self._rate_limited(client, signals)
            if self._previous is not None:
                self._transitions(client, queues, current, signals)
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise

        def moved() -> None:  # once the whole read succeeded (framework.Progress)
            self._listed, self._previous = queues, current

        signals.on_success(moved)

    # -- reading ------------------------------------------------------------------------------

    def _queues(self, client: redis.Redis, signals: Signals) -> list[str]:
        """The queues rq:queues names; while it cannot be read, those of the previous read."""
        names = list(self._listed)
        with signals.record(self.config.queues_set):
            listing = members_of(client, self.config.queues_set)  # SSCAN: up to the limit
            members = signals.names(listing, MAX_QUEUES, "queues")
            names = sorted(
                key.removeprefix("rq:queue:")
                for key in (member.decode("utf-8", "replace") for member in members)
                if key.startswith("rq:queue:")
            )
        return select(names, self.config.queues)[0]  # the preset's queues param narrows them

    def _registries(
        self, client: redis.Redis, queues: list[str], signals: Signals
    ) -> dict[tuple[str, str], _Registry]:
        """Each queue's registries, MAX_REGISTRY members each at most. A queue with one that
        cannot be read keeps its previous state (none: it is left out), so its changes are
        counted once, when all can be read."""
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            for registry in RQ_REGISTRIES:
                pipe.zrange(f"rq:{registry}:{queue}", -MAX_REGISTRY, -1, withscores=True)
        replies = iter(pipe.execute(raise_on_error=False))
        previous = self._previous or {}
        current: dict[tuple[str, str], _Registry] = {}
        for queue in queues:
            read = {}
            for registry in RQ_REGISTRIES:
                reply = next(replies)
                with signals.record(f"rq:{registry}:{queue}"):
                    if isinstance(reply, Exception):
                        raise reply
                    members = {m.decode("utf-8", "replace"): float(s) for m, s in reply}
                    read[registry] = _Registry(members, len(members) >= MAX_REGISTRY)
            if len(read) < len(RQ_REGISTRIES):
                read = {r: previous[(queue, r)] for r in RQ_REGISTRIES if (queue, r) in previous}
            current.update(((queue, registry), members) for registry, members in read.items())
        return current

    def _workers(self, client: redis.Redis, signals: Signals) -> None:
        keys: list[bytes] = []
        with signals.record("rq:workers"):
            keys = sorted(signals.names(members_of(client, "rq:workers"), MAX_WORKERS, "workers"))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, ("state", "queues"))
        for key, reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(key):
                if isinstance(reply, Exception):
                    raise reply
                state, queues = reply
                if state is None:  # the set outlives a dead worker's hash (it expires)
                    continue
                worker = key.decode("utf-8", "replace").removeprefix("rq:worker:")
                busy = 1 if state == b"busy" else 0
                # Split no further than the limit: a hash listing 300,000 queues costs the
                # limit's worth, the rest is refused (Signals.workers).
                listed = (queues or b"").split(b",", MAX_QUEUES_PER_WORKER)
                names = [name.decode("utf-8", "replace") for name in listed if name]
                signals.workers(self.config.system, names, worker, busy, 1, self.config.queues)

    def _rate_limited(self, client: redis.Redis, signals: Signals) -> None:
        """RQ 3: jobs held back by a concurrency limit, as pending depth of their queue."""
        limits: list[bytes] = []
        with signals.record("rq:rl-keys"):
            limits = sorted(signals.names(members_of(client, "rq:rl-keys"), MAX_KEYS, "rl-keys"))
        if not limits:
            return
        keys = [b"rq:rl:" + limit + b":rate_limited" for limit in limits]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.zrange(key, 0, -1)
        job_ids = []
        for key, reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(key):
                if isinstance(reply, Exception):
                    raise reply
                job_ids += reply
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(b"rq:job:" + job_id, "origin")
        origins: Counter[bytes] = Counter()
        for job_id, origin in zip(job_ids, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(b"rq:job:" + job_id):
                if isinstance(origin, Exception):
                    raise origin
                if origin is not None:
                    origins[origin] += 1
        for origin, count in origins.items():
            labels = (self.config.system, origin.decode("utf-8", "replace"), "", "pending")
            signals.samples.add_labelled(DEPTH, labels, count)

    # -- what changed since the previous read -------------------------------------------------

    def _transitions(
        self,
        client: redis.Redis,
        queues: list[str],
        current: dict[tuple[str, str], _Registry],
        signals: Signals,
    ) -> None:
        previous = self._previous or {}
        changes: list[tuple[str, str, str]] = []  # (queue, what, job id)
        unread = False  # a registry had more new members than MAX_REGISTRY lets a read take
        for queue in queues:
            if (queue, "wip") not in current:
                continue  # not read yet: counted from the first read of all its registries
            if queue in self._listed and (queue, "wip") not in previous:
                continue  # listed before but never read: this read is its baseline
            now = {r: current[(queue, r)] for r in RQ_REGISTRIES}
            before = {r: previous.get((queue, r)) or _Registry() for r in RQ_REGISTRIES}
            unread = unread or any(now[r].lost_unread(before[r]) for r in RQ_REGISTRIES)
            new_finished = now["finished"].added(before["finished"])
            new_failed = now["failed"].added(before["failed"])
            ended = new_finished | new_failed
            seen_running = {_job_id(member) for member in before["wip"].members}
            changes += [(queue, "completed", job_id) for job_id in new_finished]
            changes += [(queue, "failed", job_id) for job_id in new_failed]
            # A job may start and end between two reads: its end implies its start.
            starts = {_job_id(member) for member in now["wip"].added(before["wip"])}
            changes += [(queue, "started", job_id) for job_id in starts | (ended - seen_running)]
            # what is no longer read because newer members pushed it out did not leave
            gone = before["wip"].added(now["wip"])
            left = {_job_id(member) for member in gone} - ended
            changes += [(queue, "left", job_id) for job_id in left]
        if unread:
            signals.tally.refuse("over_limit")
        if not changes:
            return
        # queue_exporter_events_total{stream="native:rq"}: the job records that changed
        signals.tally.consumed += len({(queue, job_id) for queue, _, job_id in changes})
        by_job: dict[str, list[tuple[str, str]]] = {}
        for queue, what, job_id in changes:
            by_job.setdefault(job_id, []).append((queue, what))
        job_ids = sorted(by_job)
        for first in range(0, len(job_ids), JOBS_PER_PIPELINE):  # replies held a batch at a time
            batch = job_ids[first : first + JOBS_PER_PIPELINE]
            jobs = self._jobs(client, batch, signals)
            for job_id in batch:
                for queue, what in by_job[job_id]:
                    with signals.record(f"rq:job:{job_id}"):  # a time refused costs this only
                        # A job deleted since (a result_ttl shorter than the interval) still
                        # counts, untyped.
                        self._emit(signals, queue, what, jobs.get(job_id) or _Job())

    def _jobs(self, client: redis.Redis, job_ids: list[str], signals: Signals) -> dict[str, _Job]:
        if not job_ids:
            return {}
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(f"rq:job:{job_id}", _JOB_FIELDS)
            pipe.xrevrange(f"rq:results:{job_id}", count=1)
        replies = pipe.execute(raise_on_error=False)
        jobs: dict[str, _Job] = {}
        for index, job_id in enumerate(job_ids):
            fields, results = replies[2 * index], replies[2 * index + 1]
            with signals.record(f"rq:job:{job_id}"):  # one unreadable job costs itself only
                if isinstance(fields, Exception):
                    raise fields
                if any(fields):  # else gone: it still counts, untyped
                    jobs[job_id] = _job(fields, results if isinstance(results, list) else [])
        return jobs

    def _emit(self, signals: Signals, queue: str, what: str, job: _Job) -> None:
        system = self.config.system

        def event(name: str, ts: float | None = None, **fields: Any) -> None:
            labels = {"system": system, "queue": queue, "job_type": job.job_type}
            when = signals.now if ts is None else ts
            apply(signals.tally, Event.of(name, when, signals.latest, **labels, **fields), system)

        execution = None
        if job.ended_at is not None and job.started_at is not None:
            # the worker's two times, each from 1970 on: a negative span is refused (Event.of)
            execution = job.ended_at - numbers.epoch(job.started_at, signals.latest)
        if what == "started":  # the wait is from enqueue to start
            event("started", job.started_at, enqueued_at=job.enqueued_at)
        elif what == "completed":
            event("completed", job.ended_at, duration=execution, enqueued_at=job.enqueued_at)
        elif what == "failed":
            error_type = _error_type(job.exc_text)
            event("failed", job.ended_at, error_type=error_type, duration=execution)
            if error_type == "timeout":
                event("timed_out", job.ended_at)
        elif job.status in ("queued", "scheduled", "started"):  # left for another attempt
            event("failed", error_type="retryable")
            event("retried")


def _job(fields: list[bytes | None], results: list[Any]) -> _Job:
    description, enqueued_at, started_at, ended_at, status, exc_info = fields
    exc_text = ""
    if results:
        encoded = results[0][1].get(b"exc_string")
        if encoded:
            exc_text = _decompress(b64decode(encoded))
    if not exc_text and exc_info:
        exc_text = _decompress(exc_info)
    return _Job(
        job_type=(description or b"").decode("utf-8", "replace").split("(", 1)[0],
        enqueued_at=_time(enqueued_at),
        started_at=_time(started_at),
        ended_at=_time(ended_at),
        status=(status or b"").decode("utf-8", "replace"),
        exc_text=exc_text,
    )


def _job_id(member: str) -> str:
    """A registry member's job id: RQ 2+ writes `<job id>:<execution id>` in started."""
    return member.split(":", 1)[0]


def _error_type(exc_text: str) -> str:
    if "JobTimeoutException" in exc_text:
        return "timeout"
    if "AbandonedJobError" in exc_text or "Moved to FailedJobRegistry" in exc_text:
        return "other"  # the worker died under the job
    return "non_retryable"  # the failed registry holds jobs with no attempt left


def _decompress(raw: bytes) -> str:
    try:
        text = zlib.decompressobj().decompress(raw, _MAX_EXC_TEXT)
    except zlib.error:
        text = raw[:_MAX_EXC_TEXT]
    return text.decode("utf-8", "replace")


def _time(raw: bytes | None) -> float | None:
    if not raw:
        return None
    try:
        return parse_time(raw, "iso")
    except TimeParseError:
        return None
