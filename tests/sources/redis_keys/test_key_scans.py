"""Scanned key groups share one SCAN of their common prefix while that pays, and are scanned
apart when it returns more keys no group takes than keys taken (exporter/sources/redis_keys/scans.py).
Both ways give the same series; what Redis was asked is read from its own command stats, on a
redis-server of the test's own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from exporter.config import settings as config_module
from exporter.sources.redis_keys.groups import shared_glob
from exporter.sources.redis_keys.sampler import RedisKeySampler
from exporter.sources.redis_keys.scans import RETRY_AFTER
from exporter.sources.source import SourceReport
from tests.private_redis import PrivateRedis

PAGE = 50  # scan_count: the SCAN page, and the unclaimed keys a shared SCAN may always return
QUEUES = {"system": "jobs", "pattern": "app:queue:{queue}", "type": "list", "state": "pending"}
DEAD = {"system": "jobs", "pattern": "app:dead:{queue}", "type": "list", "state": "dead_letter"}
NAMES = ("queue_depth", "queue_oldest_age_seconds")
AGED = {"oldest": {"time_in": "json", "field": "at", "format": "epoch_s"}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[redis.Redis]:
    private = PrivateRedis(tmp_path).start()
    client = redis.Redis(port=private.port)
    try:
        yield client
    finally:
        client.close()
        private.stop()


def _sampler(client: redis.Redis, *groups: dict) -> RedisKeySampler:
    port = client.connection_pool.connection_kwargs["port"]
    settings = {"url": f"redis://127.0.0.1:{port}/0", "key_groups": list(groups)}
    config = config_module.from_dict({"sources": {"redis": {**settings, "scan_count": PAGE}}})
    return RedisKeySampler(config.sources.redis, 15.0)


def _cycle(client: redis.Redis, sampler: RedisKeySampler) -> tuple[dict, int]:
    """One cycle's series, and how many SCANs Redis answered for it."""
    report, scans = _reported_cycle(client, sampler)
    return {spec.name: dict(part.items()) for spec, part in report.samples.metrics()}, scans


def _reported_cycle(client: redis.Redis, sampler: RedisKeySampler) -> tuple[SourceReport, int]:
    """One cycle's report, and how many SCANs Redis answered for it."""
    client.config_resetstat()
    report = sampler.sample()
    return report, client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)


def _passes(client: redis.Redis) -> int:
    """The SCAN calls of one full pass over the keyspace (MATCH filters after the visit). It
    varies by a call or two from one moment to the next: while Redis rehashes its keyspace in
    the background a SCAN visits both tables."""
    client.config_resetstat()
    cursor, calls = 0, 0
    while True:
        cursor, _ = client.scan(cursor, match="nothing:*", count=PAGE)
        calls += 1
        if not cursor:
            return calls


def _one_pass(scans: int, passes: int) -> bool:
    """One pass over the keyspace, not one a group (at least 2 * passes - 2 for two groups),
    with room for the calls a background rehash adds."""
    return scans < 1.5 * passes


def _load(client: redis.Redis, queues: int, unrelated: int, unclaimed: int) -> None:
    for index in range(queues):
        client.rpush(f"app:queue:q{index}", f'{{"at": {1_700_000_000 + index}}}', "x")
    client.rpush("app:dead:q0", '{"at": 1}')
    client.mset({f"session:{index}": "x" for index in range(unrelated)})
    if unclaimed:  # under the groups' prefix, but no group's: an app's job hashes, say
        client.mset({f"app:job:{index}": "x" for index in range(unclaimed)})


def test_the_shared_glob_is_the_literal_prefix_the_patterns_have_in_common():
    assert shared_glob(["app:queue:{queue}", "app:dead:{queue}"]) == "app:*"
    assert shared_glob(["{queue}:processing", "{queue}:scheduled"]) == "*"  # none in common
    assert shared_glob(["a[1]*:{queue}", "a[1]*:{queue}:x"]) == r"a\[1\]\*:*"  # escaped
    assert shared_glob(["{{bull}}:{queue}:wait", "{{bull}}:{queue}:active"]) == "{bull}:*"


def test_groups_share_one_scan_and_give_what_each_scanned_apart_gives(server):
    _load(server, queues=300, unrelated=2000, unclaimed=0)
    shared = _sampler(server, {**QUEUES, **AGED}, DEAD)
    apart = [_sampler(server, {**QUEUES, **AGED}), _sampler(server, DEAD)]
    try:
        series, scans = _cycle(server, shared)
        assert _one_pass(scans, _passes(server))  # one pass for both groups

        alone = [_cycle(server, sampler) for sampler in apart]
        assert sum(calls for _, calls in alone) >= 2 * _passes(server) - 2  # a pass each
        depths, ages = (
            {k: v for part, _ in alone for k, v in part[name].items()} for name in NAMES
        )
        assert series["queue_depth"] == depths
        assert series["queue_oldest_age_seconds"].keys() == ages.keys()  # measured moments apart
        assert all(abs(series["queue_oldest_age_seconds"][k] - v) < 5 for k, v in ages.items())
        assert len(series["queue_depth"]) == 301
        assert series["queue_depth"][("jobs", "q7", "", "pending")] == 2
        assert series["queue_depth"][("jobs", "q0", "", "dead_letter")] == 1

        again, scans = _reported_cycle(server, shared)  # from the keys remembered: the same again
        depths = {spec.name: dict(part.items()) for spec, part in again.samples.metrics()}
        assert depths["queue_depth"] == series["queue_depth"]
        assert _one_pass(scans, _passes(server))
        reports = {report.pattern: report for report in again.key_groups or []}
        assert reports[QUEUES["pattern"]].keys_matched == 300
        assert reports[DEAD["pattern"]].keys_matched == 1
    finally:
        for sampler in (shared, *apart):
            sampler.close()


def test_a_shared_scan_returning_mostly_keys_no_group_takes_gives_way_to_scans_apart(
    server, caplog
):
    # 2000 unrelated keys: the keyspace still takes many SCAN pages once the unclaimed keys
    # are deleted, so one pass is told from one per group with room for a rehash's extra calls
    _load(server, queues=20, unrelated=2000, unclaimed=2000)
    sampler = _sampler(server, QUEUES, DEAD)
    passes = _passes(server)
    try:
        with caplog.at_level(logging.INFO, logger="exporter.sources.redis_keys.scans"):
            shared, scans = _cycle(server, sampler)
        assert _one_pass(scans, passes)
        assert "'app:*' returned 2000 key(s) no key group takes, against 21 taken" in caplog.text

        cycles = [_cycle(server, sampler) for _ in range(RETRY_AFTER)]
        for series, scans in cycles:  # a pass per group, the same series
            assert scans >= 2 * passes - 2
            assert series["queue_depth"] == shared["queue_depth"]
        assert len(shared["queue_depth"]) == 21

        server.delete(*[f"app:job:{index}" for index in range(2000)])  # the keyspace changed
        series, scans = _cycle(server, sampler)  # sharing is tried again, and now pays
        assert _one_pass(scans, _passes(server))
        assert series["queue_depth"] == shared["queue_depth"]
        _, scans = _cycle(server, sampler)
        assert _one_pass(scans, _passes(server))
    finally:
        sampler.close()
