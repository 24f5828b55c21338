"""Key groups of several types: each key read as the type it holds (Huey's queue is a list under
RedisHuey and a zset under PriorityRedisHuey), options of one type under `by_type`."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from exporter.sources.redis_keys.groups import key_group
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
        # a consumer group is a stream's alone (Taskiq's queue: a list or a stream)
        ({"type": ["list", "stream"], "by_type": {"list": {"stream_group": "g"}}}, "its list keys"),
        ({"by_type": {"hash": {}}}, "hash is not one of the group's types"),
        ({"type": "list", "by_type": {"list": {}}}, "a group of several types"),
        # the group's own options apply to every type: a due count to a list is refused
        ({"due": {"metric": "queue_scheduled_due"}}, "its list keys: due applies to zset keys"),
        ({"by_type": {"list": {"oldest": {"time_in": "score"}}}}, "its list keys: oldest.time_in"),
    ],
)
@pytest.mark.fast
def test_invalid_groups_of_several_types(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        key_group(_group(**overrides))


@pytest.mark.fast
def test_each_type_is_read_with_its_own_options() -> None:
    group = key_group(_group(by_type={"zset": {"oldest": {"time_in": "score"}}}, max_depth=5))
    assert group.types == ("list", "zset") and group.type_name == "list or zset"
    as_list, as_zset = group.views()
    assert (as_list.type, as_list.oldest, as_list.max_depth) == ("list", None, 5)
    assert (as_zset.type, as_zset.max_depth) == ("zset", 5)
    assert as_zset.oldest is not None and as_zset.oldest.time_in == "score"
    assert group.of_type("zset") is as_zset  # made once: readers key what they learn by it


@pytest.mark.fast
def test_a_stream_among_several_types_reads_its_consumer_group() -> None:
    group = key_group(_group(type=["list", "stream"], by_type={"stream": {"stream_group": "g"}}))
    as_list, as_stream = group.views()
    assert (as_list.type, as_stream.type, as_stream.stream_group) == ("list", "stream", "g")


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


@pytest.mark.parametrize("named", [True, False], ids=["values", "scanned"])
def test_a_stream_among_lists_is_read_through_its_consumer_group(
    named: bool, redis_client, redis_url, run_exporter
) -> None:
    """Taskiq's layout: one key per queue, a list or a stream with a consumer group."""
    redis_client.rpush("jobs:plain", "a", "b")
    redis_client.xgroup_create("jobs:streamed", "g", id="$", mkstream=True)
    ids = [redis_client.xadd("jobs:streamed", {"data": str(n)}) for n in range(3)]
    redis_client.xreadgroup("g", "worker-1", {"jobs:streamed": ">"}, count=1)  # one delivered
    values = {"values": {"queue": ["plain", "streamed"]}} if named else {}
    stream = {"stream_group": "g", "oldest": {"time_in": "stream_id"}}
    group = _group(type=["list", "stream"], by_type={"stream": stream}, **values)
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})

    series = scrape_when(app, "queue_depth", queue="streamed", state="active")
    assert value(series, "queue_depth", queue="plain", state="pending") == 2
    assert value(series, "queue_depth", queue="streamed", state="pending") == 2  # the lag
    assert value(series, "queue_depth", queue="streamed", state="active") == 1  # pending
    # the first undelivered entry's id is its time (ms)
    since = int(ids[1].split(b"-")[0]) / 1000
    age = value(series, "queue_oldest_age_seconds", queue="streamed", state="pending")
    assert age is not None and 0 <= age <= time.time() - since + 0.001
    assert value(series, "queue_oldest_age_seconds", queue="plain") is None
    report = wait_for(lambda: {r.pattern: r for r in app.health.key_groups()}.get("jobs:{queue}"))
    assert report.type == "list or stream" and report.errors == {}


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({"label": "priority"}, "from a field or from the score: one"),
        ({"label": "priority", "field": "p", "score": "as_is"}, "from a field or from the score"),
    ],
)
@pytest.mark.fast
def test_split_by_takes_a_field_or_the_score(split: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        key_group(_group(type="zset", split_by=split))


@pytest.mark.fast
def test_split_by_score_reads_zsets_alone() -> None:
    split = {"split_by": {"label": "priority", "score": "negated"}}
    with pytest.raises(ValidationError, match=r"its list keys: split_by\.score applies to zset"):
        key_group(_group(**split))
    key_group(_group(by_type={"zset": split}))


def _prefixed(at: float, data: bytes) -> bytes:
    """A member as PriorityRedisHuey writes it: its enqueue time (µs, 8 bytes big-endian)
    before the message."""
    return int(at * 1e6).to_bytes(8, "big") + data


def test_a_zset_split_by_its_score_with_each_value_s_oldest_prefix(
    redis_client, redis_url, run_exporter
) -> None:
    now = time.time()
    redis_client.zadd(
        "jobs:vip",
        {
            _prefixed(now - 300, b"a"): -10,  # priority 10, its oldest
            _prefixed(now - 30, b"b"): -10,
            _prefixed(now - 600, b"c"): 0,  # priority 0
            _prefixed(now - 60, b"d"): -2.5,
            b"short": -7,  # no time in it: counted, its priority still counted
        },
    )
    oldest = {"time_in": "prefix", "format": "epoch_s", "divisor": 1e6}
    split = {"split_by": {"label": "priority", "score": "negated"}, "oldest": oldest}
    group = _group(by_type={"zset": split})
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", queue="vip", priority="10")

    def served(name: str, priority: str) -> float | None:
        return value(series, name, system="mixed", queue="vip", priority=priority)

    depths = {p: served("queue_depth", p) for p in ("10", "0", "2.5", "7")}
    assert depths == {"10": 2, "0": 1, "2.5": 1, "7": 1}
    for priority, since in (("10", 300), ("0", 600), ("2.5", 60)):
        age = served("queue_oldest_age_seconds", priority)
        assert age is not None and since <= age < since + 30, (priority, age)
    assert served("queue_oldest_age_seconds", "7") is None
    report = wait_for(lambda: {r.pattern: r for r in app.health.key_groups()}.get("jobs:{queue}"))
    assert report.errors == {"time_missing": 1}
