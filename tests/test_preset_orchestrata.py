"""Orchestrata: per-recipient, per-priority lists written as its kernel writes them."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

from tests.conftest import scrape_series, value, wait_for


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _enqueue(client, recipient: str, priority: int, queued_at: float) -> None:
    message_id = str(uuid.uuid4())
    body = {
        "packet": {"type": "task", "payload": {"n": 1}},
        "queued_at": _iso(queued_at),
        "priority": priority,
        "recipient": recipient,
        "message_id": message_id,
    }
    key = f"orchestrata:queue:{recipient}:p{priority}"
    client.rpush(key, json.dumps(body))
    client.expire(key, 86400)
    client.hset(
        f"orchestrata:msg_meta:{message_id}",
        mapping={"recipient": recipient, "priority": priority, "queued_at": body["queued_at"],
                 "status": "queued"},
    )


def test_depth_age_dead_letters_and_limit(redis_client, redis_url, run_exporter):
    now = time.time()
    for offset in (300, 200, 100):
        _enqueue(redis_client, "billing", 3, now - offset)
    _enqueue(redis_client, "billing", 5, now - 20)
    _enqueue(redis_client, "emails", 0, now - 50)
    redis_client.rpush(
        "orchestrata:dlq:billing",
        json.dumps({"message_id": "m0", "recipient": "billing", "failed_at": _iso(now - 900),
                    "reason": "Message expired", "metadata": {}}),
    )

    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    series = wait_for(lambda: (s := scrape_series(app)) and value(
        s, "queue_depth", system="orchestrata", queue="billing", priority="3") and s)

    def depth(**labels):
        return value(series, "queue_depth", system="orchestrata", **labels)

    assert depth(queue="billing", priority="3", state="pending") == 3
    assert depth(queue="billing", priority="5", state="pending") == 1
    assert depth(queue="emails", priority="0", state="pending") == 1
    assert depth(queue="billing", state="dead_letter") == 1
    age = value(series, "queue_oldest_age_seconds", queue="billing", priority="3")
    assert age is not None and 300 <= age < 330  # the head (first RPUSHed) is the oldest
    dlq_age = value(series, "queue_oldest_age_seconds", queue="billing", state="dead_letter")
    assert dlq_age is not None and 900 <= dlq_age < 930
    assert value(series, "queue_max_depth", system="orchestrata", queue="billing") == 10000
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    # message metadata hashes are not queues
    assert not [k for k in series if "msg_meta" in str(k)]
