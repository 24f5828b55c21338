"""split_by and values_from_keys on data no library would write: what cannot be attributed is
counted under __unread__ and named, never dropped; bad settings are refused with their place."""

from __future__ import annotations

import json
import time

import pytest

from exporter.config import settings as config_module
from exporter.config.settings import ConfigError
from tests.conftest import scrape_when, value

SPLIT_RETRY = {
    "system": "custom",
    "pattern": "retry",
    "type": "zset",
    "state": "retry",
    "split_by": {"label": "queue", "field": "queue", "max_items": 4},
    "due": {"metric": "queue_scheduled_due", "unit": "s"},
    "oldest": {"end": "head", "time_in": "score", "format": "epoch_s"},
}


def test_unreadable_and_unread_items_count_under_unread(redis_client, redis_url, run_exporter):
    now = time.time()
    members = {
        json.dumps({"queue": "mail"}): now - 200,
        json.dumps({"queue": "mail", "n": 2}): now + 100,
        json.dumps({"queue": "bills"}): now - 50,
        "not json at all": now - 10,
        json.dumps({"queue": "late"}): now + 500,  # beyond max_items (4): read as depth only
        json.dumps({"queue": "later"}): now + 600,
    }
    redis_client.zadd("retry", members)
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [SPLIT_RETRY]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="__unread__")

    def depth(queue):
        return value(series, "queue_depth", system="custom", queue=queue, state="retry")

    assert (depth("mail"), depth("bills"), depth("__unread__")) == (2, 1, 3)
    assert depth("late") is None
    assert value(series, "queue_scheduled_due", system="custom", queue="mail") == 1
    assert value(series, "queue_scheduled_due", system="custom", queue="bills") == 1
    age = value(series, "queue_oldest_age_seconds", system="custom", queue="mail")
    assert age is not None and 200 <= age < 230
    errors = {
        dict(labels)["reason"]: count
        for (name, labels), count in series.items()
        if name == "queue_exporter_source_errors_total" and ("pattern", "retry") in labels
    }
    assert errors.get("label_unreadable", 0) >= 1 and errors.get("items_unread", 0) >= 1


def test_a_split_hash_serves_its_earliest_time_each_refused_alone(
    redis_client, redis_url, run_exporter
):
    """Hash values have no order (Sidekiq's work hashes): each value's time is read and the
    earliest served per label value; a time before 1970 or unreadable costs only that value."""
    now = time.time()
    work = {
        "t1": {"queue": "mail", "run_at": int(now - 100)},
        "t2": {"queue": "mail", "run_at": int(now - 40)},
        "t3": {"queue": "bills", "run_at": int(now - 30)},
        "t4": {"queue": "bills", "run_at": -5},  # before 1970: refused, bills keeps t3's age
        "t5": {"queue": "sms", "run_at": "soon"},  # no time: sms has depth, no age
    }
    redis_client.hset("proc:work", mapping={k: json.dumps(v) for k, v in work.items()})
    group = {
        "system": "custom",
        "pattern": "proc:work",
        "type": "hash",
        "state": "active",
        "split_by": {"label": "queue", "field": "queue"},
        "oldest": {"end": "earliest", "time_in": "json", "field": "run_at", "format": "epoch_s"},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="sms")

    def age(queue):
        return value(series, "queue_oldest_age_seconds", system="custom", queue=queue)

    assert value(series, "queue_depth", system="custom", queue="mail", state="active") == 2
    assert value(series, "queue_depth", system="custom", queue="bills", state="active") == 2
    assert 100 <= age("mail") < 130 and 30 <= age("bills") < 60
    assert age("sms") is None
    errors = {
        dict(labels)["reason"]: count
        for (name, labels), count in series.items()
        if name == "queue_exporter_source_errors_total" and ("pattern", "proc:work") in labels
    }
    assert errors.get("time_out_of_range", 0) >= 1, errors
    assert sum(errors.values()) >= 2, errors  # and the unreadable time


