"""A head item over max_item_bytes keeps its queue's depth, skips its age, and never leaves Redis.

Found on main before the limit: a 64 MB item at the head of one queue was read whole every
cycle (64 MB over the network each time, and held in the sidecar while it was parsed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.conftest import is_ready, value, wait_for
from tests.layouts import iso, runnerq_activity, runnerq_enqueue
from tests.private_redis import PrivateRedis

LIMIT = 4096
MIB = 1024 * 1024


def _item(seconds_ago: float, size: int, field: str = "t") -> bytes:
    """A JSON item with its time in `field`, padded to `size` bytes."""
    head = json.dumps({field: iso(time.time() - seconds_ago), "pad": ""}).encode()
    return head[:-2] + b"x" * (size - len(head)) + b'"}'


def _write_list(client: redis.Redis, key: str, item: bytes) -> None:
    client.rpush(key, item, b"{}")


def _write_zset(client: redis.Redis, key: str, item: bytes) -> None:
    client.zadd(key, {item: 1, b"{}": 2})


def _write_hash(client: redis.Redis, key: str, item: bytes) -> None:
    """The hash field the item names is what is large: epoch seconds padded with zeros."""
    job = key.rsplit(":", 1)[1]
    client.rpush(key, job, "later")
    client.hset(f"job:{job}", "t", f"{time.time() - 60:.3f}".zfill(len(item)))


def _write_stream(client: redis.Redis, key: str, item: bytes) -> None:
    client.xadd(key, {"body": item}, id=f"{int((time.time() - 60) * 1000)}-0")
    client.xadd(key, {"body": "{}"})


FORMS: dict[str, tuple[dict[str, Any], Any]] = {
    "list head json": (
        {"type": "list", "oldest": {"time_in": "json", "field": "t"}},
        _write_list,
    ),
    "zset head member json": (
        {"type": "zset", "oldest": {"time_in": "json", "field": "t"}},
        _write_zset,
    ),
    "zset priority band": (
        {
            "type": "zset",
            "oldest": {"time_in": "json", "field": "t"},
            "priority_bands": {"width": 10, "names": {0: "normal"}},
        },
        _write_zset,
    ),
    "hash field the item names": (
        {"type": "list", "oldest": {"time_in": "hash", "hash_key": "job:{item}", "field": "t"}},
        _write_hash,
    ),
    "stream head entry": (
        {"type": "stream", "oldest": {"time_in": "stream_id"}},
        _write_stream,
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_an_item_over_the_limit_skips_only_its_age(redis_client, redis_url, form):
    group, write = FORMS[form]
    write(redis_client, "q:big", _item(60, 2 * LIMIT))
    write(redis_client, "q:small", _item(60, LIMIT // 2))
    key_group = {"system": "app", "pattern": "q:{queue}", "state": "pending", **group}
    config = RedisSourceConfig(url=redis_url, max_item_bytes=LIMIT, key_groups=[key_group])
    sampler = RedisKeySampler(config, 15.0)
    try:
        sampler.sample()
        cycle = sampler.sample()  # a head found too large is probed first: the same result
    finally:
        sampler.close()

    series = {
        (spec.name, labels[1]): v for spec, s in cycle.samples.metrics() for labels, v in s.items()
    }
    assert series[("queue_depth", "big")] == series[("queue_depth", "small")] == 2
    assert ("queue_oldest_age_seconds", "big") not in series
    assert series[("queue_oldest_age_seconds", "small")] >= 60
    (report,) = cycle.key_groups or []
    assert report.errors == {"item_too_large": 1}
    assert report.last_warning is not None and "larger than max_item_bytes" in report.last_warning


def _labelled(label: str, seconds_ago: float, size: int) -> bytes:
    """A JSON item with its time in `t` and its label in `q`, padded to `size` bytes."""
    return _item(seconds_ago, size).replace(b'{"t"', b'{"q": "' + label.encode() + b'", "t"', 1)


@pytest.mark.parametrize("key_type", ["list", "zset", "hash"])
def test_an_item_over_the_limit_in_a_key_split_by_label_fails_only_itself(
    redis_client, redis_url, key_type
):
    items = [_labelled("a", 90, 2 * LIMIT), _labelled("a", 60, 200), _labelled("b", 30, 200)]
    if key_type == "list":
        redis_client.rpush("split", *items)
    elif key_type == "zset":
        redis_client.zadd("split", {item: index for index, item in enumerate(items)})
    else:
        redis_client.hset("split", mapping={str(index): item for index, item in enumerate(items)})
    key_group = {
        "system": "app",
        "pattern": "split",
        "type": key_type,
        "state": "pending",
        "split_by": {"label": "priority", "field": "q"},
    }
    if key_type != "hash":
        key_group["oldest"] = {"end": "head", "time_in": "json", "field": "t"}
    config = RedisSourceConfig(url=redis_url, max_item_bytes=LIMIT, key_groups=[key_group])
    sampler = RedisKeySampler(config, 15.0)
    try:
        cycle = sampler.sample()
    finally:
        sampler.close()

    series = {
        (spec.name, labels[2]): v for spec, s in cycle.samples.metrics() for labels, v in s.items()
    }
    depths = {label: v for (name, label), v in series.items() if name == "queue_depth"}
    assert depths == {"__unread__": 1, "a": 1, "b": 1}  # the big one counts, unread
    if key_type != "hash":
        assert series[("queue_oldest_age_seconds", "a")] >= 60  # the next one is read
        assert ("queue_oldest_age_seconds", "__unread__") not in series
    (report,) = cycle.key_groups or []
    assert report.errors == {"item_too_large": 1}


@pytest.fixture
def private_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(rest.split()[0])
    return fields


def _too_large(series) -> float:
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and ("reason", "item_too_large") in labels
    )


def test_a_64_mib_head_item_is_never_read_whole(private_redis, serve_process, tmp_path):
    client = private_redis.client()
    big, small = _item(60, 64 * MIB, "queued_at"), _item(90, 200, "queued_at")
    client.rpush("orchestrata:queue:big:p1", big, small)
    client.rpush("orchestrata:queue:small:p1", small)
    del big
    now = time.time()
    runnerq_enqueue(client, "default", runnerq_activity("send", "Normal", now - 30), now)
    # Redis copies the item once per cycle to measure it (~0.1-0.5 s for 64 MiB): an interval
    # that leaves the cycle room, and a deadline a loaded machine meets too (at the default,
    # the interval, cycles timed out and none counted the item).
    config = tmp_path / "queue-exporter.yaml"
    config.write_text("sources:\n  redis:\n    cycle_timeout: 30\n")
    exporter = serve_process(
        "--config",
        str(config),
        "--redis-url",
        private_redis.url,
        "--preset",
        "orchestrata",
        "--preset",
        "runnerq",
        "--sample-interval",
        "1",
    )

    def too_large_at_least(cycles: int):
        def counted(series):
            found = value(series, "queue_depth", queue="big") is not None
            return found and _too_large(series) >= cycles

        return counted

    def lindex_calls() -> int:
        return int(client.info("commandstats").get("cmdstat_lindex", {}).get("calls", 0))

    series = exporter.series_when(too_large_at_least(2), timeout=60)
    first = _memory_kib(exporter.process.pid)
    sent_before = client.info("stats")["total_net_output_bytes"]
    lindex_before, too_large_before = lindex_calls(), _too_large(series)
    series = exporter.series_when(too_large_at_least(8), timeout=60)
    cycles = _too_large(series) - too_large_before
    lindex = lindex_calls() - lindex_before
    sent = client.info("stats")["total_net_output_bytes"] - sent_before
    last = _memory_kib(exporter.process.pid)

    print(
        f"\n64 MiB head: {cycles} cycles sent {sent / MIB:.2f} MiB, RSS {first['VmRSS'] // 1024} -> "
        f"{last['VmRSS'] // 1024} MiB (peak {last['VmHWM'] // 1024} MiB)"
    )
    assert sent < 8 * MIB  # six cycles of the item read whole would have sent 384 MiB
    # Once found too large, the big head is measured without copying it: only the small
    # queue's head is read (one cycle may be under way at either end of the count).
    assert lindex <= cycles + 2 < 2 * cycles
    assert last["VmRSS"] < 1.25 * first["VmRSS"]  # flat across the cycles ...
    assert last["VmHWM"] < first["VmRSS"] + 32 * 1024  # ... and never held half of the item
    assert value(series, "queue_depth", queue="big") == 2  # the depth is kept
    assert value(series, "queue_oldest_age_seconds", queue="big") is None  # the age skipped
    small_age = value(series, "queue_oldest_age_seconds", queue="small")
    assert small_age is not None and small_age >= 90
    other_system = value(series, "queue_oldest_age_seconds", system="runnerq", priority="normal")
    assert other_system is not None and other_system >= 30
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    # Ready once every source was reached: the runnerq preset's events stream too.
    wait_for(lambda: is_ready(exporter.port))
    client.close()


def test_a_refused_bounded_read_costs_the_ages_only(private_redis):
    """A Redis user that may not run the bounded script (an ACL from before it, say): every
    queue keeps its depth, the ages are skipped and counted, and the source stays up."""
    admin = private_redis.client()
    admin.rpush("jobs:a", _item(60, 200), _item(30, 200))
    admin.rpush("jobs:b", _item(60, 200))
    rules = ["-@all", "+ping", "+select", "+scan", "+llen", "+lindex", "%R~jobs:*"]
    admin.execute_command("ACL", "SETUSER", "sampler", "reset", "on", ">pw", *rules)
    url = private_redis.url.replace("redis://", "redis://sampler:pw@")
    key_group = {
        "system": "app",
        "pattern": "jobs:{queue}",
        "type": "list",
        "state": "pending",
        "oldest": {"time_in": "json", "field": "t"},
    }
    sampler = RedisKeySampler(RedisSourceConfig(url=url, key_groups=[key_group]), 15.0)
    try:
        cycle = sampler.sample()
    finally:
        sampler.close()
        admin.close()

    series = {
        (spec.name, labels[1]): v for spec, s in cycle.samples.metrics() for labels, v in s.items()
    }
    assert series == {("queue_depth", "a"): 2, ("queue_depth", "b"): 1}
    (report,) = cycle.key_groups or []
    assert report.errors == {"response_error": 2}
