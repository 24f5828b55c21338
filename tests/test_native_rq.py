"""The rq preset against real RQ: jobs produced by RQ, run by real `rq worker` processes.

Every installed RQ major is tested (3.x in the project's venv, 2.x and 1.x in venvs of their
own that scripts/setup.sh makes); the truth is RQ's own Queue.count and registries, read by
the same RQ version (tests/rq_app/driver.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    REAL_WORKER_INTERVAL,
    Series,
    assert_runtimes_bucketed,
    scrape_series,
    stop_process,
    total,
    value,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
RQ_PYTHONS = {
    "rq3": Path(sys.executable),
    "rq2": ROOT / ".venv/tools/rq2/bin/python",
    "rq1": ROOT / ".venv/tools/rq1/bin/python",
}
SLEEP = 0.3  # seconds each completing job sleeps: more than the 0.25 bucket


@pytest.fixture(params=sorted(RQ_PYTHONS))
def rq_python(request: pytest.FixtureRequest) -> Path:
    python = RQ_PYTHONS[request.param]
    probe = subprocess.run([python, "-c", "import rq"], capture_output=True, check=False)
    if not python.exists() or probe.returncode != 0:
        message = f"{request.param}: no RQ at {python} (scripts/setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _driver(python: Path, redis_url: str, *args: str) -> object:
    done = subprocess.run(
        [python, "-m", "tests.rq_app.driver", redis_url, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def _worker(python: Path, redis_url: str, *queues: str, burst: bool) -> subprocess.Popen[bytes]:
    rq = python.parent / "rq"
    args = [rq, "worker", "--url", redis_url, *(["--burst"] if burst else []), *queues]
    return subprocess.Popen(
        args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
    )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    stop_process(worker, signal.SIGINT)  # warm shutdown: RQ deregisters the worker


PLAN = [
    *({"queue": "default", "call": "sleep_for", "seconds": SLEEP} for _ in range(4)),
    {"queue": "default", "call": "fail_after", "seconds": 0},
    # fails twice: one retryable attempt (it runs long enough to be seen started), then final
    {"queue": "default", "call": "fail_after", "seconds": 1.0, "retries": 1},
    {"queue": "default", "call": "sleep_for", "seconds": 5, "timeout": 1},
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "in": 3600},  # scheduled
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "in": -60},  # due: no scheduler
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "after": 7},  # deferred on 7
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "cancel": True},
    *({"queue": "other", "call": "sleep_for", "seconds": 0.1} for _ in range(2)),
    # RQ 3: one of three may run at a time, the other two wait in the rate limit's zset
    *(
        {"queue": "limited", "call": "sleep_for", "seconds": 0.1, "rate_limit": ["lim", 1]}
        for _ in range(3)
    ),
]
STATE_OF_REGISTRY = {
    "queued": "pending",
    "started": "active",
    "finished": "completed",
    "failed": "failed",
    "canceled": "failed",
    "deferred": "scheduled",
    "scheduled": "scheduled",
    "rate_limited": "pending",
}


def test_rq_with_real_workers(rq_python, redis_url, run_exporter):
    # The default interval: a job that fails after 1 s is seen started by a read during its run.
    app = run_exporter(redis_url=redis_url, preset=["rq"])
    # the native reader's first read is its baseline: jobs are produced after it
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:rq"))
    _driver(rq_python, redis_url, "enqueue", json.dumps(PLAN))
    idle = _worker(rq_python, redis_url, "idle", burst=False)
    try:
        worker = _worker(rq_python, redis_url, "default", burst=True)
        worker.wait(timeout=120)

        # depth per queue and state equals RQ's own counts
        truth = _driver(rq_python, redis_url, "truth", "default", "other", "idle", "limited")
        assert isinstance(truth, dict)
        if truth["version"].startswith("3."):
            assert truth["queues"]["limited"]["rate_limited"] == 2
        expected: dict[tuple[str, str], float] = {}
        for queue, counts in truth["queues"].items():
            for registry, count in counts.items():
                key = (queue, STATE_OF_REGISTRY[registry])
                expected[key] = expected.get(key, 0) + count
        assert expected[("default", "completed")] == 4
        assert expected[("default", "failed")] == 4  # 3 failures and 1 canceled

        def settled() -> Series | None:
            series = scrape_series(app)
            depths = {
                key: total(series, "queue_depth", system="rq", queue=key[0], state=key[1])
                for key in expected
            }
            # Completions and failures are read from different registries, possibly in
            # different cycles: wait for all of them, not the completions alone.
            done = total(series, "queue_jobs_completed_total", system="rq", queue="default")
            failed = total(series, "queue_jobs_failed_total", system="rq", queue="default")
            started = total(series, "queue_jobs_started_total", system="rq", queue="default")
            counted = (done, failed, started) == (4, 4, 8)
            return series if depths == expected and counted else None

        series = wait_for(settled, timeout=120)

        def failed(error_type: str) -> float:
            return total(series, "queue_jobs_failed_total", queue="default", error_type=error_type)

        assert failed("non_retryable") == 2
        assert failed("timeout") == 1
        assert failed("retryable") == 1
        assert total(series, "queue_jobs_retried_total", queue="default") == 1
        assert total(series, "queue_jobs_timed_out_total", queue="default") == 1
        assert total(series, "queue_jobs_started_total", queue="default") == 8  # 7 jobs, 1 retry
        job_type = "tests.rq_app.jobs.sleep_for"
        bucket = {"queue": "default", "job_type": job_type}
        # Each run in the bucket RQ's own started_at and ended_at put it in; the bounds below
        # the job timed out at 1 s, whose end RQ's failed record does not give.
        runtimes = truth["runtimes"]["default"][job_type]
        assert len(runtimes) == 4 and min(runtimes) >= SLEEP
        assert_runtimes_bucketed(series, runtimes, below=1.0, **bucket)
        assert total(series, "queue_job_wait_seconds_count", **bucket) >= 4
        # due counts, the head's age and the set of queues equal RQ's own
        for queue in truth["all_queues"]:  # "idle" has no job: RQ does not know it either
            due = value(series, "queue_scheduled_due", system="rq", queue=queue)
            assert due == truth["due"][queue], queue
        assert truth["due"]["default"] == 1
        for queue, enqueued_at in truth["oldest_enqueued_at"].items():
            age = value(series, "queue_oldest_age_seconds", system="rq", queue=queue)
            if enqueued_at is None:
                assert age is None, queue
            else:  # sampled up to a couple of intervals before this scrape
                assert age is not None and 0 <= time.time() - enqueued_at - age < 5, queue
        queues = {
            dict(ls)["queue"] for n, ls in series if n == "queue_depth" and ("system", "rq") in ls
        }
        assert queues == set(truth["all_queues"])

        # a worker that stays: idle on its queue (at a read that succeeded: beside busy loops
        # reads cut off at their deadline let it age out meanwhile); stopped, it leaves
        def idle_worker() -> bool:
            series = scrape_series(app)
            return value(series, "queue_workers", system="rq", queue="idle", state="idle") == 1

        wait_for(idle_worker, timeout=120)
        _stop(idle)
        wait_for(
            lambda: (
                not value(
                    scrape_series(app), "queue_workers", system="rq", queue="idle", state="idle"
                )
            ),
            timeout=30,
        )

        # another worker process: the counts go on from where they were
        _driver(rq_python, redis_url, "enqueue", json.dumps(PLAN[:2]))
        _worker(rq_python, redis_url, "default", burst=True).wait(timeout=120)
        wait_for(
            lambda: total(scrape_series(app), "queue_jobs_completed_total", queue="default") == 6,
            timeout=30,
        )
    finally:
        _stop(idle)


def test_a_queues_param_narrows_the_workers_too(rq_python, redis_url, run_exporter):
    """queues: [mail]: a worker serving mail and video (its rq:worker hash lists both) is a
    worker of mail alone, as the depths are; stopped, it leaves mail's workers."""
    preset = {"name": "rq", "params": {"queues": ["mail"]}}
    sources = {"redis": {"url": redis_url}}
    app = run_exporter(
        {"presets": [preset], "sources": sources, "sample_interval": REAL_WORKER_INTERVAL}
    )
    worker = _worker(rq_python, redis_url, "mail", "video", burst=False)

    def workers() -> dict[str, float]:
        series = scrape_series(app)
        return {
            dict(ls)["queue"]: v
            for (n, ls), v in series.items()
            if n == "queue_workers" and {("system", "rq"), ("state", "idle")} <= ls
        }

    try:
        assert wait_for(workers, timeout=120) == {"mail": 1}  # one read gives both, or neither
    finally:
        _stop(worker)
    wait_for(lambda: not workers(), timeout=120)
