"""Queue layouts written as the real systems write them: the commands, scores and JSON bodies
their code issues (queue-layouts.md cites the source of each)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import redis


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def rfc3339_nanos(epoch: float) -> str:
    """chrono's to_rfc3339(): nine fractional digits and +00:00."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}123+00:00"


# -- Runner-Q (runner_q_redis/src/backend/queue.rs) ----------------------------------------------

RUNNERQ_WEIGHTS = {
    "Critical": 4_000_000.0,
    "High": 3_000_000.0,
    "Normal": 2_000_000.0,
    "Low": 1_000_000.0,
}


def runnerq_priority_score(
    priority: str, created_at: float, now: float, retry_count: int = 0
) -> float:
    age_boost = min(max(now - created_at, 0.0), 100_000.0)
    retry_boost = min(retry_count**2 * 10_000.0, 500_000.0)
    timestamp_fraction = created_at % 1_000_000.0
    fifo_offset = (1_000_000.0 - timestamp_fraction) / 1_000.0
    return RUNNERQ_WEIGHTS[priority] + age_boost + retry_boost + fifo_offset


def runnerq_activity(activity_type: str, priority: str, created_at: float) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "activity_type": activity_type,
        "payload": {"n": 1},
        "priority": priority,
        "retry_count": 0,
        "max_retries": 3,
        "timeout_seconds": 300,
        "retry_delay_seconds": 1,
        "created_at": rfc3339_nanos(created_at),
        "scheduled_at": None,
        "metadata": {},
        "idempotency_key": None,
    }


def runnerq_member(activity: dict[str, Any]) -> str:
    return f"{activity['id']}:{json.dumps(activity)}"


def runnerq_enqueue(client: redis.Redis, queue: str, activity: dict[str, Any], now: float) -> None:
    created = datetime.fromisoformat(activity["created_at"][:26] + "+00:00").timestamp()
    score = runnerq_priority_score(activity["priority"], created, now, activity["retry_count"])
    client.zadd(f"{queue}:priority_queue", {runnerq_member(activity): score})


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


# -- Celery on kombu's Redis transport ----------------------------------------------------------

KOMBU_SEP = "\x06\x16"


def celery_publish(client: redis.Redis, queue: str, priority: int = 0) -> None:
    body = {
        "body": "e30=",
        "headers": {"task": "tasks.add", "id": str(uuid.uuid4())},
        "properties": {"priority": priority, "delivery_tag": str(uuid.uuid4())},
    }
    key = f"{queue}{KOMBU_SEP}{priority}" if priority else queue
    client.lpush(key, json.dumps(body))


# -- BullMQ -------------------------------------------------------------------------------------


def bullmq_add(client: redis.Redis, queue: str, job_id: int, timestamp_ms: int) -> None:
    client.hset(
        f"bull:{queue}:{job_id}",
        mapping={"name": "send", "data": "{}", "timestamp": timestamp_ms, "opts": "{}"},
    )
    client.lpush(f"bull:{queue}:wait", str(job_id))


def bullmq_delay(client: redis.Redis, queue: str, job_id: int, due_ms: int, counter: int) -> None:
    client.zadd(f"bull:{queue}:delayed", {str(job_id): due_ms * 0x1000 + (counter & 0xFFF)})


# -- Sidekiq ------------------------------------------------------------------------------------


def sidekiq_push(client: redis.Redis, queue: str, enqueued_at: float, millis: bool) -> None:
    stamp: float | int = int(enqueued_at * 1000) if millis else enqueued_at
    job = {
        "class": "HardWorker",
        "args": [1],
        "jid": uuid.uuid4().hex[:24],
        "queue": queue,
        "created_at": stamp,
        "enqueued_at": stamp,
        "retry": True,
    }
    client.sadd("queues", queue)
    client.lpush(f"queue:{queue}", json.dumps(job))
