"""Celery's queues found without being listed: kombu's bindings name every queue a producer or
worker declared. The truth is kombu's own count (`queue_declare(passive=True)`), by a real
Celery app whose `task_routes` send tasks to five queues, two of them with priority steps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.celery_app import control
from tests.conftest import scrape, scrape_series, total, wait_for

# tasks per routed queue (tests/celery_app ROUTED_QUEUES), and which get priorities 0-9
TASKS = {"ingest": 3, "emails": 10, "reports": 1, "billing": 10, "thumbs": 2}
WITH_PRIORITIES = ("emails", "billing")


def _driver(redis_url: str, *args: str, transport: dict[str, str] | None = None) -> Any:
    """The driver against `redis_url`; `transport`: QE_CELERY_SEP / QE_CELERY_STEPS."""
    return control.driver({**control.env(redis_url), **(transport or {})}, *args)


def _publish_routed(redis_url: str, transport: dict[str, str] | None = None) -> dict[str, int]:
    """Publish by task_routes (no queue named at the call); kombu's counts per queue."""
    plan = []
    for queue, count in TASKS.items():
        for number in range(count):
            step = {"task": f"to_{queue}", "seconds": 0}
            if queue in WITH_PRIORITIES:
                step["priority"] = number  # 0-9: every priority list of kombu's steps
            plan.append(step)
    _driver(redis_url, "publish", json.dumps(plan), transport=transport)
    # also binds a reply queue (inspect): not a queue
    truth = _driver(redis_url, "truth", *TASKS, transport=transport)
    assert isinstance(truth, dict)
    return truth["waiting"]


def _pending(app) -> dict[str, float]:
    """Each queue's pending depth, of the queues the key sampler served (the native reader's
    active series name queues too, and are there while a sampling cycle's are withdrawn)."""
    series = scrape_series(app)
    queues = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and dict(labels)["state"] == "pending"
    }
    return {
        queue: total(series, "queue_depth", system="celery", queue=queue, state="pending")
        for queue in queues
    }


def _active(app) -> dict[str, float]:
    series = scrape_series(app)
    return {
        dict(labels)["queue"]: value
        for (name, labels), value in series.items()
        if name == "queue_depth" and dict(labels)["state"] == "active"
    }


@pytest.mark.parametrize("sep", ["\x06\x16", ":"], ids=["ten-steps", "colon-sep-ten-steps"])
def test_every_routed_queue_is_found_without_params(sep, redis_client, redis_url, run_exporter):
    """The range(10) Celery's docs recommend for Redis, with either separator: every priority
    list of every queue counted, with the preset's default steps (the separator is the
    transport's option: the sep param names it). (kombu's default steps with its default
    separator are tests/conformance's: adapters/celery.py.)"""
    transport = {"QE_CELERY_SEP": sep, "QE_CELERY_STEPS": "0,1,2,3,4,5,6,7,8,9"}
    waiting = _publish_routed(redis_url, transport)
    assert waiting == TASKS  # nothing consumed them: kombu counts what was published
    keys = redis_client.keys(f"*{sep}*")  # the test's own marker key too, with ":"
    lists = [key for key in keys if key.split(sep.encode())[0].decode() in TASKS]
    assert {key.split(sep.encode())[0].decode() for key in lists} == set(WITH_PRIORITIES)
    step_lists = {key.split(sep.encode())[1] for key in lists}
    assert len(step_lists) == 9  # priorities 0-9: one list per step above 0
    preset = {"name": "celery", **({"params": {"sep": sep}} if sep != "\x06\x16" else {})}
    app = run_exporter({"presets": [preset]}, redis_url=redis_url)
    pending = wait_for(lambda: found if set(found := _pending(app)) >= set(TASKS) else None)
    assert pending == waiting  # every queue, and no pidbox or event receiver queue beside them
    # the pattern label as a person reads and types it: the separator escaped, no raw bytes
    patterns = {
        dict(labels)["pattern"]
        for name, labels in scrape_series(app)
        if name == "queue_exporter_keys_matched"
    }
    shown = "\\x06\\x16" if sep == "\x06\x16" else sep
    assert patterns == {"{queue}", f"{{queue}}{shown}{{_step}}"}
    assert all(pattern.isprintable() for pattern in patterns)
    # No task ran: the reader finds the same queues in the bindings, each reading active 0.
    active = wait_for(lambda: found if set(found := _active(app)) >= set(TASKS) else None)
    assert {queue: active[queue] for queue in TASKS} == dict.fromkeys(TASKS, 0.0)


def test_a_queues_param_narrows_and_adds_and_what_it_leaves_out_is_reported(
    redis_url, run_exporter
):
    waiting = _publish_routed(redis_url)
    app = run_exporter(
        {"presets": [{"name": "celery", "params": {"queues": ["ingest", "e*", "extra"]}}]},
        redis_url=redis_url,
    )
    expected = {"ingest": waiting["ingest"], "emails": waiting["emails"], "extra": 0}
    wait_for(lambda: _pending(app) == expected)

    def reported() -> list[dict] | None:
        status = json.loads(scrape(app.server.port, "/status.json"))
        groups = [group for group in status["key_groups"] if group["unselected"]]
        return groups or None

    groups = reported() or wait_for(reported)
    left_out = {"reports", "billing", "thumbs"}
    assert all(set(group["unselected"]) == left_out for group in groups)
    status = json.loads(scrape(app.server.port, "/status.json"))
    warnings = status["view"]["warnings"]
    assert any("billing" in warning and "not selected" in warning for warning in warnings)
