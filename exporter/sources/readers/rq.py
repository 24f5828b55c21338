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

The finished and failed registries are read from where the last read got to
(rq_windows.py): what is new since, MAX_NEW members a read at most, never again what was
counted; an idle registry costs a few small replies, whatever it keeps (30,000 kept jobs: 401
KB a read before, bench figures in docs/native.md). The started registry holds the running
jobs: it is read whole up to MAX_REGISTRY members, its highest scored (RQ scores a member by
when its lease ends), and compared with the previous read; a full read whose lowest member is
new may have left new members unread: counted once per read as over_limit.
"""

from __future__ import annotations

import math
import zlib
from base64 import b64decode
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from exporter.core import numbers
from exporter.core.item_time import TimeParseError, parse_time
from exporter.lifecycle.metrics import apply
from exporter.lifecycle.rq_failures import rq_error_type
from exporter.lifecycle.wire import Event
from exporter.output.catalog import BY_NAME
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.members import members_of
from exporter.sources.readers.config import RqReaderConfig
from exporter.sources.readers.framework import (
    MAX_KEYS,
    MAX_QUEUES,
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    Progress,
    RedisReader,
    Signals,
)
from exporter.sources.readers.rq_windows import RegistryWindow, baseline_windows, read_windows
from exporter.sources.redis_keys.values import select

DEPTH = BY_NAME["queue_depth"]
_JOB_FIELDS = ("description", "enqueued_at", "started_at", "ended_at", "status", "exc_info")
# Failure text read to classify a failure (a traceback); beyond it nothing is decompressed.
_MAX_EXC_TEXT = 65536
# Members of the started registry read and remembered per read: the highest scored.
MAX_REGISTRY = 10_000
FINISHED = ("finished", "failed")  # the registries read from where the last read got to
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


@dataclass(frozen=True, slots=True)
class _QueueState:
    """A queue's registries as the last read that read them all left them."""

    wip: _Registry
    finished: RegistryWindow
    failed: RegistryWindow

    def window(self, registry: str) -> RegistryWindow:
        return self.finished if registry == "finished" else self.failed


@dataclass(frozen=True, slots=True)
class _Position:
    """Where the reader got to: the queues rq:queues named, and each one's registries as the
    last read that read them all left them."""

    listed: list[str]
    states: dict[str, _QueueState]


# A queue's finished and failed registries after a read: each one's window and new members.
_Ended = dict[str, tuple[RegistryWindow, list[str]]]


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
        self._position: Progress[_Position] = Progress()  # moved once a read succeeded

    def collect(self, signals: Signals) -> None:
        client = self._connect()
        try:
            queues = self._queues(client, signals)
            running = self._running(client, queues, signals)
            ended = self._ended(client, queues, signals)
            self._workers(client, signals)
            self._rate_limited(client, signals)
            at = self._position.at
            states = {} if at is None else dict(at.states)
            baseline = set(self._baseline(queues))
            counted = []  # the queues read whole, after a read of them (not their baseline)
            for queue in queues:
                if queue in running and queue in ended:
                    if queue not in baseline:
                        counted.append(queue)
                    windows = ended[queue]
                    states[queue] = _QueueState(
                        running[queue], windows["finished"][0], windows["failed"][0]
                    )
            if counted:
                self._transitions(client, counted, running, ended, signals)
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise
        kept = {queue: states[queue] for queue in queues if queue in states}
        self._position.move(signals, _Position(queues, kept))

    def _states(self) -> dict[str, _QueueState]:
        at = self._position.at
        return {} if at is None else at.states

    def _baseline(self, queues: list[str]) -> list[str]:
        """The queues this read takes the baseline of: all at the first read; later, those
        listed before but never read whole (a queue listed since counts in full)."""
        at = self._position.at
        if at is None:
            return queues
        return [q for q in queues if q not in at.states and q in at.listed]

    # -- reading ------------------------------------------------------------------------------

    def _queues(self, client: redis.Redis, signals: Signals) -> list[str]:
        """The queues rq:queues names; while it cannot be read, those of the previous read."""
        names = [] if self._position.at is None else list(self._position.at.listed)
        with signals.record(self.config.queues_set):
            listing = members_of(client, self.config.queues_set)  # SSCAN: up to the limit
            members = signals.names(listing, MAX_QUEUES, "queues")
            names = sorted(
                key.removeprefix("rq:queue:")
                for key in (member.decode("utf-8", "replace") for member in members)
                if key.startswith("rq:queue:")
            )
        return select(names, self.config.queues)[0]  # the preset's queues param narrows them

    def _running(
        self, client: redis.Redis, queues: list[str], signals: Signals
    ) -> dict[str, _Registry]:
        """Each queue's started registry, MAX_REGISTRY members at most (a queue whose registry
        cannot be read is left out)."""
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            pipe.zrange(f"rq:wip:{queue}", -MAX_REGISTRY, -1, withscores=True)
        running = {}
        for queue, reply in zip(queues, pipe.execute(raise_on_error=False), strict=True):
            with signals.record(f"rq:wip:{queue}"):
                if isinstance(reply, Exception):
                    raise reply
                members = {m.decode("utf-8", "replace"): float(s) for m, s in reply}
                running[queue] = _Registry(members, len(members) >= MAX_REGISTRY)
        return running

    def _ended(self, client: redis.Redis, queues: list[str], signals: Signals) -> dict[str, _Ended]:
        """Each queue's finished and failed registries read from its windows (rq_windows.py):
        the baseline's at their newest, a new queue's from their start. A queue with one that
        cannot be read is left out: its windows stay, so its changes count once, when both
        can be read."""
        baseline = set(self._baseline(queues))
        states = self._states()
        key = "rq:{}:{}".format
        based = baseline_windows(
            client,
            [((q, r), key(r, q)) for q in queues if q in baseline for r in FINISHED],
            signals,
        )
        olds = {
            (q, r): (key(r, q), states[q].window(r) if q in states else RegistryWindow())
            for q in queues
            if q not in baseline
            for r in FINISHED
        }
        read = read_windows(client, olds, signals)
        results = {**{name: (window, []) for name, window in based.items()}, **read}
        return {
            q: {r: results[q, r] for r in FINISHED}
            for q in queues
            if all((q, r) in results for r in FINISHED)
        }

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
        running: dict[str, _Registry],
        ended: dict[str, _Ended],
        signals: Signals,
    ) -> None:
        states = self._states()
        changes: list[tuple[str, str, str]] = []  # (queue, what, job id)
        unread = False  # the started registry had more new members than a read takes
        for queue in queues:
            now = running[queue]
            before = states[queue].wip if queue in states else _Registry()
            unread = unread or now.lost_unread(before)
            new_finished = set(ended[queue]["finished"][1])
            new_failed = set(ended[queue]["failed"][1])
            ended_ids = new_finished | new_failed
            seen_running = {_job_id(member) for member in before.members}
            changes += [(queue, "completed", job_id) for job_id in new_finished]
            changes += [(queue, "failed", job_id) for job_id in new_failed]
            # A job may start and end between two reads: its end implies its start.
            starts = {_job_id(member) for member in now.added(before)}
            changes += [
                (queue, "started", job_id) for job_id in starts | (ended_ids - seen_running)
            ]
            # what is no longer read because newer members pushed it out did not leave
            gone = before.added(now)
            left = {_job_id(member) for member in gone} - ended_ids
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
            error_type = rq_error_type(job.exc_text)
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
