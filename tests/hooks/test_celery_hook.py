"""exporter.hooks.celery with real Celery and real prefork `celery worker`s: the events on the
wire against Celery's own record of each task (its result backend: state, result, date_done),
then what the exporter reading the stream serves; with opentelemetry-instrumentation-celery
(the events carry the task span the task itself sees) and without; and a stopped event Redis
that costs events, never the tasks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery

from exporter.lifecycle.producer import URL_CLIENT_TIMEOUTS
from tests.conformance.adapters.base import run_json
from tests.conftest import scrape_series, stop_process, total, wait_for
from tests.hooks.events import epoch, events_by_job, exporter_reading, hung_redis, names

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).parent / "celery"
STREAM = "hooks:celery:events"
QUEUE = "hooked"
HOOKED = "tests.hooks.celery_hooked"  # the app, with the hook installed
PLAN = [
    *({"task": "ok", "seconds": 0.3} for _ in range(3)),
    {"task": "fail", "seconds": 0},
    {"task": "retry_once", "seconds": 0},
    {"task": "slow", "seconds": 5},  # its soft time limit, 0.5 s, ends it
    {"task": "stuck", "seconds": 5},  # its hard time limit, 1 s, kills its pool process
]


def hooked_env(redis_url: str, otel: bool, events_url: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url}
    env |= {"QE_HOOKS_STREAM": STREAM, "QE_HOOKS_EVENTS_URL": events_url or redis_url}
    if otel:
        env["QE_HOOKS_OTEL"] = "1"
    return env


def publish(plan: list[dict], env: dict[str, str]) -> list[str]:
    ids: list[str] = run_json([sys.executable, "-m", HOOKED, json.dumps(plan)], env)
    return ids


def worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [CELERY, "-A", HOOKED, "worker", "-Q", QUEUE, "-c", "2"]
    argv += ["-n", f"hooked-{os.getpid()}@%h", f"--logfile={log}", "--loglevel=info"]
    return subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def results(redis_url: str, ids: list[str]) -> dict[str, object]:
    """Each task's AsyncResult from the result backend, once every one is ready (an app of the
    test's own: the hooked app is never imported here)."""
    reader = Celery("reader", broker=redis_url, backend=redis_url)
    found = {task_id: reader.AsyncResult(task_id) for task_id in ids}
    wait_for(lambda: all(result.ready() for result in found.values()), timeout=120)
    return found


