"""Redis outage and recovery, keys that change type, malformed items, the cardinality cap."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import is_ready, scrape, scrape_series, scrape_when, value, wait_for
from tests.layouts import iso
from tests.private_redis import PrivateRedis


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _orchestrata_item(queued_at: str) -> str:
    return json.dumps(
        {"packet": {}, "queued_at": queued_at, "priority": 1, "recipient": "r", "message_id": "m"}
    )


def test_outage_drops_series_and_recovers(private_redis, run_exporter):
    private_redis.client().rpush(
        "orchestrata:queue:billing:p1", _orchestrata_item(iso(time.time()))
    )
    app = run_exporter(redis_url=private_redis.url, preset=["orchestrata"])
    scrape_when(app, "queue_depth", queue="billing")
    # Waited for: a cycle's series are published a moment before its source is marked up.
    wait_for(lambda: is_ready(app.server.port))

    private_redis.stop()

    def down():
        series = scrape_series(app)
        return series if value(series, "queue_exporter_source_up", source="redis") == 0 else None

    series = down_series = wait_for(down)
    assert value(series, "queue_depth", queue="billing") is None  # dropped, not served stale
    errors = [
        v
        for (name, labels), v in down_series.items()
        if name == "queue_exporter_source_errors_total" and ("source", "redis") in labels
    ]
    assert sum(errors) >= 1
    with pytest.raises(Exception, match="503"):
        scrape(app.server.port, "/readyz")

    private_redis.start()  # same port, empty: the queue comes back as it is written again
    private_redis.client().rpush(
        "orchestrata:queue:billing:p1", _orchestrata_item(iso(time.time()))
    )
    series = scrape_when(app, "queue_depth", queue="billing")
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    assert value(series, "queue_depth", queue="billing") == 1


def test_wrong_type_and_malformed_items_are_counted(redis_client, redis_url, run_exporter):
    now = time.time()
    redis_client.rpush("orchestrata:queue:good:p1", _orchestrata_item(iso(now - 60)))
    redis_client.rpush("orchestrata:queue:notjson:p1", "this is not json", "second")
    redis_client.rpush("orchestrata:queue:badtime:p1", _orchestrata_item("yesterday-ish"))
    redis_client.rpush("orchestrata:queue:notime:p1", json.dumps({"packet": {}}))
    redis_client.zadd("orchestrata:queue:zset:p1", {"member": 1})  # matches the pattern, wrong type

    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    series = scrape_when(app, "queue_exporter_source_errors_total", reason="wrong_type")

    def depth(queue):
        return value(series, "queue_depth", queue=queue, state="pending")

    assert depth("good") == 1
    assert depth("notjson") == 2  # the depth still counts
    assert depth("badtime") == 1
    assert depth("notime") == 1
    assert depth("zset") is None
    assert value(series, "queue_oldest_age_seconds", queue="notjson") is None
    assert value(series, "queue_oldest_age_seconds", queue="badtime") is None
    good_age = value(series, "queue_oldest_age_seconds", queue="good")
    assert good_age is not None and good_age >= 60

    def errors(reason):
        return value(series, "queue_exporter_source_errors_total", source="redis", reason=reason)

    assert errors("item_not_json") >= 1
    assert errors("time_unparsable") >= 1
    assert errors("time_missing") >= 1
    assert errors("wrong_type") >= 1
    assert value(series, "queue_exporter_source_up", source="redis") == 1


def test_cardinality_cap_folds_into_overflow(redis_client, redis_url, run_exporter):
    for index in range(10):
        redis_client.rpush(f"orchestrata:dlq:recipient-{index}", "{}")
    app = run_exporter(
        {
            "limits": {"max_series_per_metric": 4},
            "presets": ["orchestrata"],
            "sources": {"redis": {"url": redis_url}},
        }
    )
    series = scrape_when(app, "queue_exporter_series_overflow_total", metric="queue_depth")
    depths = {
        dict(labels)["queue"]: v for (name, labels), v in series.items() if name == "queue_depth"
    }
    assert len(depths) == 4
    assert depths["__overflow__"] == 7  # 10 queues: 3 kept as they are, 7 folded
    assert sum(depths.values()) == 10  # nothing lost
    assert value(series, "queue_exporter_series_overflow_total", metric="queue_depth") >= 7


def test_long_label_values_are_cut(redis_client, redis_url, run_exporter):
    long_name = "q" * 300
    redis_client.rpush(f"orchestrata:dlq:{long_name}", "{}")
    redis_client.rpush(f"orchestrata:dlq:{long_name}-2", "{}", "{}")  # same first 64 characters
    redis_client.rpush("orchestrata:dlq:short", "{}")
    app = run_exporter(
        {
            "limits": {"label_value_max_length": 64},
            "presets": ["orchestrata"],
            "sources": {"redis": {"url": redis_url}},
        }
    )
    series = scrape_when(app, "queue_depth", queue="q" * 64)
    assert value(series, "queue_depth", queue="short") == 1
    assert value(series, "queue_depth", queue="q" * 64) == 3  # the two cut names add up
    assert not [labels for name, labels in series if ("queue", long_name) in labels]


def test_cardinality_cap_is_shared_fairly_between_systems(redis_client, redis_url, run_exporter):
    for index in range(50):  # a noisy custom layout ...
        redis_client.rpush(f"tenant:{index:02d}:jobs", "x")
    for queue in ("billing", "emails"):  # ... read before the preset's two queues
        redis_client.rpush(f"orchestrata:dlq:{queue}", "{}")
    groups = [
        {"system": "tenants", "pattern": "tenant:{queue}:jobs", "type": "list", "state": "pending"}
    ]
    app = run_exporter(
        {
            "limits": {"max_series_per_metric": 11},
            "presets": ["orchestrata"],
            "sources": {"redis": {"url": redis_url, "key_groups": groups}},
        }
    )
    series = scrape_when(app, "queue_depth", queue="__overflow__")
    depths = {
        dict(labels)["queue"]: v for (name, labels), v in series.items() if name == "queue_depth"
    }
    assert depths["billing"] == depths["emails"] == 1  # the small system keeps its queues
    assert len(depths) == 11  # 10 kept (2 orchestrata + 8 tenants) and the overflow series
    assert depths["__overflow__"] == 42
    assert sum(depths.values()) == 52