def test_select_narrows_the_split_values_and_names_what_it_leaves_out(
    redis_client, redis_url, run_exporter
):
    """select: {queue: [mail, "b*", extra]}: mail and bills counted (a name, a glob), extra
    read 0 (named, found nowhere), sms's items not counted and reported once a cycle."""
    now = time.time()
    queues = ["mail", "mail", "bills", "sms", "sms"]
    members = {json.dumps({"queue": q, "n": n}): now - 10 * n for n, q in enumerate(queues)}
    redis_client.zadd("retry", members)
    group = {
        **SPLIT_RETRY,
        "split_by": {"label": "queue", "field": "queue"},
        "select": {"queue": ["mail", "b*", "extra"]},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="extra")
    served = {
        dict(labels)["queue"]: count
        for (name, labels), count in series.items()
        if name == "queue_depth" and ("system", "custom") in labels
    }
    assert served == {"mail": queues.count("mail"), "bills": 1, "extra": 0}
    assert value(series, "queue_scheduled_due", system="custom", queue="extra") == 0
    assert value(series, "queue_oldest_age_seconds", system="custom", queue="sms") is None
    report = next(r for r in app.health.key_groups() if r.pattern == "retry")
    assert report.unselected == ("sms",)


def test_queues_from_keys_read_zero_once_their_jobs_are_gone(redis_client, redis_url, run_exporter):
    redis_client.hset("jobs:mail:meta", "created", "1")
    redis_client.hset("jobs:bills:meta", "created", "1")
    redis_client.rpush("jobs:bills:wait", "1", "2")
    group = {
        "system": "custom",
        "pattern": "jobs:{queue}:wait",
        "type": "list",
        "state": "pending",
        "values_from_keys": {"queue": "jobs:{value}:meta"},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="mail")
    assert value(series, "queue_depth", system="custom", queue="mail") == 0
    assert value(series, "queue_depth", system="custom", queue="bills") == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "set", "due": None, "oldest": None}, "split_by applies to list, zset and hash"),
        ({"labels": {"queue": "all"}}, "split_by: 'queue' is already a pattern placeholder"),
        ({"values_from_keys": {"queue": "x"}}, "values: {queue} is not a placeholder"),
        ({"select": {"priority": ["1"]}}, "select: {priority} takes no values from a set, keys"),
        (  # the earliest of a key's items is read on its own, not with a due count
            {"split_by": None, "oldest": {"end": "earliest", "time_in": "score"}},
            "oldest.end: earliest excludes due",
        ),
        (  # a hash's values have no order: only the earliest of them is a truth
            {"type": "hash", "due": None, "oldest": {"time_in": "json", "field": "at"}},
            "oldest.time_in: json does not apply to hash keys",
        ),
    ],
)
@pytest.mark.fast
def test_bad_split_settings_are_refused_with_their_place(change, message):
    group = {**SPLIT_RETRY, **change}
    raw = {"sources": {"redis": {"url": "redis://localhost", "key_groups": [group]}}}
    with pytest.raises(ConfigError) as error:
        config_module.from_dict(raw)
    assert "sources.redis.key_groups[0]" in str(error.value)
    assert message in str(error.value)


def test_queues_from_keys_with_wildcards(redis_client, redis_url, run_exporter):
    """{_name} parts of a values_from_keys pattern match anything (django-q2's cluster keys,
    one per live cluster of a queue): each key names its queue once, however many."""
    redis_client.set("jobs:mail:cluster:a1", "x")
    redis_client.set("jobs:mail:cluster:b2", "x")
    redis_client.set("jobs:bills:cluster:c3", "x")
    redis_client.rpush("jobs:bills:wait", "1")
    group = {
        "system": "custom",
        "pattern": "jobs:{queue}:wait",
        "type": "list",
        "state": "pending",
        "values_from_keys": {"queue": "jobs:{value}:cluster:{_cluster}"},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="mail")
    assert value(series, "queue_depth", system="custom", queue="mail") == 0
    assert value(series, "queue_depth", system="custom", queue="bills") == 1
    queues = {dict(labels)["queue"] for name, labels in series if name == "queue_depth"}
    assert queues == {"mail", "bills"}


@pytest.mark.parametrize("keys", ["jobs:meta", "jobs:{value}:{other}", "{value}:{value}"])
@pytest.mark.fast
def test_values_from_keys_needs_one_value_placeholder(keys):
    group = {
        "system": "custom",
        "pattern": "jobs:{queue}:wait",
        "type": "list",
        "state": "pending",
        "values_from_keys": {"queue": keys},
    }
    raw = {"sources": {"redis": {"url": "redis://localhost", "key_groups": [group]}}}
    with pytest.raises(ConfigError, match=r"values_from_keys.queue: the pattern needs exactly"):
        config_module.from_dict(raw)
