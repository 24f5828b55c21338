"""The saq preset against real SAQ and its Worker: what SAQ says is what we serve.

Jobs are enqueued, scheduled (ahead and already due), completed, failed, retried an hour later
and kept active by SAQ itself (tests/saq_app); the truth is SAQ's own Queue.info() of each
queue (queued, active, scheduled) and the enqueue time of its oldest queued job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from typing import Any

import pytest

from tests.conftest import Series, stop_process, wait_for, wait_until_served_as_truth
from tests.saq_app.control import driver
from tests.saq_app.control import worker as start_worker

STATES = {"queued": "pending", "active": "active", "scheduled": "scheduled"}


@pytest.fixture
def saq_installed() -> None:
    if importlib.util.find_spec("saq") is None:
        message = "saq not installed (pyproject's dev extra has it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "saq") in labels
    }
    if served != set(truth["queues"]):
        found.append(f"queues {sorted(served)} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        for kind, state in STATES.items():
            depth = _value(series, "queue_depth", queue=queue, state=state)
            if depth != view[kind]:
                found.append(f"{queue} {state}: served {depth}, SAQ {view[kind]}")
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        oldest = view["oldest_ms"]
        if oldest is None:
            if age is not None:
                found.append(f"{queue}: age {age} served for no queued job")
            continue
        earliest, latest = (truth["now_ms"] - oldest) / 1000, (scraped_ms - oldest) / 1000
        if age is None or not earliest - 0.5 <= age <= latest + 0.5:
            found.append(f"{queue} age: served {age}, SAQ {earliest:.1f} to {latest:.1f}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "saq"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_and_age_as_saq_reports_them(saq_installed, redis_url, run_exporter):
    # a worker taking one job at a time: two complete, one fails, one fails and is retried
    # an hour later, then a long one stays active with three queued behind it; one job is
    # scheduled an hour ahead
    work = [
        {"queue": "work", "function": "succeed"},
        {"queue": "work", "function": "succeed"},
        {"queue": "work", "function": "fail"},
        {"queue": "work", "function": "fail", "retries": 2, "retry_delay": 3600},
        {"queue": "work", "function": "sleep_for", "kwargs": {"seconds": 600}, "timeout": 900},
        *({"queue": "work", "function": "succeed"} for _ in range(3)),
        {"queue": "work", "function": "succeed", "in": 3600},
    ]
    # no worker, found by its incomplete jobs: two queued, one scheduled already due
    idle = [
        {"queue": "idle", "function": "succeed"},
        {"queue": "idle", "function": "succeed"},
        {"queue": "idle", "function": "succeed", "in": -60},
    ]
    driver(redis_url, "enqueue", json.dumps(work + idle))
    worker, _ = start_worker(redis_url, "work")
    try:

        def settled() -> dict[str, Any] | None:
            truth = driver(redis_url, "truth", "default", "work", "idle")
            view = truth["queues"]["work"]
            counts = (view["queued"], view["active"], view["scheduled"])
            return truth if counts == (3, 1, 2) else None

        truth = wait_for(settled, timeout=60, interval=0.3)
        assert truth["queues"]["idle"]["scheduled"] == 1
        app = run_exporter(redis_url=redis_url, preset=["saq"])
        wait_until_served_as_truth(app, lambda s, at: _mismatches(s, truth, at * 1000))
    finally:
        stop_process(worker, signal.SIGTERM)
