"""The keys one key-sampler cycle reads are bounded by the source's max_keys, over its key groups
(sources/redis_keys/room.py): each group is sure of an even share, and what a group leaves unused is
lent to the groups that found more, evenly. Queues beyond what a group may read are not read
(nor built: no memory for them), and counted exactly and named once a cycle (reason
too_many_keys); the queues within it read exactly. bench/discovered_queues.py measures what
100,000 queues of each system cost (docs/security.md).
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from exporter.config import settings as config_module
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.conftest import scrape_series, total, wait_for

QUEUES = 300
MAX_KEYS = 400  # two groups that found 300 keys each: 200 keys each


def test_queues_beyond_max_keys_are_counted_not_read(redis_client, redis_url, run_exporter):
    pipe = redis_client.pipeline(transaction=False)
    for n in range(QUEUES):
        pipe.sadd("known", f"q{n:03}")  # a set naming the queues: keys built from it
        pipe.rpush(f"built:q{n:03}", "a", "b")
        pipe.rpush(f"scanned:q{n:03}", "a")  # keys found by SCAN
    pipe.execute()
    groups = [
        {
            "system": "built",
            "pattern": "built:{queue}",
            "type": "list",
            "state": "pending",
            "values_from_set": {"queue": {"key": "known"}},
        },
        {"system": "scanned", "pattern": "scanned:{queue}", "type": "list", "state": "pending"},
    ]
    redis = {"url": redis_url, "key_groups": groups, "max_keys": MAX_KEYS}
    app = run_exporter({"sources": {"redis": redis}})

    def read() -> dict | None:
        series = scrape_series(app)
        depths = [
            (dict(labels), v) for (name, labels), v in series.items() if name == "queue_depth"
        ]
        return series if depths else None

    series = wait_for(read)
    depths = {
        (labels["system"], labels["queue"]): depth
        for (name, label_set), depth in series.items()
        if name == "queue_depth"
        for labels in [dict(label_set)]
    }
    built = {queue: depth for (system, queue), depth in depths.items() if system == "built"}
    assert built == {f"q{n:03}": 2 for n in range(MAX_KEYS // 2)}  # the first, in order
    scanned = [queue for system, queue in depths if system == "scanned"]
    assert len(scanned) == MAX_KEYS // 2
    assert all(depth == 1 for (system, _), depth in depths.items() if system == "scanned")
    errors = {
        system: total(
            series, "queue_exporter_source_errors_total", reason="too_many_keys", system=system
        )
        for system in ("built", "scanned")
    }
    assert all(count >= 1 for count in errors.values()), errors
    reports = {report.system: report for report in app.health.key_groups()}
    assert reports["built"].errors["too_many_keys"] == QUEUES - MAX_KEYS // 2
    assert reports["scanned"].errors["too_many_keys"] == QUEUES - MAX_KEYS // 2
    assert "max_keys" in (reports["built"].last_warning or "")


def _sampler(
    redis_url: str, max_keys: int, *groups: dict, scan_count: int | None = None
) -> RedisKeySampler:
    settings = {"url": redis_url, "key_groups": list(groups), "max_keys": max_keys}
    if scan_count is not None:
        settings["scan_count"] = scan_count
    config = config_module.from_dict({"sources": {"redis": settings}})
    return RedisKeySampler(config.sources.redis, 15.0)


def _cycle(sampler: RedisKeySampler) -> tuple[Counter[str], dict]:
    """One cycle: per system, the queues whose depth was read (their depth each checked), and
    each group's errors."""
    read: Counter[str] = Counter()
    report = sampler.sample()
    for spec, series in report.samples.metrics():
        if spec.name == "queue_depth":
            for labels, depth in series.items():
                system = labels[spec.labels.index("system")]
                assert depth == DEPTHS.get(system, 1), (labels, depth)
                read[system] += 1
    return read, {group.system: dict(group.errors) for group in report.key_groups or []}


def _scanned(system: str) -> dict:
    return {"system": system, "pattern": f"{system}:{{queue}}", "type": "list", "state": "pending"}


def _built(system: str) -> dict:
    return {**_scanned(system), "values_from_set": {"queue": {"key": f"{system}-queues"}}}


def _queues(client: redis.Redis, system: str, count: int, named: bool = False) -> None:
    pipe = client.pipeline(transaction=False)
    for n in range(count):
        pipe.rpush(f"{system}:q{n}", *["job"] * DEPTHS.get(system, 1))
        if named:
            pipe.sadd(f"{system}-queues", f"q{n}")
    pipe.execute()