@pytest.mark.parametrize("otel", [True, False], ids=["instrumented", "uninstrumented"])
def test_events_are_celerys_own_record_of_each_task(
    otel, redis_url, redis_client, run_exporter, tmp_path
):
    app = exporter_reading(run_exporter, redis_url, STREAM, "celery")
    env = hooked_env(redis_url, otel)
    ids = publish(PLAN, env)
    process = worker(env, tmp_path / "worker.log")
    try:
        found = results(redis_url, ids)
        wait_for(lambda: redis_client.xlen(STREAM) == 3 * 3 + 3 + 6 + 4 + 4, timeout=30)
    finally:
        stop_process(process, signal.SIGTERM)  # idle: a warm shutdown
    events = events_by_job(redis_client, STREAM)
    ok_ids, (failed_id, retried_id, slow_id, stuck_id) = ids[:3], ids[3:]
    states = [*["SUCCESS"] * 3, "FAILURE", "SUCCESS", "FAILURE", "FAILURE"]
    assert [found[i].state for i in ids] == states
    assert type(found[slow_id].result).__name__ == "SoftTimeLimitExceeded"

    for task_id in ok_ids:
        seen = events[task_id]
        assert names(seen) == ["enqueued", "started", "completed"]
        enqueued, started, completed = seen
        assert started.enqueued_at == enqueued.ts
        assert enqueued.ts <= started.ts <= epoch(found[task_id].date_done) <= completed.ts
        assert completed.started_at == started.ts
        assert {(e.system, e.queue, e.job_type) for e in seen} == {("celery", QUEUE, "hooks.ok")}
        trace_id, span_id = found[task_id].result
        if otel:  # the task span the task ran in, on every worker event; its trace at enqueue
            assert {e.trace.trace_id for e in seen} == {trace_id}
            assert {(e.trace.span_id) for e in (started, completed)} == {span_id}
        else:
            assert {e.trace for e in seen} == {None}
            assert trace_id == "0" * 32  # no span in the task either
    assert names(events[failed_id]) == ["enqueued", "started", "failed"]
    assert events[failed_id][-1].error_type == "non_retryable"
    assert names(events[retried_id]) == [
        *("enqueued", "started", "failed", "retried"),  # Celery's self.retry
        *("started", "completed"),
    ]
    assert events[retried_id][2].error_type == "retryable"
    assert [e.attempt for e in events[retried_id] if e.name == "started"] == [1, 2]
    assert names(events[slow_id]) == ["enqueued", "started", "failed", "timed_out"]
    assert events[slow_id][2].error_type == "timeout"
    assert type(found[stuck_id].result).__name__ == "TimeLimitExceeded"
    assert names(events[stuck_id]) == ["enqueued", "started", "failed", "timed_out"]
    assert events[stuck_id][2].error_type == "timeout"  # from the worker's main process
    assert {e.queue for e in events[stuck_id]} == {QUEUE}

    labels = {"system": "celery", "queue": QUEUE}
    expected = {"enqueued": 7, "started": 8, "completed": 4, "failed": 4, "retried": 1}
    expected["timed_out"] = 2

    def served():
        series = scrape_series(app)
        counted = {name: total(series, f"queue_jobs_{name}_total", **labels) for name in expected}
        return series if counted == expected else None

    series = wait_for(served, timeout=30)
    # each attempt but the one killed, whose run the main process cannot time
    assert total(series, "queue_job_execution_seconds_count", **labels) == 7
    # every attempt's time since enqueue, the killed one's too, each once: a time-out's by its
    # `failed`, not again by its `timed_out` (10 when both carried it)
    assert total(series, "queue_job_total_seconds_count", **labels) == 8
    assert total(series, "queue_job_wait_seconds_count", **labels) == 8
    ok = {**labels, "job_type": "hooks.ok"}
    assert total(series, "queue_job_execution_seconds_bucket", **ok, le="0.25") == 0
    assert total(series, "queue_job_execution_seconds_bucket", **ok, le="+Inf") == 3


def test_a_hung_event_redis_costs_events_never_the_tasks(redis_url, tmp_path):
    """Events to a Redis that hangs (SIGSTOP: a blocking call would wait its whole deadline):
    every task still succeeds, none ran a socket timeout longer than its own sleep by Celery's
    own runtime (its worker log, which times the task with our `started` and before our
    `completed`), and what the pool processes buffered is counted dropped when they close."""
    log = tmp_path / "worker.log"
    with hung_redis(tmp_path) as events_redis:
        env = hooked_env(redis_url, otel=False, events_url=events_redis.url)
        ids = publish([{"task": "ok", "seconds": 0.1} for _ in range(4)], env)
        process = worker(env, log)
        try:
            found = results(redis_url, ids)
        finally:
            stop_process(process, signal.SIGTERM)
    assert [found[i].state for i in ids] == ["SUCCESS"] * 4
    text = log.read_text()
    runtimes = [float(n) for n in re.findall(r"succeeded in ([0-9.]+)s", text)]
    assert len(runtimes) == 4 and all(
        r < 0.1 + URL_CLIENT_TIMEOUTS["socket_timeout"] for r in runtimes
    )
    closes = [line for line in text.splitlines() if f"lifecycle events to {STREAM}" in line]
    # each pool process closes its emitter at its shutdown: 4 started and 4 completed in all
    counts = [int(line.split(" sent, ")[1].split(" dropped")[0]) for line in closes]
    assert sum(counts) == 8 and all(" 0 sent" in line for line in closes), text[-3000:]
