"""The Bull native reader against real Bull 3.x and 4.x processors: every job Bull itself
keeps as finished (getCompleted, getFailed: finishedOn, processedOn, attemptsMade,
failedReason) after the exporter's first read is served once, as throughput, failures by
type, retries, attempts and execution times; what finished before is not, nor again by an
exporter started anew.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests import claims
from tests.conftest import REDIS_HOST, REDIS_PORT, Series, scrape_series, total, value, wait_for
from tests.real_queues import BULL_MAJORS, Bull

QUEUE = "work"


@pytest.fixture(params=BULL_MAJORS, ids=lambda major: f"bull{major}")
def bull(request: pytest.FixtureRequest, redis_db: int) -> Iterator[Bull]:
    driver = Bull(request.param, redis_db)
    yield driver
    driver.stop_all()


def _finished(bull: Bull) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = json.loads(
        bull.run("finished", {**bull.connection, "queues": [QUEUE]})
    )["queues"][QUEUE]
    return jobs


def _run(bull: Bull, *steps: dict[str, Any]) -> None:
    bull.stop(bull.hold(*steps))


def _expected(jobs: list[dict[str, Any]]) -> dict[str, float]:
    """What Bull's own finished jobs say must be served."""
    completed = [job for job in jobs if job["state"] == "completed"]
    failed = [job for job in jobs if job["state"] == "failed"]
    timed_out = [j for j in failed if j["failedReason"].startswith("Promise timed out")]
    emails = [job for job in completed if job["name"] == "email"]
    retries = sum(j["attemptsMade"] for j in completed)
    retries += sum(j["attemptsMade"] - 1 for j in failed)
    return {
        "completed": len(completed),
        "completed email": len(emails),
        "non_retryable": len(failed) - len(timed_out),
        "timeout": len(timed_out),
        "retryable": retries,
        "retried": retries,
        "executions": len(jobs),
        "execution seconds": sum(j["finishedOn"] - j["processedOn"] for j in jobs) / 1000,
        # observed at a completion and a final failure (a timed-out one is not: lifecycle/metrics.py)
        "attempts": sum(j["attemptsMade"] + 1 for j in completed)
        + sum(j["attemptsMade"] for j in failed if j not in timed_out),
    }


def _served(series: Series) -> dict[str, float]:
    labels = {"system": "bull", "queue": QUEUE}
    failed = "queue_jobs_failed_total"
    return {
        "completed": total(series, "queue_jobs_completed_total", **labels),
        "completed email": total(series, "queue_jobs_completed_total", job_type="email", **labels),
        "non_retryable": total(series, failed, error_type="non_retryable", **labels),
        "timeout": total(series, failed, error_type="timeout", **labels),
        "retryable": total(series, failed, error_type="retryable", **labels),
        "retried": total(series, "queue_jobs_retried_total", **labels),
        "executions": total(series, "queue_job_execution_seconds_count", **labels),
        "execution seconds": round(total(series, "queue_job_execution_seconds_sum", **labels), 3),
        "attempts": total(series, "queue_job_attempts_sum", **labels),
    }


def _up(app: Any) -> bool:
    return value(scrape_series(app), "queue_exporter_source_up", source="native:bull") == 1


