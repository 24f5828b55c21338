"""What each key group found: keys matched, series, errors named by group, key and reason."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import scrape_series, scrape_when, value, wait_for
from tests.private_redis import PrivateRedis

TYPO = "job:{queue}:p{priority}"  # the keys are jobs:..., one letter short
RIGHT = "jobs:{queue}:p{priority}"


def _group(pattern: str, **more: object) -> dict[str, object]:
    return {"system": "billing", "pattern": pattern, "type": "list", "state": "pending", **more}


def _reports(app):
    return {report.pattern: report for report in app.health.key_groups()}


def test_a_pattern_with_a_typo_matches_nothing_and_says_so(
    redis_client, redis_url, run_exporter, caplog
):
    redis_client.rpush("jobs:email:p1", "a", "b")
    redis_client.rpush("jobs:email:p2", "c")
    redis_client.rpush("jobs:sms:p1", "d")
    caplog.set_level(logging.INFO, logger="exporter.sources.redis_keys.sampler")
    groups = [_group(TYPO), _group(RIGHT, state="active")]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})

    series = scrape_when(app, "queue_exporter_keys_matched", pattern=TYPO)
    assert value(series, "queue_exporter_keys_matched", pattern=TYPO, system="billing") == 0
    assert value(series, "queue_exporter_keys_matched", pattern=RIGHT, source="redis") == 3

    reports = _reports(app)
    assert (reports[TYPO].keys_matched, reports[TYPO].series) == (0, 0)
    assert reports[TYPO].last_warning.startswith("matched no keys: a typo in the pattern")
    right = reports[RIGHT]
    assert (right.keys_matched, right.queues, right.series, right.errors) == (3, 2, 3, {})
    assert right.last_warning is None

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(TYPO in message and "matched no keys" in message for message in warnings)
    first_cycle = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        RIGHT in line and "3 key(s) matched, 2 queue(s), 3 series" in line for line in first_cycle
    )


def test_warnings_are_rate_limited_per_group_and_reason(redis_url, run_exporter, caplog):
    caplog.set_level(logging.WARNING, logger="exporter.sources.redis_keys.sampler")
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [_group(TYPO)]}}})
    sampler = app.runners[0]
    wait_for(lambda: sampler.run_once() and sampler.run_once() and len(caplog.records) >= 1)
    sampler.run_once()  # cycles go on finding nothing: said once, then held back with a count
    named = [r for r in caplog.records if TYPO in r.getMessage()]
    assert len(named) == 1


def test_a_key_of_the_wrong_type_is_named_with_its_group(
    redis_client, redis_url, run_exporter, caplog
):
    redis_client.rpush("jobs:email:p1", "a")
    redis_client.zadd("jobs:sms:p1", {"member": 1})
    caplog.set_level(logging.WARNING, logger="exporter.sources.redis_keys.sampler")
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [_group(RIGHT)]}}})

    series = scrape_when(app, "queue_exporter_source_errors_total", reason="wrong_type")
    errors = value(
        series,
        "queue_exporter_source_errors_total",
        source="redis",
        reason="wrong_type",
        system="billing",
        pattern=RIGHT,
    )
    assert errors is not None and errors >= 1
    report = wait_for(lambda: _reports(app).get(RIGHT))
    assert (report.keys_matched, report.series, report.errors) == (2, 1, {"wrong_type": 1})
    assert report.last_warning is not None and "jobs:sms:p1" in report.last_warning
    assert "another Redis type than the group's (a zset)" in report.last_warning  # TYPE's
    named = [r.getMessage() for r in caplog.records]
    assert any(RIGHT in m and "'jobs:sms:p1'" in m and "wrong_type" in m for m in named)


@pytest.mark.parametrize(
    ("oldest", "item", "reason"),
    [
        ({"time_in": "json", "field": "at"}, "not json", "item_not_json"),
        ({"time_in": "json", "field": "at"}, '{"other": 1}', "time_missing"),
        ({"time_in": "json", "field": "at"}, '{"at": "someday"}', "time_unparsable"),
    ],
)
def test_an_unreadable_head_item_is_named(
    redis_client, redis_url, run_exporter, caplog, oldest, item, reason
):
    redis_client.rpush("jobs:email:p1", item)
    caplog.set_level(logging.WARNING, logger="exporter.sources.redis_keys.sampler")
    groups = [_group(RIGHT, oldest=oldest)]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})

    scrape_when(app, "queue_exporter_source_errors_total", reason=reason, pattern=RIGHT)
    report = wait_for(lambda: _reports(app).get(RIGHT))
    assert report.errors == {reason: 1}
    assert report.series == 1  # the depth still counts
    assert any(
        "'jobs:email:p1'" in r.getMessage() and reason in r.getMessage() for r in caplog.records
    )


def test_a_stream_that_does_not_exist_is_named(redis_client, redis_url, run_exporter, caplog):
    redis_client.xadd("events:present", {"a": "1"})
    redis_client.xgroup_create("events:present", "workers", id="0")
    caplog.set_level(logging.WARNING, logger="exporter.sources.redis_keys.sampler")
    group = {
        "system": "billing",
        "pattern": "events:{queue}",
        "type": "stream",
        "state": "pending",
        "stream_group": "workers",
        "values": {"queue": ["present", "absent"]},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})

    scrape_when(app, "queue_exporter_source_errors_total", reason="stream_missing")
    report = wait_for(lambda: _reports(app).get("events:{queue}"))
    assert report.errors == {"stream_missing": 1}
    # keys matched are the keys that exist, not the names built from the values
    existing = redis_client.exists("events:present", "events:absent")
    assert (report.keys_matched, report.queues) == (existing, 1)
    assert any("'events:absent'" in r.getMessage() for r in caplog.records)


def test_a_failing_source_withdraws_its_key_group_facts(tmp_path, run_exporter):
    server = PrivateRedis(tmp_path).start()
    try:
        server.client().rpush("jobs:email:p1", "a")
        groups = [_group(RIGHT)]
        app = run_exporter({"sources": {"redis": {"url": server.url, "key_groups": groups}}})
        scrape_when(app, "queue_exporter_keys_matched", pattern=RIGHT)
        server.stop()

        def down():
            series = scrape_series(app)
            return (
                series if value(series, "queue_exporter_source_up", source="redis") == 0 else None
            )

        series = wait_for(down)
        assert value(series, "queue_exporter_keys_matched", pattern=RIGHT) is None  # not stale
        assert app.health.key_groups() == []
    finally:
        server.stop()
