"""Key groups of several types: each key read as the type it holds (Huey's queue is a list under
RedisHuey and a zset under PriorityRedisHuey), options of one type under `by_type`."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from exporter.sources.key_groups import KeyGroup
from tests.conftest import scrape_when, value, wait_for


def _group(**overrides: object) -> dict[str, object]:
    return {
        "system": "mixed",
        "pattern": "jobs:{queue}",
        "type": ["list", "zset"],
        "state": "pending",
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"type": ["list"]}, "two types or more"),
        ({"type": ["list", "list"]}, "two types or more"),
        ({"type": ["list", "stream"]}, "a stream is read by its own commands"),
        ({"by_type": {"hash": {}}}, "hash is not one of the group's types"),
        ({"type": "list", "by_type": {"list": {}}}, "a group of several types"),
        # the group's own options apply to every type: a due count to a list is refused
        ({"due": {"metric": "queue_scheduled_due"}}, "its list keys: due applies to zset keys"),
        ({"by_type": {"list": {"oldest": {"time_in": "score"}}}}, "its list keys: oldest.time_in"),
    ],
)
def test_invalid_groups_of_several_types(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KeyGroup.model_validate(_group(**overrides))


def test_each_type_is_read_with_its_own_options() -> None:
    group = KeyGroup.model_validate(
        _group(by_type={"zset": {"oldest": {"time_in": "score"}}}, max_depth=5)
    )
    assert group.types == ("list", "zset") and group.type_name == "list or zset"
    as_list, as_zset = group.views()
    assert (as_list.type, as_list.oldest, as_list.max_depth) == ("list", None, 5)
    assert (as_zset.type, as_zset.max_depth) == ("zset", 5)
    assert as_zset.oldest is not None and as_zset.oldest.time_in == "score"
    assert group.of_type("zset") is as_zset  # made once: readers key what they learn by it


@pytest.mark.parametrize("named", [True, False], ids=["values", "scanned"])
def test_each_key_is_read_as_the_type_it_holds(
    named: bool, redis_client, redis_url, run_exporter
) -> None:
    now = time.time()
    redis_client.rpush("jobs:plain", "a", "b")
    redis_client.zadd("jobs:ranked", {"x": now - 120, "y": now - 60, "z": now})
    redis_client.hset("jobs:odd", mapping={"k": "v"})  # of neither type: named, not counted
    values = {"values": {"queue": ["plain", "ranked", "odd", "empty"]}} if named else {}
    group = _group(by_type={"zset": {"oldest": {"time_in": "score"}}}, **values)
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})

    series = scrape_when(app, "queue_depth", queue="ranked")
    assert value(series, "queue_depth", system="mixed", queue="plain") == 2
    assert value(series, "queue_depth", system="mixed", queue="ranked") == 3
    assert value(series, "queue_depth", system="mixed", queue="odd") is None
    assert value(series, "queue_depth", system="mixed", queue="empty") == (0 if named else None)
    age = value(series, "queue_oldest_age_seconds", queue="ranked")
    assert age is not None and 120 <= age < 150  # its lowest score: the zset's option
    assert value(series, "queue_oldest_age_seconds", queue="plain") is None
    report = wait_for(lambda: {r.pattern: r for r in app.health.key_groups()}.get("jobs:{queue}"))
    assert report.type == "list or zset"
    assert report.errors == {"wrong_type": 1}
    assert report.failed_keys == (("wrong_type", "jobs:odd"),)
    assert report.last_warning is not None and "(a hash)" in report.last_warning
