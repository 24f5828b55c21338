"""Queue layouts written as the real systems write them: the commands, scores and JSON bodies
their code issues (queue-layouts.md cites the source of each). The demo workload and the
tests share these writers."""

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


# -- Orchestrata kernel (the seed's queue module) ------------------------------------------------

ORCHESTRATA_MESSAGE_TTL = 86_400
ORCHESTRATA_DLQ_TTL = 7 * 86_400


def orchestrata_message(
    recipient: str, priority: int, queued_at: float, packet: dict[str, Any], message_id: str
) -> str:
    return json.dumps(
        {
            "packet": packet,
            "queued_at": iso(queued_at),
            "priority": priority,
            "recipient": recipient,
            "message_id": message_id,
        }
    )


def orchestrata_dead_letter(
    recipient: str, message_id: str, failed_at: float, reason: str, metadata: dict[str, Any]
) -> str:
    return json.dumps(
        {
            "message_id": message_id,
            "recipient": recipient,
            "failed_at": iso(failed_at),
            "reason": reason,
            "metadata": metadata,
        }
    )


# -- Runner-Q (runner_q_redis/src/backend/queue.rs) ----------------------------------------------

RUNNERQ_WEIGHTS = {
    "Critical": 4_000_000.0,
    "High": 3_000_000.0,
    "Normal": 2_000_000.0,
    "Low": 1_000_000.0,
}
RUNNERQ_TIMEOUT_ERROR = "Activity execution timed out"  # FailureKind::Timeout's message


def runnerq_priority_score(
    priority: str, created_at: float, now: float, retry_count: int = 0
) -> float:
    age_boost = min(max(now - created_at, 0.0), 100_000.0)
    retry_boost = min(retry_count**2 * 10_000.0, 500_000.0)
    timestamp_fraction = created_at % 1_000_000.0
    fifo_offset = (1_000_000.0 - timestamp_fraction) / 1_000.0
    return RUNNERQ_WEIGHTS[priority] + age_boost + retry_boost + fifo_offset


def runnerq_activity(
    activity_type: str, priority: str, created_at: float, activity_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": activity_id or str(uuid.uuid4()),
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


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of rfc3339_nanos() output (fromisoformat takes six fractional digits)."""
    return datetime.fromisoformat(text[:26] + "+00:00").timestamp()


def runnerq_enqueue(client: redis.Redis, queue: str, activity: dict[str, Any], now: float) -> None:
    created = parse_rfc3339(activity["created_at"])
    score = runnerq_priority_score(activity["priority"], created, now, activity["retry_count"])
    client.zadd(f"{queue}:priority_queue", {runnerq_member(activity): score})


def runnerq_event(
    activity_id: str, event_type: str, ts: float, worker_id: str | None, detail: dict[str, Any]
) -> dict[str, str]:
    """An entry of {q}:events_stream: field `event` = ActivityEvent JSON."""
    document = {
        "activity_id": activity_id,
        "timestamp": rfc3339_nanos(ts),
        "event_type": event_type,
        "worker_id": worker_id,
        "detail": detail,
    }
    return {"event": json.dumps(document)}


def runnerq_hash(activity: dict[str, Any], status: str) -> dict[Any, Any]:
    """The activity:{uuid} hash as Runner-Q writes it: status and priority as JSON strings."""
    return {
        "activity_type": activity["activity_type"],
        "created_at": activity["created_at"],
        "scheduled_at": "",
        "started_at": "",
        "completed_at": "",
        "status": json.dumps(status),
        "priority": json.dumps(activity["priority"]),
        "retry_count": str(activity["retry_count"]),
        "max_retries": str(activity["max_retries"]),
        "current_worker_id": "",
        "last_error": "",
        "lease_deadline_ms": "",
        "idempotency_key": activity["idempotency_key"] or "",
    }
