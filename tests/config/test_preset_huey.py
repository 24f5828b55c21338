"""The huey preset on an app's real Hueys: an instance found by its keys but left out of the
`names` param is named by check-config and on the status page; a PriorityRedisHuey's pending
tasks are split by priority, each with the age of its oldest."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.commands.test_check_config import run_cli
from tests.conformance.adapters.base import require
from tests.conformance.adapters.python_queues import HUEY_PYTHONS, Huey
from tests.conftest import scrape, scrape_when, value, wait_for

NOT_CONFIGURED = "found in Redis but not configured"


@pytest.fixture
def hueys(redis_url: str) -> dict[str, Any]:
    """`emails` and `reports` (RedisHuey), `vip` (PriorityRedisHuey), no consumer; vip's
    enqueue windows per priority."""
    python = require(HUEY_PYTHONS["3"], "huey", "huey3")
    Huey(python, redis_url, "emails").enqueue({"task": "succeed"}, {"task": "succeed"})
    Huey(python, redis_url, "reports").enqueue({"task": "succeed"})
    vip = Huey(python, redis_url, "vip", priority=True)
    first = vip.enqueue({"task": "succeed", "priority": 10})
    time.sleep(1.0)  # the second priority-10 task is a second younger than the first
    rest = vip.enqueue({"task": "succeed", "priority": 10}, {"task": "succeed"})
    return {"vip": vip.truth(), "windows": {"10": first[0], "0": rest[1]}}


def test_check_config_names_a_huey_found_but_not_in_names(redis_url, hueys):
    result = run_cli(
        "check-config", "--redis-url", redis_url, "--preset", "huey:names=emails", "--connect"
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert 'queue_depth{system="huey", queue="emails", priority="", state="pending"} 2' in out
    left_out = [line for line in out.splitlines() if NOT_CONFIGURED in line]
    assert left_out, out
    for line in left_out:
        assert line.startswith("WARNING: key group ")
        assert "reports" in line and "vip" in line and "emails" not in line.split(":", 2)[2]

    everything = run_cli("check-config", "--redis-url", redis_url, "--preset", "huey", "--connect")
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert NOT_CONFIGURED not in everything.stdout
    assert "(huey, list or zset)" in everything.stdout  # the pending group reads either type


def test_the_status_page_names_a_huey_left_out_and_priorities_are_split(
    redis_url, hueys, run_exporter
):
    app = run_exporter(
        {"presets": [{"name": "huey", "params": {"names": ["emails", "vip"]}}]},
        redis_url=redis_url,
    )
    series = scrape_when(app, "queue_depth", queue="vip", priority="10")

    def depth(queue: str, priority: str = "") -> float | None:
        return value(series, "queue_depth", queue=queue, priority=priority, state="pending")

    assert depth("emails") == 2 and depth("reports") is None
    assert hueys["vip"]["priorities"] == {"10": 2, "0": 1}  # Huey's own pending()
    assert (depth("vip", "10"), depth("vip", "0"), depth("vip")) == (2, 1, None)
    ages = {
        p: value(series, "queue_oldest_age_seconds", queue="vip", priority=p) for p in ["10", "0"]
    }
    assert None not in ages.values(), ages
    for priority, (before, _) in hueys["windows"].items():
        assert ages[priority] <= time.time() - before, (priority, ages)
    # priority 10's oldest is its first task, enqueued a second and more before priority 0's
    (_, first_after), (rest_before, _) = hueys["windows"]["10"], hueys["windows"]["0"]
    assert ages["10"] - ages["0"] >= rest_before - first_after - 0.001, ages
    assert value(series, "queue_oldest_age_seconds", queue="emails") is None  # lists: no time

    def left_out() -> list[dict[str, Any]] | None:
        status = json.loads(scrape(app.server.port, "/status.json"))
        return [group for group in status["key_groups"] if group["unselected"]] or None

    groups = wait_for(left_out)
    assert {group["pattern"] for group in groups} == {"huey.redis.{queue}", "huey.schedule.{queue}"}
    assert all(group["unselected"] == ["reports"] for group in groups)
    status = json.loads(scrape(app.server.port, "/status.json"))
    assert any("reports" in w and "not selected" in w for w in status["view"]["warnings"])


def test_a_huey_named_and_without_keys_reads_zero(redis_url, hueys, run_exporter):
    app = run_exporter(
        {"presets": [{"name": "huey", "params": {"names": ["*", "idle"]}}]}, redis_url=redis_url
    )
    series = scrape_when(app, "queue_depth", queue="idle", state="pending")
    assert value(series, "queue_depth", queue="idle", state="pending") == 0
    assert value(series, "queue_depth", queue="reports", state="pending") == 1


def test_no_other_key_is_taken_for_a_huey(redis_client, redis_url, hueys, run_exporter):
    """Huey's results hash and an app's own keys beside its queues are no instance."""
    redis_client.hset("huey.results.emails", "some-task-id", b"pickled")
    redis_client.rpush("huey.redisx", "not huey's")
    app = run_exporter({"presets": ["huey"]}, redis_url=redis_url)
    series = scrape_when(app, "queue_depth", queue="vip", priority="10")
    queues = {dict(labels)["queue"] for name, labels in series if name == "queue_depth"}
    assert queues == {"emails", "reports", "vip"}
