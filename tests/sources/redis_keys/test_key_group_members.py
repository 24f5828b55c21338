"""What a key group tells from its members' own keys. marker: members a key of their own
marks count in another state (arq's running jobs stay in the queue's zset, marked by an
arq:in-progress:<id> key), checked for the first max_items members only, the rest counted in
the group's state and named. look_alikes: keys its values leave out whose first member names
a key of the system (arq's arq:job:<id>) are named, never counted. Bad settings are refused."""

from __future__ import annotations

import time

import pytest

from exporter.config import settings as config_module
from exporter.config.settings import ConfigError
from tests.conftest import scrape_when, value

RUNNING = {
    "system": "custom",
    "pattern": "jobs:{queue}",
    "type": "zset",
    "state": "pending",
    "values": {"queue": ["mail", "idle"]},
    "scores": {"window": "due", "unit": "s"},
    "oldest": {"end": "head", "time_in": "score", "format": "epoch_s"},
    "marker": {"key": "running:{queue}:{item}", "state": "active"},
}


def _errors(series, pattern: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: count
        for (name, labels), count in series.items()
        if name == "queue_exporter_source_errors_total" and ("pattern", pattern) in labels
    }


def test_marked_members_are_active_and_the_oldest_is_the_first_unmarked(
    redis_client, redis_url, run_exporter
):
    now = time.time()
    redis_client.zadd(
        "jobs:mail",
        {"a": now - 300, "b": now - 200, "c": now - 100, "d": now - 50, "later": now + 100},
    )
    for member in ("a", "c", "later"):  # `later` is not due: outside the group's window
        redis_client.set(f"running:mail:{member}", 1)
    redis_client.set("running:idle:b", 1)  # another queue's marker: not mail's b
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [RUNNING]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="mail", state="active")

    def depth(queue, state):
        return value(series, "queue_depth", system="custom", queue=queue, state=state)

    assert (depth("mail", "pending"), depth("mail", "active")) == (2, 2)
    assert (depth("idle", "pending"), depth("idle", "active")) == (0, 0)  # listed, no key
    age = value(series, "queue_oldest_age_seconds", queue="mail", state="pending")
    assert age is not None and 200 <= age < 260  # b's: a, marked, is running
    assert value(series, "queue_oldest_age_seconds", queue="mail", state="active") is None
    assert _errors(series, "jobs:{queue}") == {}


def test_members_beyond_max_items_count_in_the_groups_state_and_are_named(
    redis_client, redis_url, run_exporter
):
    redis_client.rpush("work", "x", "y", "z")
    for member in ("x", "z"):  # z lies beyond max_items: not checked
        redis_client.set(f"busy:{member}", 1)
    group = {
        "system": "custom",
        "pattern": "work",
        "labels": {"queue": "work"},
        "type": "list",
        "state": "pending",
        "marker": {"key": "busy:{item}", "state": "active", "max_items": 2},
    }
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [group]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="work", state="active")
    assert value(series, "queue_depth", queue="work", state="active") == 1
    assert value(series, "queue_depth", queue="work", state="pending") == 2
    assert _errors(series, "work").get("items_unchecked", 0) >= 1
    report = next(r for r in app.health.key_groups() if r.pattern == "work")
    assert report.errors.get("items_unchecked", 0) >= 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "hash", "scores": None, "oldest": None}, "marker applies to list and zset"),
        ({"marker": {"key": "running:{queue}", "state": "active"}}, "must contain {item}"),
        ({"marker": {"key": "run:{x}:{item}", "state": "active"}}, "{x} is not a placeholder"),
        ({"marker": {"key": "run:{item}", "state": "pending"}}, "the group's own state"),
        ({"scores": None, "oldest": {"end": "tail", "time_in": "score"}}, "from the head's"),
    ],
)
def test_bad_marker_settings_are_refused_with_their_place(change, message):
    group = {**RUNNING, **change}
    raw = {"sources": {"redis": {"url": "redis://localhost", "key_groups": [group]}}}
    with pytest.raises(ConfigError) as error:
        config_module.from_dict(raw)
    assert "sources.redis.key_groups[0]" in str(error.value)
    assert message in str(error.value)


LISTED = {
    "system": "custom",
    "pattern": "q:{queue}",
    "type": "zset",
    "state": "pending",
    "values": {"queue": ["listed"]},
    "look_alikes": {"member_key": "job:{member}", "exclude": ["q:abort"], "max_keys": 2},
}


def test_look_alikes_are_named_not_counted_and_those_unchecked_counted(
    redis_client, redis_url, run_exporter
):
    for key, member in (("listed", "a"), ("other", "b"), ("abort", "c"), ("plain", "d")):
        redis_client.zadd(f"q:{key}", {member: 1})
    redis_client.rpush("q:alist", "a")  # another type: not looked at (SCAN ... TYPE zset)
    for member in ("a", "b", "c"):  # d names no job key: not a look-alike
        redis_client.set(f"job:{member}", 1)
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [LISTED]}}})
    series = scrape_when(app, "queue_depth", system="custom", queue="listed")
    assert value(series, "queue_depth", queue="other") is None
    report = next(r for r in app.health.key_groups() if r.pattern == "q:{queue}")
    assert report.errors.get("unlisted_queue") == 1
    assert ("unlisted_queue", "q:other") in report.failed_keys
    assert "look_alikes_unchecked" not in report.errors  # other and plain: max_keys 2

    redis_client.zadd("q:more", {"b": 1})  # a third key left out: beyond max_keys
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [LISTED]}}})
    scrape_when(app, "queue_depth", system="custom", queue="listed")
    report = next(r for r in app.health.key_groups() if r.pattern == "q:{queue}")
    assert report.errors.get("look_alikes_unchecked") == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"values": {}}, "look_alikes applies to list and zset keys built from values"),
        ({"look_alikes": {"member_key": "job:{item}"}}, "exactly one {member}"),
    ],
)
def test_bad_look_alikes_settings_are_refused(change, message):
    group = {**LISTED, **change}
    raw = {"sources": {"redis": {"url": "redis://localhost", "key_groups": [group]}}}
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        config_module.from_dict(raw)
