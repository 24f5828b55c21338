"""The dashboards and recording rules against a real Prometheus, fed by real BullMQ 6 and
Sidekiq workers through the bullmq and sidekiq presets alone (key groups and native readers):
every query by system returns series of both systems, except where NOT_FED says why a library
cannot feed it; the execution-time quantile holds the jobs' real runtime; and the totals
Prometheus holds equal what the libraries counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from exporter.runtime.app import App
from tests.conftest import wait_for
from tests.dashboard_queries import NotFed, not_fed_by_redis_alone, wait_until_fed
from tests.prometheus.test_prometheus_e2e import FAST_RULES, SCRAPE_JOB, Prometheus
from tests.real_queues import BullMQ, Sidekiq

SYSTEMS = ("bullmq", "sidekiq")
BOTH = frozenset(SYSTEMS)
BULLMQ = frozenset({"bullmq"})
SIDEKIQ = frozenset({"sidekiq"})
NOT_FED: NotFed = {
    **not_fed_by_redis_alone(BOTH),
    "dequeue": (BOTH, "neither records a dequeue apart from a start"),
    "timed_out": (BOTH, "neither has a job timeout of its own"),
    "dead_lettered": (
        BOTH,
        "BullMQ's final failures are failed; Sidekiq's counters carry no class",
    ),
    "requeued": (BOTH, "only a stalled or rate-limited BullMQ job, not made here"),
    "backend_operation": (BOTH, "backend_op events only"),
    "reaper": (BOTH, "no reaper"),
    "scheduler_": (BOTH, "scheduler_cycle events only"),
    "idempotency": (BOTH, "no idempotency keys"),
    'state="dead_letter"': (BULLMQ, "BullMQ's final failures are failed"),
    "dead_letter_depth": (BULLMQ, "BullMQ's final failures are failed"),
    "worker": (BULLMQ, "BullMQ keeps no worker records in Redis"),
    # Sidekiq 6 keeps counters of processed and failed jobs, not a record per job
    "jobs_enqueued": (SIDEKIQ, "Sidekiq keeps no count of enqueues"),
    "jobs_started": (SIDEKIQ, "Sidekiq keeps no count of starts"),
    "retried": (SIDEKIQ, "Sidekiq's counters do not tell a retry"),
    "jobs_retry": (SIDEKIQ, "Sidekiq's counters do not tell a retry"),
    "max_retries_exceeded": (SIDEKIQ, "Sidekiq's counters do not tell a retry"),
    "jobs_scheduled": (SIDEKIQ, "Sidekiq keeps no count of scheduled jobs"),
    "_seconds": (SIDEKIQ, "Sidekiq 6 records no runtime or wait per job"),
    "job_attempts": (SIDEKIQ, "Sidekiq 6 records no attempts per finished job"),
}
JOBS = 60 + 6  # per system: slow ones and failures for good, below


@pytest.fixture
def workers(redis_db: int) -> Iterator[tuple[BullMQ, Sidekiq]]:
    bullmq, sidekiq = BullMQ(6, redis_db), Sidekiq(redis_db)
    yield bullmq, sidekiq
    bullmq.stop_all()
    sidekiq.stop_all()


def _produce(bullmq: BullMQ, sidekiq: Sidekiq) -> None:
    """Jobs of ~0.15 s, two at a time, with failures for good early and late (so the failure
    counters grow while Prometheus watches: a series born at its final value shows no rate);
    a retried job, a delayed one, one busy till the end, and a queue nobody serves (its age
    shows)."""
    slow, doomed = {"sleep_ms": 150}, {"fail": "always"}
    bullmq.steps(
        *(
            {"op": "add", "queue": "mail", "count": count, "data": data}
            for count, data in ((3, doomed), (30, slow), (3, doomed), (30, slow))
        ),
        {
            "op": "add",
            "queue": "mail",
            "data": {"fail": 1},
            "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 200}},
        },
        {"op": "add", "queue": "mail", "opts": {"delay": 3_600_000}},
        {"op": "add", "queue": "unserved"},
    )
    bullmq.worker("mail", concurrency=2)
    # Sidekiq flushes its counters every 5 s: work for several flushes
    sidekiq.push(
        *(
            {"queue": "default", "count": count, "class": job, "args": args}
            for count, job, args in (
                (3, "DoomedJob", [0, "always"]),
                (40, "PlannedJob", [150]),
                (3, "DoomedJob", [0, "always"]),
                (20, "PlannedJob", [150]),
            )
        ),
        {"queue": "default", "class": "PatientJob", "args": [0, "always"]},  # stays in retry
        {"queue": "default", "args": [600_000]},  # busy till the end: the active depth shows
        {"queue": "default", "in": 600},
        {"queue": "unserved"},
    )
    sidekiq.worker(["default"], concurrency=3)


def test_bullmq_and_sidekiq_dashboards_have_data(workers, redis_url, run_exporter, tmp_path):
    bullmq, sidekiq = workers
    app: App = run_exporter({"presets": list(SYSTEMS), "sample_interval": 0.5}, redis_url=redis_url)
    wait_for(lambda: all(app.health.snapshot()[f"native:{s}"].up for s in SYSTEMS), timeout=30)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{app.server.port}"])
    try:
        wait_for(prometheus.ready, timeout=30)
        wait_for(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), timeout=60)
        _produce(bullmq, sidekiq)
        wait_until_fed(prometheus.query, FAST_RULES, SYSTEMS, NOT_FED)

        p50 = prometheus.query(
            "max_over_time(queue_job_type:queue_job_execution_seconds:histogram_quantile"
            '{system="bullmq", queue="mail", quantile="0.5"}[10m])'
        )
        assert p50 and 0.1 <= float(p50[0]["value"][1]) <= 0.25  # the 0.15 s jobs' bucket
        _totals_are_the_libraries(prometheus, bullmq, sidekiq)
    finally:
        prometheus.stop()


def _totals_are_the_libraries(prometheus: Prometheus, bullmq: BullMQ, sidekiq: Sidekiq) -> None:
    def bullmq_drained() -> dict[str, int] | None:
        counts: dict[str, int] = bullmq.truth(["mail"])["queues"]["mail"]["counts"]
        return counts if counts["completed"] + counts["failed"] == JOBS + 1 else None

    counts = wait_for(bullmq_drained, timeout=90)

    def sidekiq_drained() -> dict[str, Any] | None:
        stats: dict[str, Any] = sidekiq.truth()
        return stats if stats["processed"] == JOBS + 1 else None  # the retried job's first run

    stats = wait_for(sidekiq_drained, timeout=90)

    def total(metric: str, system: str) -> float:
        result = prometheus.query(f'sum(max_over_time({metric}{{system="{system}"}}[10m]))')
        return float(result[0]["value"][1]) if result else 0.0

    expected = {
        ("queue_jobs_completed_total", "bullmq"): counts["completed"],
        ("queue_jobs_failed_total", "bullmq"): counts["failed"] + 1,  # + the retried attempt
        ("queue_jobs_completed_total", "sidekiq"): stats["processed"] - stats["failed"],
        ("queue_jobs_failed_total", "sidekiq"): stats["failed"],
    }
    got: dict[tuple[str, str], float] = {}

    def equal() -> bool:
        got.update({key: total(*key) for key in expected})
        return got == expected

    try:
        wait_for(equal, timeout=30)
    except AssertionError:
        raise AssertionError(f"Prometheus holds {got}, the libraries say {expected}") from None
