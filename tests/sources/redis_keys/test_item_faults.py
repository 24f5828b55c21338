"""One item or key fails only itself: hostile heads of queues never take other series away.

Found on main before the fix: one JSON item whose time was a 400-digit integer, or that was
nested 100k levels deep, withdrew every Redis series of every system and kept /readyz at 503.
"""

from __future__ import annotations

import json
import logging
import time

from tests.conftest import is_ready, scrape_series, value, wait_for
from tests.layouts import iso, rq_enqueue, runnerq_activity, runnerq_enqueue


# What these tests weigh is which series a hostile item takes away, not how fast a cycle ends:
# at the tests' 0.2 s interval (the default deadline), one cycle slowed by a loaded machine
# timed out, withdrew every series and turned /readyz to 503 between two assertions.
def _unhurried() -> dict:
    return {"sources": {"redis": {"cycle_timeout": 30}}}


def _errors(series, reason):
    """Errors of `reason` summed over the key groups that met it."""
    wanted = {("source", "redis"), ("reason", reason)}
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and wanted <= labels
    )


def _published_with(app, reason):
    """A scrape after a published cycle that met `reason` (errors are counted mid-cycle)."""

    def ready():
        series = scrape_series(app)
        up = value(series, "queue_exporter_source_up", source="redis") == 1
        return series if up and _errors(series, reason) >= 1 else None

    return wait_for(ready)


def test_hostile_head_items_fail_only_their_own_age(redis_client, redis_url, run_exporter):
    now = time.time()
    good = json.dumps({"packet": {}, "queued_at": iso(now - 60), "message_id": "m"})
    huge_int = '{"queued_at": ' + "9" * 400 + "}"
    deep = '{"queued_at": ' + "[" * 100_000 + "]" * 100_000 + "}"
    redis_client.rpush("orchestrata:queue:huge:p1", huge_int, good)
    redis_client.rpush("orchestrata:queue:deep:p1", deep)
    redis_client.rpush("orchestrata:queue:good:p1", good)
    runnerq_enqueue(redis_client, "default", runnerq_activity("send", "Normal", now - 30), now)

    app = run_exporter(_unhurried(), redis_url=redis_url, preset=["orchestrata", "runnerq"])
    series = _published_with(app, "item_too_deep")

    assert value(series, "queue_depth", queue="huge") == 2  # the depth is kept ...
    assert value(series, "queue_depth", queue="deep") == 1
    assert value(series, "queue_oldest_age_seconds", queue="huge") is None  # ... the age skipped
    assert value(series, "queue_oldest_age_seconds", queue="deep") is None
    good_age = value(series, "queue_oldest_age_seconds", queue="good")
    assert good_age is not None and good_age >= 60
    runnerq_age = value(series, "queue_oldest_age_seconds", system="runnerq", priority="normal")
    assert runnerq_age is not None and runnerq_age >= 30  # another system is untouched
    assert _errors(series, "time_unparsable") >= 1
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    # Ready once every source was reached: the runnerq preset's events stream too, whose
    # consumer may still be on its first read when the key sampler has published.
    wait_for(lambda: is_ready(app.server.port))


def test_items_naming_a_hash_fail_only_themselves(redis_client, redis_url, run_exporter, caplog):
    now = time.time()
    rq_enqueue(redis_client, "good", now - 90)
    rq_enqueue(redis_client, "nohash", now)
    redis_client.delete(f"rq:job:{redis_client.lindex('rq:queue:nohash', 0).decode()}")
    rq_enqueue(redis_client, "wronghash", now)
    job = redis_client.lindex("rq:queue:wronghash", 0).decode()
    redis_client.delete(f"rq:job:{job}")
    redis_client.rpush(f"rq:job:{job}", "not a hash")
    redis_client.sadd("rq:queues", "rq:queue:binary")
    redis_client.rpush("rq:queue:binary", b"\xff\xfe not utf-8")

    with caplog.at_level(logging.WARNING, logger="exporter.sources.redis_keys.sampler"):
        app = run_exporter(_unhurried(), redis_url=redis_url, preset=["rq"])

        def three_cycles():
            # Errors are counted as a cycle meets them, before it is published: every reason
            # is waited for, or a scrape mid-cycle has the third of one and two of another.
            series = scrape_series(app)
            met = [_errors(series, reason) for reason in ("item_not_utf8", "wrong_type")]
            up = value(series, "queue_exporter_source_up", source="redis") == 1
            return series if up and min(met) >= 3 else None

        series = wait_for(three_cycles)

    for queue in ("good", "nohash", "wronghash", "binary"):
        assert value(series, "queue_depth", queue=queue, state="pending") == 1
    good_age = value(series, "queue_oldest_age_seconds", queue="good")
    assert good_age is not None and good_age >= 90
    for queue in ("nohash", "wronghash", "binary"):
        assert value(series, "queue_oldest_age_seconds", queue=queue) is None
    assert _errors(series, "time_missing") >= 1
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    assert _errors(series, "wrong_type") >= 3
    # each named once per group and reason, not once per cycle
    warnings = [r.getMessage() for r in caplog.records if "rq:queue:{queue}" in r.getMessage()]
    group = "key group 'rq:queue:{queue}' (system rq, list)"
    for key, reason, words in [
        ("rq:queue:binary", "item_not_utf8", "the head item names a hash but is not UTF-8"),
        (f"rq:job:{job}", "wrong_type", "holds another Redis type than the group's (a list)"),
    ]:
        assert [w for w in warnings if f"[{reason}]" in w] == [
            f"{group}: key {key!r}: {words} [{reason}]"
        ]


def test_a_queue_name_set_of_another_type_fails_only_its_groups(
    redis_client, redis_url, run_exporter
):
    now = time.time()
    redis_client.set("rq:queues", "not a set")
    redis_client.rpush("orchestrata:queue:billing:p1", json.dumps({"queued_at": iso(now)}))

    app = run_exporter(_unhurried(), redis_url=redis_url, preset=["rq", "orchestrata"])
    series = _published_with(app, "wrong_type")

    assert value(series, "queue_depth", queue="billing") == 1
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    assert not [
        labels
        for name, labels in series
        if not name.startswith("queue_exporter_") and ("system", "rq") in labels
    ]
    failed_groups = {
        dict(labels)["pattern"]
        for name, labels in series
        if name == "queue_exporter_source_errors_total" and ("reason", "wrong_type") in labels
    }
    rq_groups = {report.pattern for report in app.health.key_groups() if report.system == "rq"}
    assert failed_groups == rq_groups  # each of the preset's groups reads queue names from it