DEPTHS = {"few": 3}  # jobs per queue, 1 unless named; built queues not named read 0


# SCAN pages of about 1,000 keys, or of about 10: the first pages of a group then fit within
# its share and are read without asking the room key by key (KeyRoom.within_shares), the
# later ones are taken key by key, and the keys read and counted are the same.
PAGES = pytest.mark.parametrize("scan_count", [None, 10], ids=["default_pages", "small_pages"])


@PAGES
def test_a_share_a_group_leaves_unused_is_lent_to_the_group_that_needs_it(
    redis_client, redis_url, scan_count
):
    """max_keys 2,000 over four groups (500 each): a group of 1,500 queues beside an idle
    group, one of 20 queues and one of 5 built queues is read in full, nothing counted (before:
    500 read, 1,000 counted too_many_keys)."""
    _queues(redis_client, "busy", 1_500)
    _queues(redis_client, "few", 20)
    _queues(redis_client, "built", 5, named=True)
    groups = (_scanned("busy"), _scanned("idle"), _scanned("few"), _built("built"))
    sampler = _sampler(redis_url, 2_000, *groups, scan_count=scan_count)
    for _ in range(2):  # the second cycle goes by the routes the first learned
        read, errors = _cycle(sampler)
        assert read == {"busy": 1_500, "few": 20, "built": 5}
        assert errors == {"busy": {}, "idle": {}, "few": {}, "built": {}}


@PAGES
def test_when_max_keys_binds_the_groups_in_need_share_it_evenly(
    redis_client, redis_url, scan_count
):
    """max_keys 600 over four groups (150 each) that found 500, 320, 60 and 400 (built from a
    set): the group of 60 reads all, the room left (540) is split evenly, 180 each, and what is
    not read is counted exactly per group."""
    _queues(redis_client, "busy", 500)
    _queues(redis_client, "other", 320)
    _queues(redis_client, "few", 60)
    _queues(redis_client, "built", 400, named=True)
    groups = (_scanned("busy"), _scanned("other"), _scanned("few"), _built("built"))
    sampler = _sampler(redis_url, 600, *groups, scan_count=scan_count)
    for _ in range(2):
        read, errors = _cycle(sampler)
        assert read == {"busy": 180, "other": 180, "few": 60, "built": 180}
        assert errors == {
            "busy": {"too_many_keys": 320},
            "other": {"too_many_keys": 140},
            "few": {},
            "built": {"too_many_keys": 220},
        }


@PAGES
def test_scanned_groups_share_max_keys_as_found_page_by_page(redis_client, redis_url, scan_count):
    """max_keys 600 over three scanned groups (200 each) that found 500, 320 and 60: the group
    of 60 reads all, the room left (540) is split evenly, 270 each, the rest counted. With
    small pages each group's first keys are read page by page within its share, counted as
    the room counts them key by key (KeyRoom.took)."""
    _queues(redis_client, "busy", 500)
    _queues(redis_client, "other", 320)
    _queues(redis_client, "few", 60)
    groups = (_scanned("busy"), _scanned("other"), _scanned("few"))
    sampler = _sampler(redis_url, 600, *groups, scan_count=scan_count)
    for _ in range(2):
        read, errors = _cycle(sampler)
        assert read == {"busy": 270, "other": 270, "few": 60}
        assert errors == {"busy": {"too_many_keys": 230}, "other": {"too_many_keys": 50}, "few": {}}


def test_keys_naming_more_queues_than_max_keys_are_taken_up_to_it(redis_client, redis_url):
    """Queues named by keys (values_from_keys, as BullMQ's meta hashes): 300 of them under
    max_keys 100 take 100 (before: every key found was kept, a million of them too, and
    remembered for the next cycle), the others counted and named once a cycle."""
    _queues(redis_client, "named", 300)
    redis_client.mset({f"meta:q{n}": 1 for n in range(300)})
    group = {**_scanned("named"), "values_from_keys": {"queue": "meta:{value}"}}
    sampler = _sampler(redis_url, 100, group)
    for _ in range(2):
        read, errors = _cycle(sampler)
        assert read == {"named": 100}
        assert errors == {"named": {"too_many_values": 1}}
    (report,) = sampler.sample().key_groups or []
    assert "200 more keys match, 100 (max_keys) taken" in (report.last_warning or "")
