"""The native-signal framework: its configuration, counts kept as absolute numbers, the ACL;
the times the Resque reader reads."""

from __future__ import annotations

import json

import pytest

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from exporter.config.effective import effective_yaml
from exporter.core import numbers
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import CeleryReaderConfig
from exporter.sources.readers.framework import CounterDeltas, Signals
from exporter.sources.readers.resque import running_job

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def _update(
    deltas: CounterDeltas, counts: dict[str, float], succeeds: bool = True, dip: float = 0.0
) -> dict:
    signals = Signals()
    increments = deltas.update(counts, signals, dip)
    if succeeds:
        signals.move_on()  # what RedisReader.read does once the reader's collect returned
    return increments


def test_a_count_s_dip_counts_nothing_and_keeps_its_baseline():
    """node-resque's retry plugin takes back a count for a moment (one per worker at most): a
    read of the dip counts nothing, nor the count coming back; further down is a reset."""
    deltas = CounterDeltas()
    assert _update(deltas, {"processed": 100.0}, dip=2) == {}  # the baseline
    assert _update(deltas, {"processed": 98.0}, dip=2) == {}  # two workers' dips
    assert _update(deltas, {"processed": 101.0}, dip=2) == {"processed": 1.0}  # back, and one
    assert _update(deltas, {"processed": 97.0}, dip=2) == {"processed": 97.0}  # reset, then 97
    assert _update(deltas, {"processed": 95.0}) == {"processed": 95.0}  # no dip allowed


def test_counts_kept_by_the_system_become_increments():
    deltas = CounterDeltas()
    assert _update(deltas, {"w1": 40.0, "w2": 5.0}) == {}  # the baseline: counted before us
    assert _update(deltas, {"w1": 43.0, "w2": 5.0}) == {"w1": 3.0}
    # w1 restarted (its count went down): what it did since counts from zero; w3 is new
    assert _update(deltas, {"w1": 2.0, "w2": 6.0, "w3": 4.0}) == {"w1": 2.0, "w2": 1.0, "w3": 4.0}
    assert _update(deltas, {"w3": 4.0}) == {}  # w1 and w2 gone: forgotten
    assert _update(deltas, {"w1": 1.0, "w3": 4.0}) == {"w1": 1.0}  # back under the same name


def test_counts_of_a_read_that_failed_are_counted_by_the_next():
    """A read that fails after its update (a later command of the read, its deadline) applies
    nothing, and its counts do not become the baseline: the next read counts them."""
    deltas = CounterDeltas()
    assert _update(deltas, {"w1": 40.0}, succeeds=False) == {}  # no baseline taken either
    assert _update(deltas, {"w1": 41.0}) == {}  # the baseline
    assert _update(deltas, {"w1": 45.0}, succeeds=False) == {"w1": 4.0}  # failed: not applied
    assert _update(deltas, {"w1": 46.0}) == {"w1": 5.0}  # all five since the baseline


def test_a_preset_turns_its_reader_on_and_a_param_or_the_operator_turns_it_off():
    on = config_module.from_dict({"presets": ["rq"]})
    assert on.sources.native is not None and [r.system for r in on.sources.native.enabled()] == [
        "rq"
    ]
    by_param = config_module.from_dict({"presets": [{"name": "rq", "params": {"native": False}}]})
    assert by_param.sources.native is not None and by_param.sources.native.enabled() == []
    by_operator = config_module.from_dict(
        {"presets": ["rq"], "sources": {"native": {"rq": {"enabled": False}}}}
    )
    assert by_operator.sources.native is not None and by_operator.sources.native.enabled() == []


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"rq": {"interval": 0}}, "sources.native.rq.interval: Input should be greater than 0"),
        ({"rq": {"system": ""}}, "sources.native.rq.system: String should have at least 1"),
        ({"rq": {"queue_set": "x"}}, "sources.native.rq.queue_set: Extra inputs are not permitted"),
        ({"nosuch": {}}, "sources.native.nosuch: Extra inputs are not permitted"),
    ],
)
def test_errors_name_their_place(section, message):
    with pytest.raises(config_module.ConfigError, match=message):
        config_module.from_dict({"sources": {"native": section}})


def test_a_readers_own_redis_password_is_masked():
    loaded = config_module.from_dict(
        {"sources": {"native": {"rq": {"redis": {"url": "redis://u:hunter2@h:6379/0"}}}}}
    )
    shown = effective_yaml(loaded)
    assert "hunter2" not in shown and "redis://u:****@h:6379/0" in shown


def test_the_acl_grants_a_reader_its_reads_only_while_it_is_on():
    on = redis_acl.acl_rules(config_module.from_dict({"presets": ["rq"]}))
    assert "+hmget" in on and "%R~rq:worker:*" in on and "%R~rq:job:*" in on
    off = redis_acl.acl_rules(
        config_module.from_dict({"presets": [{"name": "rq", "params": {"native": False}}]})
    )
    assert "+hmget" not in off and "%R~rq:worker:*" not in off


@pytest.mark.parametrize(
    ("url", "channel"),
    [
        ("redis://h:6379/3", "/3.celeryev/*"),
        ("redis://h:6379", "/0.celeryev/*"),
        ("redis://h:6379/0?db=5", "/5.celeryev/*"),
        ("unix:///run/redis.sock?db=2", "/2.celeryev/*"),
        ("unix:///run/redis.sock", "/0.celeryev/*"),
        ("redis+sentinel://s1:26379,s2:26379/mymaster/4", "/4.celeryev/*"),
    ],
)
def test_celery_events_channel_follows_the_urls_database(url, channel):
    connection = RedisConnectionConfig(url=url)
    assert CeleryReaderConfig().channel_pattern(connection) == channel
    assert connection.database == int(channel[1])


@pytest.mark.parametrize(
    ("run_at", "epoch"),
    [
        # node-resque: JavaScript's Date.toString(), in the worker's time zone
        ("Sun Dec 06 2026 12:40:00 GMT+0000 (Coordinated Universal Time)", 1796560800.0),
        ("Sun Dec 06 2026 13:40:00 GMT+0100 (Central European Standard Time)", 1796560800.0),
        # Ruby's Resque: Time#to_s (1.x), Time#iso8601 (2.x)
        ("2026-12-06 12:40:00 +0000", 1796560800.0),
        ("2026-12-06T12:40:00Z", 1796560800.0),
    ],
)
def test_resque_reads_a_run_at_as_node_resque_and_ruby_s_resque_write_it(run_at, epoch):
    record = json.dumps({"queue": "default", "run_at": run_at}).encode()
    assert running_job(record, latest=epoch + 300) == ("default", epoch)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"queue": "default", "run_at": "yesterday"}, "bad_value"),
        ({"queue": "default", "run_at": "Sun Dec 06 2126 12:40:00 GMT+0000"}, "future_time"),
        ({"queue": 7, "run_at": "2026-12-06T12:40:00Z"}, "bad_value"),
        ({"queue": "default", "run_at": "2026-12-06T12:40:00Z" + " " * 200}, "bad_value"),
        ({"queue": "q" * 2000, "run_at": "2026-12-06T12:40:00Z"}, "oversized_field"),
    ],
)
def test_resque_refuses_a_run_at_it_cannot_read_or_from_the_future(record, reason):
    with pytest.raises(numbers.InvalidValue) as refused:
        running_job(json.dumps(record).encode(), latest=1796560800.0 + 300)
    assert refused.value.reason == reason
