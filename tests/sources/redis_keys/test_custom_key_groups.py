"""Operator-written key groups: streams with and without a consumer group, sets, hashes,
enumerated values and the summing of keys that map to one series."""

from __future__ import annotations

import time

from tests.conftest import scrape_when, value


def test_streams_sets_and_hashes(redis_client, redis_url, run_exporter):
    now_ms = int(time.time() * 1000)
    redis_client.xadd("jobs:stream:plain", {"n": "1"}, id=f"{now_ms - 120_000}-0")
    redis_client.xadd("jobs:stream:plain", {"n": "2"}, id=f"{now_ms - 1_000}-0")
    redis_client.xadd("jobs:stream:grouped", {"n": "1"}, id=f"{now_ms - 300_000}-0")
    redis_client.xadd("jobs:stream:grouped", {"n": "2"}, id=f"{now_ms - 200_000}-0")
    redis_client.xadd("jobs:stream:grouped", {"n": "3"}, id=f"{now_ms - 100_000}-0")
    redis_client.xgroup_create("jobs:stream:grouped", "workers", id="0")
    redis_client.xreadgroup("workers", "w1", {"jobs:stream:grouped": ">"}, count=1)
    redis_client.sadd("jobs:set:tags", "a", "b", "c")
    redis_client.hset("jobs:hash:inflight", mapping={"1": "x", "2": "y"})

    groups = [
        {
            "system": "custom",
            "pattern": "jobs:stream:{queue}",
            "type": "stream",
            "state": "pending",
            "oldest": {"time_in": "stream_id"},
            "values": {"queue": ["plain"]},
        },
        {
            "system": "custom",
            "pattern": "jobs:stream:{queue}",
            "type": "stream",
            "state": "pending",
            "stream_group": "workers",
            "oldest": {"time_in": "stream_id"},
            "values": {"queue": ["grouped"]},
        },
        {"system": "custom", "pattern": "jobs:set:{queue}", "type": "set", "state": "retry"},
        {"system": "custom", "pattern": "jobs:hash:{queue}", "type": "hash", "state": "active"},
    ]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})
    series = scrape_when(app, "queue_depth", queue="inflight")

    def depth(queue, state):
        return value(series, "queue_depth", system="custom", queue=queue, state=state)

    assert depth("plain", "pending") == 2
    plain_age = value(series, "queue_oldest_age_seconds", queue="plain")
    assert plain_age is not None and 120 <= plain_age < 150
    assert depth("grouped", "pending") == 2  # lag: entries not yet delivered to the group
    assert depth("grouped", "active") == 1  # delivered, not acknowledged
    grouped_age = value(series, "queue_oldest_age_seconds", queue="grouped")
    assert grouped_age is not None and 200 <= grouped_age < 230  # the oldest undelivered entry
    assert depth("tags", "retry") == 3
    assert depth("inflight", "active") == 2


def test_keys_of_one_queue_are_summed_and_missing_keys_read_zero(
    redis_client, redis_url, run_exporter
):
    redis_client.rpush("shard:0:emails", "a", "b")
    redis_client.rpush("shard:1:emails", "c")
    groups = [
        {
            "system": "sharded",
            "pattern": "shard:{_shard}:{queue}",
            "type": "list",
            "state": "pending",
            "values": {"_shard": ["0", "1", "2"], "queue": ["emails", "sms"]},
        },
    ]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})
    series = scrape_when(app, "queue_depth", queue="sms")
    assert value(series, "queue_depth", system="sharded", queue="emails") == 3
    assert value(series, "queue_depth", system="sharded", queue="sms") == 0


def test_a_group_whose_lag_redis_cannot_tell_serves_no_waiting_depth(
    redis_client, redis_url, run_exporter
):
    """After an XDEL Redis reports no lag for a consumer group (XINFO GROUPS: nil): no waiting
    depth is made up (it was served as 0), the delivered entries still are, and the key group
    counts and names why."""
    for entry in range(1, 5):
        redis_client.xadd("jobs:stream:trimmed", {"n": entry}, id=f"{entry}-0")
    redis_client.xgroup_create("jobs:stream:trimmed", "workers", id="0")
    redis_client.xreadgroup("workers", "w1", {"jobs:stream:trimmed": ">"}, count=1)
    redis_client.xdel("jobs:stream:trimmed", "3-0")
    info = redis_client.xinfo_groups("jobs:stream:trimmed")[0]
    assert info["lag"] is None  # Redis' own word: it cannot tell
    group = {
        "system": "custom",
        "pattern": "jobs:stream:{queue}",
        "type": "stream",
        "state": "pending",
        "stream_group": "workers",
        "values": {"queue": ["trimmed"]},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", queue="trimmed", state="active")
    assert value(series, "queue_depth", queue="trimmed", state="active") == info["pending"]
    assert value(series, "queue_depth", queue="trimmed", state="pending") is None
    (report,) = app.telemetry.health.key_groups()
    assert report.errors == {"stream_lag_unknown": 1}
