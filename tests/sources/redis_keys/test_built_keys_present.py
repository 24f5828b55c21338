"""Keys built from a group's values count as matched when they exist, told by their own reads
(no EXISTS per key): a zset read through a score window or priority bands, a key of another
type, an empty stream. Redis's EXISTS, asked here, is the truth."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for

QUEUES = ["a", "b", "c", "d"]


def _report(app, pattern: str):
    return wait_for(lambda: {r.pattern: r for r in app.health.key_groups()}.get(pattern))


def _present(redis_client, pattern: str) -> list[str]:
    keys = [pattern.replace("{queue}", queue) for queue in QUEUES]
    return [key for key in keys if redis_client.exists(key)]


@pytest.mark.parametrize(
    "kind",
    [
        {"type": "zset", "scores": {"window": "due"}},
        {"type": "zset", "priority_bands": {"width": 10, "names": {0: "high", 1: "low"}}},
        {"type": "zset", "due": {"metric": "queue_scheduled_due"}},
        {"type": "list"},
    ],
    ids=["score_window", "priority_bands", "due_count", "list"],
)
def test_built_keys_matched_are_the_ones_that_exist(redis_client, redis_url, run_exporter, kind):
    pattern = "built:{queue}"
    # a: items outside what the window or bands read; b: a key of another type; c: an item
    # in range; d: no key
    redis_client.set("built:b", "a string")
    if kind["type"] == "list":
        redis_client.rpush("built:a", "x")
        redis_client.rpush("built:c", "y")
    else:
        redis_client.zadd("built:a", {"later": 4_000_000_000, "band9": 95})
        redis_client.zadd("built:c", {"now": 1})
    group = {
        "system": "built",
        "pattern": pattern,
        "state": "pending",
        "values": {"queue": QUEUES},
        **kind,
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})

    report = _report(app, pattern)
    present = _present(redis_client, pattern)
    assert len(present) == 3
    assert report.keys_matched == len(present)
    assert report.keys_named == len(QUEUES)
    assert sorted(report.example_keys) == present
    assert report.errors == {"wrong_type": 1}


def test_an_empty_stream_built_from_values_is_matched(redis_client, redis_url, run_exporter):
    pattern = "events:{queue}"
    redis_client.xadd("events:a", {"f": "1"})
    redis_client.xgroup_create("events:b", "workers", id="$", mkstream=True)  # exists, empty
    group = {
        "system": "built",
        "pattern": pattern,
        "type": "stream",
        "state": "pending",
        "values": {"queue": QUEUES},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})

    report = _report(app, pattern)
    present = _present(redis_client, pattern)
    assert redis_client.xlen("events:b") == 0 and len(present) == 2
    assert report.keys_matched == len(present)
    assert sorted(report.example_keys) == present
    assert report.errors == {}
