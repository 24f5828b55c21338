"""A key group's keys are read in bulk, in parts (key_commands.GroupReads): a whole key's depth
and head read, or a score window's ZCOUNT and ZRANGEBYSCORE. Both give the same series, errors
and reports for the same keys when the window holds every member, whatever the round size
(a round may end inside a run of keys, or hold one key's commands alone)."""

from __future__ import annotations

import time

import pytest

from exporter.config import settings as config_module
from exporter.sources.redis_keys.sampler import RedisKeySampler

ZSET = {"system": "jobs", "pattern": "delayed:{_shard}:{queue}", "type": "zset"}
OLDEST = {"time_in": "score", "format": "epoch_s"}
# A score window reads the same keys in a part of its own (every score here is above 0, so
# the window holds every member); without it the group reads whole keys.
GENERAL = {**ZSET, "state": "retry", "oldest": OLDEST, "max_depth": 7}
GENERAL["scores"] = {"window": "positive"}
PLAIN = {**ZSET, "state": "scheduled", "oldest": OLDEST, "max_depth": 7}


def _load(client, now: float) -> None:
    for shard in range(3):  # three shards of each queue: one series each, depths summed
        for queue in range(40):
            members = {f"job-{queue}-{n}": now - 60 * (queue + shard) - n for n in range(3)}
            client.zadd(f"delayed:{shard}:q{queue}", members)
    client.zadd("delayed:0:huge", {"x" * 300: now - 5})  # over max_item_bytes: measured only
    client.rpush("delayed:3:q3", "a list")  # a fourth shard of q3, of the wrong type
    client.zadd("delayed:2:stale", {"old": 1.0})  # a time of 1970


def _sample(url: str, pipeline_size: int):
    settings = {"url": url, "key_groups": [GENERAL, PLAIN], "pipeline_size": pipeline_size}
    config = config_module.from_dict({"sources": {"redis": {**settings, "max_item_bytes": 256}}})
    sampler = RedisKeySampler(config.sources.redis, 15.0)
    try:
        report = sampler.sample()
    finally:
        sampler.close()
    series = {spec.name: dict(part.items()) for spec, part in report.samples.metrics()}
    return series, report.key_groups


def _by_state(table: dict, state: str) -> dict:
    return {labels[:3]: value for labels, value in table.items() if labels[3] == state}


@pytest.mark.parametrize("pipeline_size", [1, 3, 1000])
def test_whole_keys_and_a_window_holding_them_agree(redis_client, redis_url, pipeline_size):
    now = time.time()
    _load(redis_client, now)
    series, reports = _sample(redis_url, pipeline_size)

    depths, ages = series["queue_depth"], series["queue_oldest_age_seconds"]
    plain, general = _by_state(depths, "scheduled"), _by_state(depths, "retry")
    assert plain == general
    assert plain[("jobs", "q3", "")] == 9  # the list is not counted, the three zsets are
    assert plain[("jobs", "q7", "")] == 9  # three shards of three
    assert ("jobs", "huge", "") in plain and ("jobs", "huge", "") not in _by_state(ages, "retry")
    plain_ages, general_ages = _by_state(ages, "scheduled"), _by_state(ages, "retry")
    assert plain_ages.keys() == general_ages.keys()
    assert all(abs(plain_ages[labels] - age) < 1 for labels, age in general_ages.items())
    assert 60 * 9 + 2 <= plain_ages[("jobs", "q7", "")] < 60 * 9 + 60  # the oldest shard's head
    assert plain_ages[("jobs", "stale", "")] > now - 10
    assert series["queue_max_depth"][("jobs", "q7")] == 7

    first, second = reports  # both groups: the same keys, series, queues and errors
    assert first.errors == second.errors == {"wrong_type": 1, "item_too_large": 1}
    assert first.keys_matched == second.keys_matched == 3 * 40 + 3  # and huge, stale, the list
    assert first.series == second.series == 42
    assert first.queues == second.queues
