"""Each preset against its system's real layout, written with the commands that system issues.

The systems with a library are tested with the real libraries and workers: the conformance
harness (tests/conformance/) and test_native_celery.py.
"""

from __future__ import annotations

import json
import time
import uuid

from tests import layouts
from tests.conftest import scrape_when, value
from tests.layouts import iso


def _sampled(run_exporter, redis_url, preset, **expect_labels):
    """Start the exporter with one preset; the scrape once the depth named by expect_labels shows."""
    app = run_exporter(redis_url=redis_url, preset=[preset])
    return scrape_when(app, "queue_depth", **expect_labels)


def _enqueue(client, recipient: str, priority: int, queued_at: float) -> None:
    message_id = str(uuid.uuid4())
    body = {
        "packet": {"type": "task", "payload": {"n": 1}},
        "queued_at": iso(queued_at),
        "priority": priority,
        "recipient": recipient,
        "message_id": message_id,
    }
    key = f"orchestrata:queue:{recipient}:p{priority}"
    client.rpush(key, json.dumps(body))
    client.expire(key, 86400)
    client.hset(
        f"orchestrata:msg_meta:{message_id}",
        mapping={
            "recipient": recipient,
            "priority": priority,
            "queued_at": body["queued_at"],
            "status": "queued",
        },
    )


def test_orchestrata(redis_client, redis_url, run_exporter):
    now = time.time()
    for offset in (300, 200, 100):
        _enqueue(redis_client, "billing", 3, now - offset)
    _enqueue(redis_client, "billing", 5, now - 20)
    _enqueue(redis_client, "emails", 0, now - 50)
    redis_client.rpush(
        "orchestrata:dlq:billing",
        json.dumps(
            {
                "message_id": "m0",
                "recipient": "billing",
                "failed_at": iso(now - 900),
                "reason": "Message expired",
                "metadata": {},
            }
        ),
    )

    series = _sampled(run_exporter, redis_url, "orchestrata", queue="billing", priority="3")

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


def test_runnerq(redis_client, redis_url, run_exporter):
    now = time.time()
    for offset, priority in (
        (300, "Normal"),
        (200, "Normal"),
        (100, "Normal"),
        (40, "Critical"),
        (30, "Low"),
    ):
        activity = layouts.runnerq_activity("send_email", priority, now - offset)
        layouts.runnerq_enqueue(redis_client, "default", activity, now)
    # processing: score = lease deadline (ms); one lease already expired
    leased = [layouts.runnerq_activity("charge", "High", now - 60) for _ in range(3)]
    redis_client.zadd(
        "default:processing",
        {
            layouts.runnerq_member(leased[0]): (now - 10) * 1000,
            layouts.runnerq_member(leased[1]): (now + 60) * 1000,
            layouts.runnerq_member(leased[2]): (now + 90) * 1000,
        },
    )
    # scheduled: score = due time (s); two already due
    scheduled = [layouts.runnerq_activity("report", "Normal", now - 5) for _ in range(3)]
    redis_client.zadd(
        "default:scheduled_activities",
        {
            layouts.runnerq_member(scheduled[0]): int(now - 30),
            layouts.runnerq_member(scheduled[1]): int(now - 1),
            layouts.runnerq_member(scheduled[2]): int(now + 3600),
        },
    )
    dead = layouts.runnerq_activity("charge", "High", now - 4000)
    redis_client.rpush(
        "default:dead_letter_queue",
        json.dumps(
            {
                "activity": dead,
                "error": "card declined",
                "failed_at": layouts.rfc3339_nanos(now - 600),
            }
        ),
    )
    redis_client.zadd(
        "default:completed_activities", {str(uuid.uuid4()): int(now - 5) for _ in range(4)}
    )
    # activity hashes and the events stream share the keyspace but are not queues
    redis_client.hset(f"activity:{leased[0]['id']}", mapping={"status": '"Running"'})

    series = _sampled(run_exporter, redis_url, "runnerq", system="runnerq", priority="normal")

    def depth(**labels):
        return value(series, "queue_depth", system="runnerq", queue="default", **labels)

    assert depth(state="pending", priority="normal") == 3
    assert depth(state="pending", priority="critical") == 1
    assert depth(state="pending", priority="low") == 1
    assert depth(state="pending", priority="high") == 0
    assert depth(state="active") == 3
    assert depth(state="scheduled") == 3
    assert depth(state="dead_letter") == 1
    assert depth(state="completed") == 4
    assert value(series, "queue_leases_expired", system="runnerq", queue="default") == 1
    assert value(series, "queue_scheduled_due", system="runnerq", queue="default") == 2
    normal_age = value(series, "queue_oldest_age_seconds", queue="default", priority="normal")
    assert normal_age is not None and 300 <= normal_age < 330  # ZPOPMAX serves the oldest first
    critical_age = value(series, "queue_oldest_age_seconds", queue="default", priority="critical")
    assert critical_age is not None and 40 <= critical_age < 70
    dead_age = value(series, "queue_oldest_age_seconds", queue="default", state="dead_letter")
    assert dead_age is not None and 600 <= dead_age < 630
