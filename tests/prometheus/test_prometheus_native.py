"""The dashboards and recording rules against a real Prometheus, fed by real RQ and Celery
workers through the rq and celery presets alone (key groups and native readers): every query
by system returns series of both systems, except where NOT_FED says why a library cannot
feed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery_app.control import stop as stop_celery
from tests.conformance.adapters.rq import stop_rq_worker as stop_rq
from tests.conftest import wait_for
from tests.dashboard_queries import NotFed, not_fed_by_redis_alone, wait_until_fed
from tests.prometheus.test_prometheus_e2e import FAST_RULES, SCRAPE_JOB, Prometheus

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("rq", "celery")

BOTH = frozenset(SYSTEMS)
# Part of a query or recorded series -> the systems that cannot feed it, and why. The rest of
# the families (depth, started/completed/failed/retried/timed-out jobs, execution, wait and
# total times, workers) must show both.
NOT_FED: NotFed = {
    **not_fed_by_redis_alone(BOTH),
    "dead_letter": (BOTH, "no dead-letter queue: final failures are failed"),
    "requeued": (BOTH, "RQ never requeues; Celery only a rejected task"),
    "max_retries_exceeded": (BOTH, "a final failure is counted as failed"),
    "jobs_scheduled": (BOTH, "a scheduled job's creation is in no record the readers diff"),
    "dequeue_empty": (BOTH, "dequeue_empty events only"),
    "schedule_delay": (BOTH, "not in what the readers see"),
    "retry_delay": (BOTH, "not in what the readers see"),
    "backend_operation": (BOTH, "backend_op events only"),
    "reaper": (BOTH, "no reaper"),
    "scheduler_": (BOTH, "scheduler_cycle events only"),
    "idempotency": (BOTH, "no idempotency keys"),
    "job_attempts": (frozenset({"rq"}), "RQ keeps no attempt number"),
    "jobs_enqueued": (frozenset({"rq"}), "RQ keeps no record of an enqueue to diff"),
    "jobs_dequeued": (frozenset({"rq"}), "RQ keeps no record of a dequeue to diff"),
    "dequeue_attempts": (frozenset({"rq"}), "RQ keeps no record of a dequeue to diff"),
    "scheduled_due": (frozenset({"celery"}), "Celery's ETA tasks wait inside the workers"),
    "oldest_age": (
        frozenset({"celery"}),
        "kombu's envelope records no enqueue time; a running task's age only while one runs",
    ),
}


@pytest.fixture
def workers(redis_url: str) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url}
    python = Path(sys.executable)
    rq = subprocess.Popen(
        [python.parent / "rq", "worker", "--url", redis_url, "default"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    celery = subprocess.Popen(
        [python.parent / "celery", "-A", "tests.celery_app", "worker", "-E", "-c", "2"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield
    stop_rq(rq)
    stop_celery(celery)


def _produce(redis_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url}
    rq_plan = [
        *({"queue": "default", "call": "sleep_for", "seconds": 0.1} for _ in range(5)),
        {"queue": "default", "call": "fail_after", "seconds": 0},
        {"queue": "default", "call": "fail_after", "seconds": 1.0, "retries": 1},
        {"queue": "default", "call": "sleep_for", "seconds": 3, "timeout": 1},
        {"queue": "default", "call": "sleep_for", "seconds": 0.1, "in": 3600},
        {"queue": "unserved", "call": "sleep_for", "seconds": 0.1},  # waits: its age shows
    ]
    celery_plan = [
        *({"task": "sleep_for", "seconds": 0.1} for _ in range(5)),
        {"task": "fail_after", "seconds": 0},
        {"task": "retry_once", "seconds": 0.1},
        {"task": "sleep_for", "seconds": 3, "soft_time_limit": 1},
    ]
    for module, args in (
        ("tests.rq_app.driver", [redis_url, "enqueue", json.dumps(rq_plan)]),
        ("tests.celery_app.driver", ["publish", json.dumps(celery_plan)]),
    ):
        subprocess.run(
            [sys.executable, "-m", module, *args],
            env=env,
            check=True,
            timeout=60,
            capture_output=True,
        )


def test_rq_and_celery_dashboards_have_data(redis_url, run_exporter, workers, tmp_path):
    app = run_exporter({"presets": ["rq", "celery"], "sample_interval": 0.5}, redis_url=redis_url)
    wait_for(lambda: all(app.health.snapshot()[f"native:{s}"].up for s in SYSTEMS), timeout=30)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{app.server.port}"])
    try:
        wait_for(prometheus.ready, timeout=30)
        wait_for(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), timeout=60)
        _produce(redis_url)
        wait_until_fed(prometheus.query, FAST_RULES, SYSTEMS, NOT_FED)
        assert prometheus.query('queue_scheduled_due{system="rq"}')
    finally:
        prometheus.stop()
