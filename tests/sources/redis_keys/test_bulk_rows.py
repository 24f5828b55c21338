"""The values a cycle reads in bulk go into rows while the replies are read, and into their
tables once the reads are done (key_commands.Rows): a series several keys give combines as
its metric says (depths add up, ages and limits keep the largest), one key's alone."""

from __future__ import annotations

import json
import time

from exporter.config import settings as config_module
from exporter.sources.redis_keys.sampler import RedisKeySampler

OLDEST = {"time_in": "json", "field": "at", "format": "epoch_s"}


def _group(pattern: str, **more) -> dict:
    return {"system": "app", "pattern": pattern, "type": "list", "state": "pending", **more}


def _series(url: str, groups: list[dict]) -> dict[str, dict]:
    config = config_module.from_dict({"sources": {"redis": {"url": url, "key_groups": groups}}})
    sampler = RedisKeySampler(config.sources.redis, 15.0)
    try:
        report = sampler.sample()
    finally:
        sampler.close()
    return {spec.name: dict(series.items()) for spec, series in report.samples.metrics()}


def _push(client, key: str, *times: float) -> None:
    client.rpush(key, *(json.dumps({"at": at}) for at in times))


def test_series_of_several_keys_combine(redis_client, redis_url):
    now = time.time()
    _push(redis_client, "rows:a:q1", now - 100, now)
    _push(redis_client, "rows:b:q1", now - 300)  # the same series by another group
    _push(redis_client, "rows:a:q2", now - 50)
    _push(redis_client, "rows:c:x:q2", now - 400)  # and by a third group's two keys
    _push(redis_client, "rows:c:y:q2", now - 20)
    groups = [
        _group("rows:a:{queue}", oldest=OLDEST, max_depth=5),
        _group("rows:b:{queue}", oldest=OLDEST, max_depth=9),
        _group("rows:c:{_shard}:{queue}", oldest=OLDEST),
    ]
    series = _series(redis_url, groups)
    q1, q2 = ("app", "q1", "", "pending"), ("app", "q2", "", "pending")
    assert series["queue_depth"] == {q1: 3, q2: 3}
    ages = series["queue_oldest_age_seconds"]
    assert ages.keys() == {q1, q2}
    assert 300 <= ages[q1] < 330  # the oldest head of the series' keys
    assert 400 <= ages[q2] < 430
    assert series["queue_max_depth"] == {("app", "q1"): 9, ("app", "q2"): 5}


def test_series_of_one_key_each(redis_client, redis_url):
    now = time.time()
    for queue in range(30):
        _push(redis_client, f"one:{queue}", now - 100 - queue)
    redis_client.rpush("one:bad", "not json")  # a depth, its age unreadable (counted)
    series = _series(redis_url, [_group("one:{queue}", oldest=OLDEST, max_depth=4)])
    assert len(series["queue_depth"]) == 31
    ages = series["queue_oldest_age_seconds"]
    assert len(ages) == 30 and ("app", "bad", "", "pending") not in ages
    assert 129 <= ages[("app", "29", "", "pending")] < 160
    assert set(series["queue_max_depth"].values()) == {4}
    assert len(series["queue_max_depth"]) == 31  # a key whose head is unreadable has a limit
