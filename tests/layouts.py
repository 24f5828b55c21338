"""Queue layouts written as the real systems write them, for the tests to read back.

Runner-Q's are written from the layouts reference (queue-layouts.md section 2, read from
runner_q_redis/src/backend/queue.rs; its facts kept in tests/seed_facts.json), never from exporter/demo/: the exporter's readers and the
demo's writers must each agree with the documents, not with each other. RQ's from its docs.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import redis

from tests import seeds


def iso(epoch: float) -> str:
    """ISO-8601 UTC with an offset, as Python's datetime.isoformat() writes it (Orchestrata's
    `queued_at`, seed 002: `datetime.now(UTC).isoformat()`)."""
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def rfc3339_nanos(epoch: float) -> str:
    """RFC 3339 as chrono's to_rfc3339() writes it: nine fractional digits, +00:00 (Runner-Q's
    `created_at`, `failed_at`, event `timestamp`)."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond * 1000:09d}+00:00"


# -- Runner-Q (queue-layouts.md section 2) ---------------------------------------------------


def runnerq_activity(
    activity_type: str, priority: str, created_at: float, activity_id: str | None = None
) -> dict[str, Any]:
    """A QueuedActivity's JSON with exactly the fields the reference lists for it (the
    dead-letter entry's `activity`), values of the types the reference gives."""
    values: dict[str, Any] = {
        "id": activity_id or str(uuid.uuid4()),
        "activity_type": activity_type,
        "payload": {"n": 1},
        "priority": priority,
        "retry_count": 0,
        "max_retries": 3,
        "timeout_seconds": 300,
        "retry_delay_seconds": 1,
        "created_at": rfc3339_nanos(created_at),
        "metadata": {},
    }
    fields = seeds.runnerq_activity_fields()
    assert sorted(values) == sorted(fields), f"the reference's activity fields: {fields}"
    return {field: values[field] for field in fields}


def runnerq_member(activity: dict[str, Any]) -> str:
    """A zset member: "<uuid>:<QueuedActivity JSON>"."""
    return f"{activity['id']}:{json.dumps(activity)}"


def runnerq_score(priority: str, created_at: float) -> float:
    """A priority_queue score: the priority's weight in millions (floor(score / 1e6) is the
    priority, per the reference) plus a small term below a million (earlier is higher)."""
    weight = seeds.runnerq_priority_weights()[priority]
    return weight * 1_000_000 + (1_000_000 - created_at % 1_000_000) / 1_000


def runnerq_enqueue(client: redis.Redis, queue: str, activity: dict[str, Any], now: float) -> None:
    """ZADD to {q}:priority_queue. `now` is when it is enqueued: Runner-Q's score ages with it,
    but stays within the priority's million."""
    created = datetime.fromisoformat(activity["created_at"][:26] + "+00:00").timestamp()
    assert created <= now
    client.zadd(
        f"{queue}:priority_queue",
        {runnerq_member(activity): runnerq_score(activity["priority"], created)},
    )


def runnerq_hash(activity: dict[str, Any], status: str) -> dict[str, str]:
    """The activity:{uuid} hash with the fields the reference names: times RFC 3339, status
    and priority as JSON strings with quotes, an empty string for None."""
    values = {
        "activity_type": activity["activity_type"],
        "created_at": activity["created_at"],
        "status": json.dumps(status),
        "priority": json.dumps(activity["priority"]),
        "retry_count": str(activity["retry_count"]),
        "max_retries": str(activity["max_retries"]),
    }
    assert status in seeds.runnerq_statuses(), status
    return {field: values.get(field, "") for field in seeds.runnerq_hash_fields()}


def runnerq_event(
    activity_id: str, event_type: str, ts: float, worker_id: str | None, detail: dict[str, Any]
) -> dict[str, str]:
    """An entry of {q}:events_stream: field `event` = the ActivityEvent JSON."""
    assert event_type in seeds.runnerq_event_types(), event_type
    document = {
        "activity_id": activity_id,
        "timestamp": rfc3339_nanos(ts),
        "event_type": event_type,
        "worker_id": worker_id,
        "detail": detail,
    }
    return {"event": json.dumps(document)}


# -- RQ -----------------------------------------------------------------------------------------


def rq_enqueue(client: redis.Redis, queue: str, enqueued_at: float) -> str:
    job_id = str(uuid.uuid4())
    stamp = datetime.fromtimestamp(enqueued_at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    client.hset(
        f"rq:job:{job_id}",
        mapping={"status": "queued", "origin": queue, "enqueued_at": stamp, "created_at": stamp},
    )
    client.sadd("rq:queues", f"rq:queue:{queue}")
    client.rpush(f"rq:queue:{queue}", job_id)
    return job_id
