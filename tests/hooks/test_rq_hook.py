"""exporter.hooks.rq with real RQ 3 and real `rq worker` processes (the EventWorker class): the
events on the wire against RQ's own records of the jobs (status, enqueued_at, started_at,
ended_at, results), then what the exporter reading the stream serves; with and without trace
context; and a hung event Redis that costs events, never the jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rq.job import Job, JobStatus

from exporter.lifecycle.producer import URL_CLIENT_TIMEOUTS
from tests.conformance.adapters.base import run_json
from tests.conftest import assert_runtimes_bucketed, scrape_series, total, wait_for
from tests.hooks.events import epoch, events_by_job, exporter_reading, hung_redis, names
from tests.hooks.rq_hooked import QUEUE

ROOT = Path(__file__).resolve().parents[2]
RQ = Path(sys.executable).parent / "rq"
STREAM = "hooks:rq:events"
PLAN = [
    *({"call": "sleep_for", "seconds": 0.3} for _ in range(3)),
    {"call": "fail_after", "seconds": 0},
    {"call": "fail_after", "seconds": 0, "retries": 1},  # a retryable failure, then the final
    {"call": "sleep_for", "seconds": 5, "timeout": 1},  # RQ's JobTimeoutException
    {"call": "sleep_for", "seconds": 0, "after": 0},  # deferred, then enqueued by RQ itself
]


def hooked_env(stream: str = STREAM, events_url: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QUEUE_EXPORTER_EVENTS_STREAM": stream}
    if events_url is not None:
        env["QUEUE_EXPORTER_EVENTS_URL"] = events_url
    return env


def enqueue(redis_url: str, plan: list[dict], env: dict[str, str], traced: bool) -> list[dict]:
    argv = [sys.executable, "-m", "tests.hooks.rq_hooked", redis_url, json.dumps(plan)]
    made: list[dict] = run_json([*argv, *(["--traced"] if traced else [])], env)
    return made


def burst_worker(redis_url: str, env: dict[str, str], worker_class: str = "EventWorker") -> str:
    """A real `rq worker --burst` with the hook's worker class, run until the queue is empty;
    its stderr (RQ's log and the hook's closing count)."""
    argv = [RQ, "worker", "--url", redis_url, "--burst"]
    argv += ["--worker-class", f"exporter.hooks.rq.{worker_class}", QUEUE]
    done = subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "untraced"])
def test_events_are_rqs_own_record_of_each_job(traced, redis_url, redis_client, run_exporter):
    app = exporter_reading(run_exporter, redis_url, STREAM, "rq")
    env = hooked_env()
    made = enqueue(redis_url, [*PLAN, {"call": "traced", "seconds": 0.1}], env, traced)
    burst_worker(redis_url, env)
    jobs = {m["id"]: Job.fetch(m["id"], connection=redis_client) for m in made}
    events = events_by_job(redis_client, STREAM)
    assert set(events) == set(jobs)
    ok_ids = [m["id"] for m in made[:3]] + [made[-1]["id"]]
    failed_id, retried_id, timed_out_id, deferred_id = (m["id"] for m in made[3:7])

    for job_id in ok_ids:
        job, seen = jobs[job_id], events[job_id]
        assert job.get_status() == JobStatus.FINISHED
        assert names(seen) == ["enqueued", "started", "completed"]
        enqueued, started, completed = seen
        assert enqueued.ts == pytest.approx(epoch(job.enqueued_at), abs=1e-5)
        assert started.enqueued_at == pytest.approx(epoch(job.enqueued_at), abs=1e-5)
        assert completed.ts == pytest.approx(epoch(job.ended_at), abs=1e-5)
        assert completed.started_at == pytest.approx(epoch(job.started_at), abs=1e-5)
        assert started.ts <= completed.started_at  # started: before the horse is forked
        assert {e.queue for e in seen} == {QUEUE} and {e.system for e in seen} == {"rq"}
        assert {e.job_type for e in seen} == {job.func_name}
    for job_id, failure in ((failed_id, "non_retryable"), (timed_out_id, "timeout")):
        assert jobs[job_id].get_status() == JobStatus.FAILED
        failed = [e for e in events[job_id] if e.name == "failed"]
        assert [e.error_type for e in failed] == [failure]
        assert failed[0].ts == pytest.approx(epoch(jobs[job_id].ended_at), abs=1e-5)
    assert "timed_out" in names(events[timed_out_id])
    assert "JobTimeoutException" in jobs[timed_out_id].latest_result().exc_string
    assert names(events[retried_id]) == [
        *("enqueued", "started", "failed", "retried"),  # RQ's Retry(max=1) put it back
        *("started", "failed"),
    ]
    assert [e.error_type for e in events[retried_id] if e.name == "failed"] == [
        "retryable",
        "non_retryable",
    ]
    assert jobs[retried_id].get_status() == JobStatus.FAILED
    deferred = jobs[deferred_id]  # never through enqueue_job once its dependency ended
    assert deferred.get_status() == JobStatus.FINISHED
    assert names(events[deferred_id]) == ["started", "completed"]
    assert events[deferred_id][0].enqueued_at == pytest.approx(
        epoch(deferred.enqueued_at), abs=1e-5
    )

    for entry in made:
        traces = {e.trace.trace_id if e.trace else None for e in events[entry["id"]]}
        assert traces == ({entry["trace_id"]} if traced else {None})
    # the job's own span: a child of the enqueuer's, in the trace the events name
    if traced:
        assert jobs[made[-1]["id"]].return_value() == made[-1]["trace_id"]

    sleeps = [*ok_ids[:3], deferred_id]
    runtimes = [epoch(jobs[i].ended_at) - epoch(jobs[i].started_at) for i in sleeps]
    labels = {"system": "rq", "queue": QUEUE}

    def served():
        series = scrape_series(app)
        counted = {
            "enqueued": total(series, "queue_jobs_enqueued_total", **labels),
            "completed": total(series, "queue_jobs_completed_total", **labels),
            "failed": total(series, "queue_jobs_failed_total", **labels),
            "timed_out": total(series, "queue_jobs_timed_out_total", **labels),
            "retried": total(series, "queue_jobs_retried_total", **labels),
            "started": total(series, "queue_jobs_started_total", **labels),
        }
        return series if counted == EXPECTED_COUNTS else None

    series = wait_for(served, timeout=30)
    job_type = jobs[ok_ids[0]].func_name
    # the bounds below 1 s: the job timed out at 1 s is a sleep_for too
    assert_runtimes_bucketed(series, runtimes, below=1.0, **labels, job_type=job_type)
    assert total(series, "queue_job_wait_seconds_count", **labels) == 9  # each start


EXPECTED_COUNTS = {
    "enqueued": 7,  # not the deferred job
    "completed": 5,
    "failed": 4,  # a failure, a timeout, a retried attempt and its final one
    "timed_out": 1,
    "retried": 1,
    "started": 9,
}


def test_the_simple_worker_emits_the_same(redis_url, redis_client):
    """SimpleEventWorker: the job in the worker's own process, the trace attached around it."""
    env = hooked_env()
    made = enqueue(redis_url, [{"call": "traced", "seconds": 0.1}] * 2, env, traced=True)
    burst_worker(redis_url, env, "SimpleEventWorker")
    events = events_by_job(redis_client, STREAM)
    for entry in made:
        job = Job.fetch(entry["id"], connection=redis_client)
        assert job.return_value() == entry["trace_id"]  # the job's span: the enqueuer's trace
        assert names(events[job.id]) == ["enqueued", "started", "completed"]
        assert {e.trace.trace_id for e in events[job.id]} == {entry["trace_id"]}
        assert events[job.id][-1].ts == pytest.approx(epoch(job.ended_at), abs=1e-5)


def test_a_hung_event_redis_costs_events_never_the_jobs(redis_url, redis_client, tmp_path):
    """The event Redis stopped (SIGSTOP: a blocking call would wait its whole deadline): every
    job still finishes as RQ records it, none ran a socket timeout longer than its own sleep,
    and the events are counted dropped when the producer and the worker close."""
    with hung_redis(tmp_path) as events_redis:
        env = hooked_env(events_url=events_redis.url)
        plan = [{"call": "sleep_for", "seconds": 0.2} for _ in range(3)]
        made = enqueue(redis_url, plan, env, traced=False)
        log = burst_worker(redis_url, env)
    jobs = [Job.fetch(m["id"], connection=redis_client) for m in made]
    assert [job.get_status() for job in jobs] == [JobStatus.FINISHED] * 3
    deadline = URL_CLIENT_TIMEOUTS["socket_timeout"]
    runtimes = [epoch(job.ended_at) - epoch(job.started_at) for job in jobs]
    assert all(runtime < 0.2 + deadline for runtime in runtimes), runtimes
    # each job's started and completed: buffered while Redis hung, dropped at the close
    assert f"lifecycle events to {STREAM}: 0 sent, 6 dropped" in log, log[-3000:]
