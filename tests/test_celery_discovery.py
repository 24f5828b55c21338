"""Celery's queues found without being listed: kombu's bindings name every queue a producer or
worker declared. The truth is kombu's own count (`queue_declare(passive=True)`), by a real
Celery app whose `task_routes` send tasks to five queues, two of them with priority steps."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import scrape, scrape_series, total, wait_for

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv/bin/python"
# tasks per routed queue (tests/celery_app ROUTED_QUEUES), and which get priorities 0-9
TASKS = {"ingest": 3, "emails": 10, "reports": 1, "billing": 10, "thumbs": 2}
WITH_PRIORITIES = ("emails", "billing")


def _driver(redis_url: str, *args: str) -> object:
    import subprocess

    done = subprocess.run(
        [str(PYTHON), "-m", "tests.celery_app.driver", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url},
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def _publish_routed(redis_url: str) -> dict[str, int]:
    """Publish by task_routes (no queue named at the call); kombu's counts per queue."""
    plan = []
    for queue, count in TASKS.items():
        for number in range(count):
            step = {"task": f"to_{queue}", "seconds": 0}
            if queue in WITH_PRIORITIES:
                step["priority"] = number  # 0-9: every priority list of kombu's steps
            plan.append(step)
    _driver(redis_url, "publish", json.dumps(plan))
    truth = _driver(redis_url, "truth", *TASKS)  # also binds a reply queue (inspect): not a queue
    assert isinstance(truth, dict)
    return truth["waiting"]


def _pending(app) -> dict[str, float]:
    series = scrape_series(app)
    queues = {dict(labels)["queue"] for name, labels in series if name == "queue_depth"}
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


def test_every_routed_queue_is_found_without_params(redis_client, redis_url, run_exporter):
    waiting = _publish_routed(redis_url)
    assert waiting == TASKS  # nothing consumed them: kombu counts what was published
    priority_lists = [key for key in redis_client.keys("*\x06\x16*") if b"binding" not in key]
    assert {key.split(b"\x06\x16")[0].decode() for key in priority_lists} == set(WITH_PRIORITIES)
    app = run_exporter({"presets": ["celery"]}, redis_url=redis_url)
    pending = wait_for(lambda: found if set(found := _pending(app)) >= set(TASKS) else None)
    assert pending == waiting  # every queue, and no pidbox or event receiver queue beside them
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
