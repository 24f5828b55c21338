"""Runner-Q's native `{q}:events_stream`: ActivityEvent JSON mapped onto the v1 families.

Runner-Q writes one entry per lifecycle step, field `event` = ActivityEvent JSON
(`activity_id`, `timestamp` RFC 3339, `event_type`, `worker_id`, `detail`), see
runner_q_redis/src/backend/queue.rs. Most events carry neither the activity type nor the
priority, so each batch is enriched from the `activity:{uuid}` hashes (one pipelined HMGET
per batch; type, priority and creation time are cached, bounded). Execution time comes from
the hash's started_at / completed_at, which Runner-Q sets at dequeue and at the end.

The hash is read after the event was written, so for an activity that moved on in between
(e.g. retried again) its times may belong to a later attempt; such values are dropped when
they contradict the event (a start after the event's own time).

On a Redis Cluster the hashes lie in any slot: the consumer hands `decode` a cluster client,
whose pipeline sends each node the HMGETs of its own slots.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from exporter.core.item_time import TimeParseError, parse_time
from exporter.lifecycle.metrics import Tally, apply
from exporter.lifecycle.refusals import Refusals
from exporter.lifecycle.wire import Event, InvalidEvent
from exporter.redis.connection import RedisConnectionConfig, is_cluster_state_error
from exporter.sources.readers.entries import Fields, as_dict

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    from exporter.redis.cluster import ClusterNodes

log = logging.getLogger(__name__)

TIMEOUT_ERROR = "Activity execution timed out"  # FailureKind::Timeout's message
_HASH_FIELDS = (
    "activity_type",
    "priority",
    "created_at",
    "scheduled_at",
    "started_at",
    "completed_at",
    "retry_count",
)
# Events whose metrics need the hash's times (the others need only type and priority).
_NEEDS_TIMES = frozenset({"Dequeued", "Completed", "Failed", "Retrying", "DeadLetter"})
_KNOWN = _NEEDS_TIMES | {"Enqueued", "Scheduled", "Requeued", "LeaseExtended"}
# Strings of the detail that become label values.
_LABEL_DETAILS = ("activity_type", "priority", "reason")
# Defined upstream but not mapped: Started is never emitted (Dequeued marks the start),
# ResultStored is not a lifecycle step.
_IGNORED = frozenset({"Started", "ResultStored"})


@dataclass(slots=True)
class ActivityEvent:
    activity_id: str
    ts: float
    event_type: str
    worker: str
    detail: dict[str, Any]


@dataclass(slots=True)
class Activity:
    """What the activity hash says (times as epoch seconds, None when unset)."""

    activity_type: str = ""
    priority: str = ""
    created_at: float | None = None
    scheduled_at: float | None = None
    started_at: float | None = None
    completed_at: float | None = None
    retry_count: int = 0


def parse_entry(fields: dict[bytes, bytes], horizon: float) -> ActivityEvent | None:
    """One stream entry; None for the types that map to nothing; InvalidEvent when broken."""
    raw = fields.get(b"event")
    if raw is None:
        raise InvalidEvent("missing_field", "no event field")
    if len(raw) > 65536:
        raise InvalidEvent("oversized_field")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidEvent("bad_value", "event is not JSON") from None
    if not isinstance(document, dict):
        raise InvalidEvent("bad_value", "event is not a JSON object")
    activity_id, timestamp = document.get("activity_id"), document.get("timestamp")
    event_type = document.get("event_type")
    if not isinstance(activity_id, str) or not isinstance(timestamp, str):
        raise InvalidEvent("missing_field", "activity_id and timestamp are required")
    if not isinstance(event_type, str):
        raise InvalidEvent("missing_field", "event_type is required")
    if event_type in _IGNORED:
        return None
    if event_type not in _KNOWN:
        raise InvalidEvent("unknown_event", event_type[:32])
    if len(activity_id) > 64:
        raise InvalidEvent("oversized_field", "activity_id")
    worker = document.get("worker_id")
    detail = document.get("detail")
    if not isinstance(detail, dict):
        detail = {}
    # JSON can escape lone surrogates ("\ud800"), which no Redis key or label can hold.
    for text in (activity_id, worker, *(detail.get(name) for name in _LABEL_DETAILS)):
        if isinstance(text, str) and not _utf8(text):
            raise InvalidEvent("bad_encoding", "a string that is not UTF-8")
    ts = _time(timestamp)
    if ts is None:
        raise InvalidEvent("bad_value", "timestamp is not RFC 3339")
    if ts > horizon:
        raise InvalidEvent("future_time")
    return ActivityEvent(
        activity_id, ts, event_type, worker if isinstance(worker, str) else "", detail
    )


class RunnerQStream:
    """A Runner-Q events stream as the consumer reads it (sources/readers/entries.py): its
    entries decoded, their activity hashes read on the stream's server, or on a Redis Cluster
    through a cluster client of its own (the hashes lie in any slot)."""

    def __init__(
        self,
        system: str,
        queue: str,
        cache_size: int,
        max_future: float,
        connection: RedisConnectionConfig,
    ) -> None:
        self.decoder = RunnerQDecoder(system, queue, cache_size, max_future)
        self.connection = connection
        self._nodes: ClusterNodes | None = None

    def decode(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        tally: Tally,
        refusals: Refusals,
    ) -> None:
        dicts = [(entry_id, as_dict(fields)) for entry_id, fields in entries]
        try:
            self.decoder.decode(self._hashes(client), dicts, now, tally, refusals)
        except Exception as error:
            if not is_cluster_state_error(error):
                raise
            # Not the entries' fault: the batch stays pending and is read again once the
            # cluster answers (the consumer closes this decoder on a connection error: a new
            # cluster client reads the slot map again).
            raise redis.ConnectionError(f"cluster: {error}") from error

    def _hashes(self, client: redis.Redis) -> redis.Redis | RedisCluster:
        """Where the activity hashes are read: the stream's server, or on a Redis Cluster
        every node (a cluster client routes each key to its slot's node)."""
        if not self.connection.is_cluster:
            return client
        if self._nodes is None:
            from exporter.redis.cluster import ClusterNodes

            self._nodes = ClusterNodes(self.connection.connect_cluster())
        return self._nodes.cluster

    def interrupt(self) -> None:
        if self._nodes is not None:
            self._nodes.sever()

    def close(self) -> None:
        if self._nodes is not None:
            self._nodes.close()
            self._nodes = None


class RunnerQDecoder:
    def __init__(self, system: str, queue: str, cache_size: int, max_future: float) -> None:
        self.system = system
        self.queue = queue
        self.max_future = max_future
        self._cache: OrderedDict[str, tuple[str, str, float | None]] = OrderedDict()
        self._cache_size = cache_size

    def decode(
        self,
        client: redis.Redis | RedisCluster,
        entries: Iterable[tuple[bytes, dict[bytes, bytes]]],
        now: float,
        tally: Tally,
        refusals: Refusals,
    ) -> None:
        """Parse, enrich and apply a batch; a broken entry or activity hash costs its own event.

        Anything but InvalidEvent, Redis connection errors and a Redis Cluster's answers about
        its slots or nodes (redis_connection.is_cluster_state_error) propagates: the consumer
        then decodes the batch entry by entry, so that only the entry that raised is refused.
        """
        events: list[tuple[bytes, ActivityEvent]] = []
        horizon = now + self.max_future
        for entry_id, fields in entries:
            tally.consumed += 1
            try:
                event = parse_entry(fields, horizon)
            except InvalidEvent as error:
                refusals.refuse(tally, entry_id, error.reason, error.detail)
                continue
            if event is not None:
                events.append((entry_id, event))
        activities = self._activities(client, [event for _, event in events])
        for entry_id, event in events:
            activity = activities[event.activity_id]
            if activity is None:
                refusals.refuse(
                    tally, entry_id, "unreadable_activity", f"activity:{event.activity_id}"
                )
            else:
                self._apply(event, activity, tally)

    # -- enrichment -----------------------------------------------------------------------

    def _activities(
        self, client: redis.Redis | RedisCluster, events: list[ActivityEvent]
    ) -> dict[str, Activity | None]:
        """Each event's activity hash (empty when it expired), None when it cannot be read."""
        known: dict[str, Activity | None] = {}
        wanted: list[str] = []
        for event in events:
            cached = self._cache.get(event.activity_id)
            if cached is not None and event.event_type not in _NEEDS_TIMES:
                known.setdefault(event.activity_id, Activity(cached[0], cached[1], cached[2]))
            elif event.activity_id not in wanted:
                wanted.append(event.activity_id)
        if not wanted:
            return known
        # On a Redis Cluster the client's pipeline sends each node the HMGETs of its slots.
        pipe = client.pipeline(transaction=False)
        for activity_id in wanted:
            pipe.hmget(f"activity:{activity_id}", _HASH_FIELDS)
        # Per-key errors (WRONGTYPE: the key is not a hash) come back as replies, one per key.
        for activity_id, values in zip(wanted, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(values, redis.ResponseError) and is_cluster_state_error(values):
                raise values  # the batch is read again, not this activity refused
            if isinstance(values, redis.ResponseError):
                known[activity_id] = None
                continue
            activity = _activity(values)
            known[activity_id] = activity
            if activity.activity_type:
                self._remember(activity_id, activity)
        return known

    def _remember(self, activity_id: str, activity: Activity) -> None:
        if self._cache_size == 0:
            return
        self._cache[activity_id] = (activity.activity_type, activity.priority, activity.created_at)
        self._cache.move_to_end(activity_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    # -- mapping --------------------------------------------------------------------------

    def _apply(self, event: ActivityEvent, activity: Activity, tally: Tally) -> None:
        detail, ts = event.detail, event.ts
        priority = activity.priority or _priority(detail.get("priority"))

        def emit(name: str, **fields: Any) -> None:
            v1 = Event.of(
                name,
                ts,
                system=self.system,
                queue=self.queue,
                job_type=activity.activity_type or _text(detail.get("activity_type")),
                priority=priority,
                worker=event.worker,
                job_id=event.activity_id,
                **fields,
            )
            apply(tally, v1, self.system)

        kind = event.event_type
        attempt = activity.retry_count + 1
        if kind == "Enqueued":
            if detail.get("from") == "scheduled":  # a due delayed activity or retry moved back
                tally.count("queue_scheduler_processed_total", (self.system, self.queue))
            else:
                emit("enqueued")
        elif kind == "Scheduled":
            emit("scheduled", scheduled_for=_time(detail.get("scheduled_at")))
        elif kind == "Dequeued":
            emit("dequeued")
            emit("started", enqueued_at=_ready_at(activity, ts))
        elif kind == "Completed":
            emit(
                "completed",
                duration=_execution(activity, activity.completed_at or ts),
                enqueued_at=activity.created_at,
                attempt=attempt,
            )
        elif kind == "Failed":  # Runner-Q emits Failed only for non-retryable errors
            emit(
                "failed",
                error_type="non_retryable",
                duration=_execution(activity, activity.completed_at or ts),
                enqueued_at=activity.created_at,
                attempt=attempt,
            )
        elif kind == "Retrying":
            self._attempt_failed(event, activity, emit)
            retry_count = detail.get("retry_count")
            emit(
                "retried",
                scheduled_for=_time(detail.get("scheduled_at")),
                attempt=retry_count if isinstance(retry_count, int) else None,
            )
        elif kind == "DeadLetter":
            self._attempt_failed(event, activity, emit)
            emit("dead_lettered", attempt=attempt)
            emit("max_retries_exceeded")
        elif kind == "Requeued":
            emit("requeued", reason=_text(detail.get("reason")) or "other")
        elif kind == "LeaseExtended":
            emit("lease_extended")

    @staticmethod
    def _attempt_failed(event: ActivityEvent, activity: Activity, emit: Any) -> None:
        """A retryable failure (Retrying, DeadLetter): the attempt's failure by class."""
        timed_out = event.detail.get("error") == TIMEOUT_ERROR
        duration = _execution(activity, event.ts)
        emit(
            "failed",
            error_type="timeout" if timed_out else "retryable",
            duration=duration,
            enqueued_at=activity.created_at,
        )
        if timed_out:
            emit("timed_out")


def _activity(values: list[bytes | None]) -> Activity:
    def text(index: int) -> str:
        raw = values[index]
        return raw.decode("utf-8", "replace") if raw else ""

    retry_count = text(6)
    return Activity(
        activity_type=text(0),
        priority=_priority(text(1).strip('"')),
        created_at=_time(text(2)),
        scheduled_at=_time(text(3)),
        started_at=_time(text(4)),
        completed_at=_time(text(5)),
        retry_count=int(retry_count) if _digits(retry_count) else 0,
    )


def _execution(activity: Activity, end: float) -> float | None:
    started = activity.started_at
    if started is None or started > end:
        return None  # the hash already holds a later attempt
    return end - started


def _ready_at(activity: Activity, started: float) -> float | None:
    """When the activity became ready: its due time if it was delayed, else its creation."""
    created, due = activity.created_at, activity.scheduled_at
    if due is not None and created is not None and created <= due <= started:
        return due
    if created is not None and created <= started:
        return created
    return None


def _priority(value: Any) -> str:
    return value.lower()[:16] if isinstance(value, str) else ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _digits(text: str) -> bool:
    # isdigit() alone admits "²", which int() refuses
    return text.isascii() and text.isdigit() and len(text) < 10


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = parse_time(value, "iso")
    except TimeParseError:
        return None
    return parsed if math.isfinite(parsed) else None
