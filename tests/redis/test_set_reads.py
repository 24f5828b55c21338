"""Sets are read in bounded pieces (exporter/redis/members.py): SSCAN (ZSCAN) a page at a time,
no further than the reader's limit, so a set flooded with 1,000,000 members costs a read its
limit and a page, counted and named (over_limit for a native reader, too_many_members for a
key group), never the whole set. Issue 40's attack: SMEMBERS sent the whole set (about 30 MB
here) to every reader that lists a set: Sidekiq's processes, kombu's bindings, RQ's workers, a
key group's queue set. What Redis sent is read from its own stats, on a redis-server of the
test's own; the members read are compared with Redis's own SMEMBERS / ZRANGE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from exporter.config import settings as config_module
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.members import members_of
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import (
    CeleryReaderConfig,
    RqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import MAX_KEYS, MAX_WORKERS, Signals
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.sidekiq import SidekiqReader
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.private_redis import PrivateRedis

FLOOD = 1_000_000
# Bytes Redis sends per member of a flooded set: the member (up to 17 bytes here) and RESP's
# framing ($17\r\n...\r\n: 7 bytes); a read may cost twice its members' worth (a page past the
# limit, SSCAN's cursor replies), never the set's.
MEMBER_BYTES = 24
CHUNK = 20_000  # members one SADD (ZADD) fills a flooded set with


@pytest.fixture
def server(tmp_path: Path) -> Iterator[redis.Redis]:
    private = PrivateRedis(tmp_path).start()
    client = redis.Redis(port=private.port)
    try:
        yield client
    finally:
        client.close()
        private.stop()


def _flood(client: redis.Redis, key: str, prefix: str, kind: str = "set", n: int = FLOOD) -> None:
    for start in range(0, n, CHUNK):
        chunk = [f"{prefix}{i}" for i in range(start, min(start + CHUNK, n))]
        if kind == "zset":
            client.zadd(key, {member: i for i, member in enumerate(chunk)})
        else:
            client.sadd(key, *chunk)
    assert (client.zcard(key) if kind == "zset" else client.scard(key)) == n


def _url(client: redis.Redis) -> str:
    return f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"


class Cost:
    """What Redis sent and which commands it ran between `start` and `stop`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.bytes = 0
        self.calls: dict[str, int] = {}

    def __enter__(self) -> Cost:
        self.client.config_resetstat()
        return self

    def __exit__(self, *_: object) -> None:
        self.bytes = int(self.client.info("stats")["total_net_output_bytes"])
        stats: dict[str, Any] = self.client.info("commandstats")
        self.calls = {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}


@pytest.mark.parametrize("kind", ["set", "zset"])
def test_members_are_each_read_once_and_only_as_far_as_they_are_taken(server, kind):
    _flood(server, "small", "m", kind, n=5_000)
    truth = set(server.zrange("small", 0, -1) if kind == "zset" else server.smembers("small"))
    read = list(members_of(server, "small", kind, page=100))
    assert len(read) == len(truth) == 5_000 and set(read) == truth  # each once, every one
    _flood(server, "flood", "member:", kind)
    signals = Signals(source="test")
    with Cost(server) as cost:
        taken = list(signals.names(members_of(server, "flood", kind), MAX_WORKERS, "flood"))
    assert len(set(taken)) == len(taken) == MAX_WORKERS
    assert signals.tally.invalid == {"over_limit": 1}
    scan = "zscan" if kind == "zset" else "sscan"
    assert cost.calls.get("smembers", 0) == cost.calls.get("zrange", 0) == 0
    assert cost.calls[scan] <= MAX_WORKERS // 1000 + 3  # its pages, and one past the limit
    assert cost.bytes < 2 * MAX_WORKERS * MEMBER_BYTES * (2 if kind == "zset" else 1)


def test_a_flooded_sidekiq_processes_set_costs_a_read_its_worker_limit(server):
    _flood(server, "processes", "host:")
    reader = SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=_url(server)))
    signals = Signals(source=reader.name)
    with Cost(server) as cost:
        reader.read(signals)
    reader.close()
    assert signals.tally.invalid == {"over_limit": 1}  # the processes beyond MAX_WORKERS
    assert cost.calls["hmget"] == MAX_WORKERS  # one a process taken (none has a hash: gone)
    assert cost.bytes < 2 * MAX_WORKERS * MEMBER_BYTES + MAX_WORKERS * 8  # + HMGET's nils


def test_a_flooded_rq_workers_set_costs_a_read_its_worker_limit(server):
    _flood(server, "rq:workers", "rq:worker:w")
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=_url(server)))
    signals = Signals(source=reader.name)
    with Cost(server) as cost:
        reader.read(signals)
    reader.close()
    assert signals.tally.invalid == {"over_limit": 1}
    assert cost.calls["hmget"] == MAX_WORKERS
    assert cost.bytes < 2 * MAX_WORKERS * MEMBER_BYTES + MAX_WORKERS * 8


def test_flooded_kombu_bindings_cost_a_read_max_keys_members(server):
    """kombu's binding sets name the declared queues: 1,000,000 of them are read up to
    MAX_KEYS members over every set, and the queues remembered up to 10,000 (two refusals)."""
    _flood(server, "_kombu.binding.celery", "celery\x06\x16\x06\x16q")
    _flood(server, "_kombu.binding.other", "other\x06\x16\x06\x16o", n=10)
    config = CeleryReaderConfig(inspect=False, report_no_events=False)
    reader = CeleryReader(config, RedisConnectionConfig(url=_url(server)), 1.0)
    signals = Signals(source=reader.name)
    with Cost(server) as cost:
        reader.read(signals)
    reader.close()
    assert signals.tally.invalid == {"over_limit": 2}
    assert cost.calls["sscan"] <= MAX_KEYS // 1000 + 4
    assert cost.bytes < 2 * MAX_KEYS * MEMBER_BYTES


@pytest.mark.parametrize("kind", ["set", "zset"])
def test_a_flooded_queue_set_costs_a_key_group_max_keys_members(server, kind):
    """A key group's queues named by a set of 1,000,000 members (max_keys 1,000): the first
    1,000 members read are its queues, each reading its depth; the set is named once a cycle
    (too_many_members), the rest never leaves Redis."""
    _flood(server, "known", "q", kind)
    max_keys = 1_000
    for n in range(1, 11):
        server.rpush(f"queue:q{n}", "job")  # some of them exist
    group = {
        "system": "app",
        "pattern": "queue:{queue}",
        "type": "list",
        "state": "pending",
        "values_from_set": {"queue": {"key": "known", "type": kind}},
    }
    settings = {"url": _url(server), "key_groups": [group], "max_keys": max_keys}
    config = config_module.from_dict({"sources": {"redis": settings}})
    sampler = RedisKeySampler(config.sources.redis, 15.0)
    with Cost(server) as cost:
        cycle = sampler.sample()
    sampler.close()
    depths = {
        labels: value
        for spec, part in cycle.samples.metrics()
        if spec.name == "queue_depth"
        for labels, value in part.items()
    }
    assert len(depths) == max_keys
    (report,) = cycle.key_groups or []
    assert report.errors == {"too_many_members": 1}
    assert report.failed_keys == (("too_many_members", "known"),)
    assert f"{FLOOD} members, {max_keys} (max_keys) read" in (report.last_warning or "")
    scan = "zscan" if kind == "zset" else "sscan"
    assert cost.calls[scan] <= 4
    assert cost.bytes < 2 * max_keys * MEMBER_BYTES * (2 if kind == "zset" else 1) + 200_000