def test_finished_jobs_served_once_as_bull_keeps_them(bull, redis_url, run_exporter):
    # finished before the exporter starts: its first read is the baseline
    _run(
        bull,
        {"op": "add", "queue": QUEUE, "count": 2},
        {"op": "work", "queue": QUEUE, "completed": 2},
    )
    before = set(_finished(bull))
    assert len(before) == 2
    app = run_exporter(redis_url=redis_url, preset=["bull"])
    wait_for(lambda: _up(app) and _served(scrape_series(app))["completed"] == 0)

    _run(
        bull,
        {"op": "add", "queue": QUEUE, "count": 2, "data": {"sleep_ms": 30}},
        {"op": "add", "queue": QUEUE, "name": "email", "data": {"sleep_ms": 60}},
        {"op": "add", "queue": QUEUE, "count": 2, "data": {"fail": "always"}},
        # fails once, then succeeds at its second attempt (retried at once, no backoff)
        {"op": "add", "queue": QUEUE, "data": {"fail": 1}, "opts": {"attempts": 2}},
        # fails all of its three attempts
        {"op": "add", "queue": QUEUE, "data": {"fail": "always"}, "opts": {"attempts": 3}},
        # outlives its timeout
        {"op": "add", "queue": QUEUE, "data": {"sleep_ms": 2000}, "opts": {"timeout": 100}},
        # each failed attempt is one of Bull's failed events
        {"op": "work", "queue": QUEUE, "completed": 4, "failed": 1 + 2 + 3 + 1},
    )
    jobs = _finished(bull)
    new = [job for job_id, job in jobs.items() if job_id not in before]
    expected = _expected(new)
    assert expected["timeout"] == 1 and expected["retried"] == 3 and expected["completed"] == 4
    expected["execution seconds"] = round(expected["execution seconds"], 3)
    served: dict[str, float] = {}

    def agrees() -> bool:
        served.update(_served(scrape_series(app)))
        return served == expected

    try:
        wait_for(agrees, timeout=20)
    except AssertionError:
        raise AssertionError(f"served {served}, Bull {expected}") from None

    # an exporter started anew takes its own baseline: nothing is counted twice
    app.shutdown()
    again = run_exporter(redis_url=redis_url, preset=["bull"])
    wait_for(lambda: _up(again))
    _run(bull, {"op": "add", "queue": QUEUE}, {"op": "work", "queue": QUEUE, "completed": 1})
    wait_for(lambda: _served(scrape_series(again))["completed"] == 1)
    assert _served(scrape_series(again))["retried"] == 0


def _workers(series: Series, queue: str) -> dict[str, float]:
    return {
        state: total(series, "queue_workers", system="bull", queue=queue, state=state)
        for state in ("busy", "idle")
    }


def _bull_workers(bull: Bull, queues: list[str]) -> dict[str, dict[str, float]]:
    """Each queue's workers as Bull's own getWorkers() lists them, busy unless blocked: its
    connections that block for jobs (getWorkers lists all a Queue named: Bull 3 names a
    worker's three and a producer's)."""
    views = bull.truth(queues)["queues"]
    found = {}
    for queue in queues:
        listed = views[queue]["workers"]
        blocked = ["b" in worker["flags"] for worker in listed if worker["cmd"] == "brpoplpush"]
        found[queue] = {"busy": float(blocked.count(False)), "idle": float(blocked.count(True))}
    return found


def test_workers_as_bull_lists_them(bull, redis_url, run_exporter):
    queues = ["busy", "idle"]
    held = bull.hold(
        # queues are those with an id counter: one job ever added
        {"op": "add", "queue": "idle"},
        {"op": "work", "queue": "idle", "completed": 1},
        {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
        {"op": "hold", "queue": "busy"},
        {"op": "idle", "queue": "idle"},
        {"op": "idle", "queue": "idle"},
    )
    # a worker of a queue of the same name in another database is another queue's
    with claims.redis_database(REDIS_HOST, REDIS_PORT) as other_db:
        elsewhere = Bull(bull.major, other_db)
        try:
            elsewhere.hold({"op": "idle", "queue": "idle"})
            _workers_served_as_bull_lists_them(bull, queues, held, run_exporter, redis_url)
        finally:
            elsewhere.stop_all()


def _workers_served_as_bull_lists_them(
    bull: Bull, queues: list[str], held: Any, run_exporter: Any, redis_url: str
) -> None:
    app = run_exporter(redis_url=redis_url, preset=["bull"])
    seen: dict[str, Any] = {}

    def agrees() -> bool:
        seen["bull"] = _bull_workers(bull, queues)
        seen["served"] = {queue: _workers(scrape_series(app), queue) for queue in queues}
        return seen["served"] == seen["bull"]

    try:
        wait_for(agrees, timeout=30, interval=0.5)
    except AssertionError:
        raise AssertionError(f"served {seen['served']}, Bull {seen['bull']}") from None
    assert seen["bull"] == {"busy": {"busy": 1, "idle": 0}, "idle": {"busy": 0, "idle": 2}}
    # CLIENT LIST does not tell a worker's concurrency: no slots, none made up
    made_up = {"queue_worker_slots", "queue_worker_utilization_ratio"}
    assert not [name for name, _ in scrape_series(app) if name in made_up]
    bull.stop(held)  # its workers leave: none listed, none served
    wait_for(lambda: _bull_workers(bull, queues) == {q: {"busy": 0, "idle": 0} for q in queues})
    wait_for(lambda: all(_workers(scrape_series(app), q) == {"busy": 0, "idle": 0} for q in queues))
