"""Queue layouts written as the real systems write them: the commands, scores and JSON bodies
their code issues (queue-layouts.md cites the source of each)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import redis

# Written by the package (the demo workload writes the same layouts); re-exported for the tests.
from exporter.demo.layouts import (
    RUNNERQ_WEIGHTS,
    iso,
    rfc3339_nanos,
    runnerq_activity,
    runnerq_enqueue,
    runnerq_member,
    runnerq_priority_score,
)

__all__ = [
    "RUNNERQ_WEIGHTS",
    "iso",
    "rfc3339_nanos",
    "runnerq_activity",
    "runnerq_enqueue",
    "runnerq_member",
    "runnerq_priority_score",
]


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
