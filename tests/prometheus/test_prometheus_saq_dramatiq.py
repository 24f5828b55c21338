"""The dashboards and recording rules against a real Prometheus, fed by real SAQ and Dramatiq
workers through the saq and dramatiq presets alone (key groups and SAQ's native reader, its
runtimes from SAQ's finished jobs included):
every query by system returns series of both systems, except where NOT_FED says why a library
cannot feed it; and the totals Prometheus holds for SAQ equal what SAQ's workers counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import stop_process, wait_for
from tests.dashboard_queries import NotFed, not_fed_by_redis_alone, wait_until_fed
from tests.prometheus.test_prometheus_e2e import FAST_RULES, SCRAPE_JOB, Prometheus
from tests.saq_app.control import driver as saq_driver
from tests.saq_app.control import worker as saq_worker

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("saq", "dramatiq")
BOTH = frozenset(SYSTEMS)
SAQ = frozenset({"saq"})
DRAMATIQ = frozenset({"dramatiq"})
NOT_FED: NotFed = {
    **not_fed_by_redis_alone(BOTH),
    # counters and runtimes: SAQ's workers count completions, failures and retries; Dramatiq
    # keeps no count in Redis (its Prometheus middleware serves them from each worker)
    "jobs_enqueued": (BOTH, "neither keeps a count of enqueues"),
    "jobs_started": (BOTH, "neither keeps a count of starts"),
    "dequeue": (BOTH, "neither records a dequeue apart from a start"),
    "timed_out": (BOTH, "no timeout count"),
    "dead_lettered": (BOTH, "no count of dead letters (Dramatiq's are its depth)"),
    "requeued": (BOTH, "no count of requeues"),
    "max_retries_exceeded": (BOTH, "a final failure is counted as failed"),
    "jobs_scheduled": (BOTH, "no count of scheduled jobs"),
    "execution_seconds": (DRAMATIQ, "Dramatiq keeps no runtime per job in Redis"),
    "wait_seconds": (DRAMATIQ, "Dramatiq keeps no start time per job in Redis"),
    "total_seconds": (BOTH, "SAQ's retries reset the start; Dramatiq keeps no end time"),
    "delay_seconds": (BOTH, "no retry or schedule delay per job is kept once it ran"),
    "stats_age_seconds": (BOTH, "Attune's statistics table"),
    "job_attempts": (BOTH, "no attempts per finished job"),
    "worker": (BOTH, "no busy/idle per worker (Dramatiq's heartbeats count producers too)"),
    "backend_operation": (BOTH, "backend_op events only"),
    "reaper": (BOTH, "no reaper"),
    "scheduler_": (BOTH, "scheduler_cycle events only"),
    "idempotency": (BOTH, "no idempotency keys"),
    "scheduled_due": (BOTH, "the presets count no due jobs (SAQ's schedule is positive scores)"),
    "completed": (DRAMATIQ, "Dramatiq keeps no count of completions in Redis"),
    "failed": (DRAMATIQ, "Dramatiq keeps no count of failures in Redis"),
    "retried": (DRAMATIQ, "Dramatiq keeps no count of retries in Redis"),
    "jobs_retry": (DRAMATIQ, "Dramatiq keeps no count of retries in Redis"),
    "jobs_finished": (DRAMATIQ, "Dramatiq keeps no count of finished jobs in Redis"),
    "jobs_failure": (DRAMATIQ, "Dramatiq keeps no count of failures in Redis"),
    'state="dead_letter"': (SAQ, "SAQ's final failures are finished jobs"),
    "dead_letter_depth": (SAQ, "SAQ's final failures are finished jobs"),
}


def _dramatiq_env(redis_url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url}


@pytest.fixture
def workers(redis_url: str) -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for process in started:
        stop_process(process, signal.SIGTERM, timeout=5)


def _produce(redis_url: str, started: list[Any]) -> None:
    """SAQ: jobs of ~0.15 s one at a time, failures for good early and late (the failure
    counter grows while Prometheus watches), one retried in an hour, a queue nobody serves.
    Dramatiq: the same kinds (its failures dead-lettered), a delayed message and a queue
    nobody serves; one long message keeps its worker busy."""
    slow = {"queue": "work", "function": "sleep_for", "kwargs": {"seconds": 0.15}}
    doomed = {"queue": "work", "function": "fail"}
    saq_plan = [
        *([doomed] * 3),
        *([slow] * 30),
        {"queue": "work", "function": "fail", "retries": 2, "retry_delay": 3600},
        *([doomed] * 3),
        *([slow] * 30),
        {"queue": "unserved", "function": "succeed"},
    ]
    saq_driver(redis_url, "enqueue", json.dumps(saq_plan))
    process, _ = saq_worker(redis_url, "work")
    started.append(process)
    dramatiq_plan = [
        *({"actor": "fail"} for _ in range(3)),
        *({"actor": "succeed"} for _ in range(20)),
        {"actor": "fail_then_retry"},
        {"actor": "succeed", "delay": 3_600_000},
        {"actor": "sleep_for", "args": [600]},
        *({"actor": "succeed", "age": 30} for _ in range(3)),
        {"actor": "report", "age": 60},
    ]
    subprocess.run(
        [sys.executable, "-m", "tests.dramatiq_app.driver", "enqueue", json.dumps(dramatiq_plan)],
        env=_dramatiq_env(redis_url),
        check=True,
        timeout=60,
        capture_output=True,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.dramatiq_app.worker"],
        env={
            **_dramatiq_env(redis_url),
            "DRAMATIQ_QUEUES": "default",
            "dramatiq_queue_prefetch": "1",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    started.append(worker)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"


def test_saq_and_dramatiq_dashboards_have_data(workers, redis_url, run_exporter, tmp_path):
    app = run_exporter(
        {
            "presets": [{"name": "saq", "params": {"queues": ["work"]}}, "dramatiq"],
            "sample_interval": 0.5,
        },
        redis_url=redis_url,
    )
    wait_for(lambda: app.health.snapshot()["native:saq"].up, timeout=30)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{app.server.port}"])
    try:
        wait_for(prometheus.ready, timeout=30)
        wait_for(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), timeout=60)
        _produce(redis_url, workers)
        wait_until_fed(prometheus.query, FAST_RULES, SYSTEMS, NOT_FED)
        _saq_totals_are_saqs(prometheus, redis_url)
    finally:
        prometheus.stop()


def _saq_totals_are_saqs(prometheus: Prometheus, redis_url: str) -> None:
    def drained() -> dict[str, int] | None:
        workers = saq_driver(redis_url, "truth", "work")["queues"]["work"]["workers"]
        stats = next(iter(workers.values()), None)
        return stats if stats and stats["complete"] + stats["failed"] == 66 else None

    stats = wait_for(drained, timeout=90, interval=0.5)

    def total(metric: str, **labels: str) -> float:
        matchers = ",".join(f'{k}="{v}"' for k, v in {"system": "saq", **labels}.items())
        result = prometheus.query(f"sum(max_over_time({metric}{{{matchers}}}[10m]))")
        return float(result[0]["value"][1]) if result else 0.0

    expected = {
        "completed": float(stats["complete"]),
        "failed": float(stats["failed"]),
        "retried": float(stats["retried"]),
    }
    got: dict[str, float] = {}

    def equal() -> bool:
        got["completed"] = total("queue_jobs_completed_total")
        got["failed"] = total("queue_jobs_failed_total", error_type="non_retryable")
        got["retried"] = total("queue_jobs_retried_total")
        return got == expected

    try:
        wait_for(equal, timeout=30)
    except AssertionError:
        raise AssertionError(f"Prometheus holds {got}, SAQ says {expected}") from None
