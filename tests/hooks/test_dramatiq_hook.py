"""exporter.hooks.dramatiq with the real Dramatiq: a real Worker runs an app whose broker has
the hook (tests/hooks/dramatiq_hooked.py); what the hook wrote is compared with Dramatiq's own
truth (each sent message's id and timestamp, the actors' own clocks, the messages Dramatiq put
in its dead-letter queue with their retry counts), then with what an exporter reading the
stream serves; with and without OpenTelemetry's Dramatiq instrumentation. An events Redis that
hangs, then dies, costs counted events, never a job."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from dramatiq import Message

from tests.conftest import scrape_series, total, value, wait_for
from tests.hooks.events import (
    by_job,
    event_names,
    events_of,
    exporter_reading,
    hung_redis,
    json_lines,
    trace_id,
)
from tests.real_queues import Driver

ROOT = Path(__file__).resolve().parents[2]
APP = [sys.executable, "-m", "tests.hooks.dramatiq_hooked"]
STREAM = "hooks:dramatiq:events"
QUEUE = "hooked"
PLAN = [
    {"actor": "work", "args": [0.05]},
    {"actor": "work", "args": [0.02]},
    {"actor": "work", "args": [0], "delay": 100},
    {"actor": "broken"},
    {"actor": "flaky"},
    {"actor": "refused"},
    {"actor": "slow"},
]
RUNS = {"work": 3, "broken": 1, "flaky": 2, "refused": 1, "slow": 1}  # attempts Dramatiq makes
DEAD = {"broken", "flaky", "refused", "slow"}


def _app(redis_url: str, truth: Path, **more: str) -> Driver:
    env = {
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "EVENTS_URL": redis_url,
        "EVENTS_STREAM": STREAM,
        "TRUTH": str(truth),
        **more,
    }
    return Driver(APP, env)


def _runs(truth: Path) -> list[dict[str, Any]]:
    return json_lines(truth.read_text()) if truth.exists() else []


def _dead_letters(client: redis.Redis) -> dict[str, Message[Any]]:
    """The messages in Dramatiq's dead-letter queue of QUEUE, decoded by Dramatiq, by id."""
    encoded = client.hgetall(f"dramatiq:{QUEUE}.XQ.msgs").values()
    messages = [Message.decode(data) for data in encoded]
    return {message.message_id: message for message in messages}


@pytest.mark.parametrize("otel", [False, True], ids=["plain", "opentelemetry"])
def test_events_match_dramatiqs_own_truth_and_are_served(
    otel, redis_client, redis_url, run_exporter, tmp_path
):
    exporter = exporter_reading(run_exporter, redis_url, STREAM, "dramatiq")
    truth = tmp_path / "runs.jsonl"
    app = _app(redis_url, truth, OTEL="1" if otel else "0")
    try:
        worker = app.start([*APP, "work"])
        sent = json_lines(app.run("send", PLAN))
        *messages, sender_counts = sent
        wait_for(lambda: len(_runs(truth)) == sum(RUNS.values()))
        wait_for(lambda: len(_dead_letters(redis_client)) == len(DEAD))
        *_, worker_counts = json_lines(app.stop(worker))
    finally:
        app.stop_all()
    events = events_of(redis_client, STREAM)
    assert sender_counts["dropped"] == {} and worker_counts["dropped"] == {}
    assert sender_counts["sent"] + worker_counts["sent"] == len(events)

    jobs = by_job(events)
    runs = {}
    for run in _runs(truth):
        runs.setdefault(run["id"], []).append(run)
    dead = _dead_letters(redis_client)
    expected = {
        "work": ["enqueued", "started", "completed"],
        "broken": ["enqueued", "started", "failed", "dead_lettered"],
        "flaky": ["enqueued", "started", "failed", "retried", "started", "failed", "dead_lettered"],
        "refused": ["enqueued", "started", "failed", "dead_lettered"],
        "slow": ["enqueued", "started", "failed", "timed_out", "dead_lettered"],
    }
    for step, message in zip(PLAN, messages, strict=True):
        actor, job = message["actor"], jobs[message["id"]]
        wanted = list(expected[actor])
        if step.get("delay"):
            wanted.insert(1, "scheduled")
        assert event_names(job) == wanted, (actor, job)
        _check_times(job, message, runs[message["id"]])
        assert {(e["queue"], e["job_type"], e["system"]) for e in job} == {
            (QUEUE, actor, "dramatiq")
        }
        if actor in DEAD:  # Dramatiq's dead letter and its count of attempts
            attempts = len(runs[message["id"]])
            assert job[-1]["attempt"] == str(attempts)
            # the dead letter as Dramatiq stored it when it enqueued its last attempt: the
            # retries before that attempt
            assert dead[message["id"]].options.get("retries", 0) + 1 == attempts
        # the trace context: the job's trace (the sender's span), as OpenTelemetry tells the actor
        traces = {trace_id(event) for event in job}
        if otel:
            assert message["trace_id"] is not None
            assert traces == {message["trace_id"]}
            assert {run["trace_id"] for run in runs[message["id"]]} == {message["trace_id"]}
        else:
            assert message["trace_id"] is None and traces == {None}
    assert sum(event_names(jobs[m["id"]]).count("scheduled") for m in messages) == 1
    error_types = {
        m["actor"]: {e["error_type"] for e in jobs[m["id"]] if e["event"] == "failed"}
        for m in messages
        if m["actor"] in DEAD
    }
    assert error_types == {
        "broken": {"other"},
        "flaky": {"other"},
        "refused": {"non_retryable"},
        "slow": {"timeout"},
    }
    retried = [e for e in events if e["event"] == "retried"]
    assert len(retried) == 1 and 0 < float(retried[0]["delay"]) <= 0.2  # flaky's max_backoff

    series = wait_for(
        lambda: (
            (s := scrape_series(exporter))
            and value(s, "queue_exporter_events_total", stream=STREAM) == len(events)
            and s
        )
    )
    labels = {"system": "dramatiq", "queue": QUEUE}
    assert total(series, "queue_jobs_enqueued_total", **labels) == len(PLAN)
    assert total(series, "queue_jobs_started_total", **labels) == sum(RUNS.values())
    assert total(series, "queue_jobs_completed_total", **labels, job_type="work") == 3
    assert total(series, "queue_jobs_failed_total", **labels, error_type="other") == 3
    assert total(series, "queue_jobs_failed_total", **labels, error_type="non_retryable") == 1
    assert total(series, "queue_jobs_failed_total", **labels, error_type="timeout") == 1
    assert total(series, "queue_jobs_timed_out_total", **labels) == 1
    assert total(series, "queue_jobs_retried_total", **labels) == 1
    assert total(series, "queue_jobs_scheduled_total", **labels) == 1
    assert total(series, "queue_jobs_dead_lettered_total", **labels) == len(DEAD)
    slow = {**labels, "job_type": "slow"}  # failed and timed_out: its one run observed once
    assert total(series, "queue_job_execution_seconds_count", **slow) == 1
    assert total(series, "queue_job_total_seconds_count", **slow) == 1
    work = {**labels, "job_type": "work"}
    assert total(series, "queue_job_execution_seconds_count", **work) == 3
    ran = sum(
        r["end"] - r["begin"] for m in messages if m["actor"] == "work" for r in runs[m["id"]]
    )
    assert total(series, "queue_job_execution_seconds_sum", **work) >= ran
    assert total(series, "queue_job_wait_seconds_count", **labels) == sum(RUNS.values())
    assert value(series, "queue_exporter_events_invalid_total", stream=STREAM) is None


def _check_times(
    job: list[dict[str, str]], message: dict[str, Any], runs: list[dict[str, Any]]
) -> None:
    """Dramatiq's message timestamp is the enqueue time; each attempt's start and end enclose
    the actor's own clock."""
    created = message["timestamp"] / 1000
    assert float(job[0]["ts"]) == created
    starts = [e for e in job if e["event"] == "started"]
    ends = [e for e in job if e["event"] in ("completed", "failed")]
    assert len(starts) == len(ends) == len(runs)
    for attempt, (start, end, run) in enumerate(zip(starts, ends, runs, strict=True), 1):
        assert float(start["enqueued_at"]) == created
        assert start["attempt"] == end["attempt"] == str(attempt)
        assert float(start["ts"]) <= run["begin"]
        assert float(end["started_at"]) == float(start["ts"])
        assert float(end["started_at"]) + float(end["duration"]) >= run["end"] - 0.001


def test_an_events_redis_that_hangs_then_dies_costs_counted_events_never_a_job(
    redis_client, redis_url, tmp_path
):
    """The worker's events client has no timeout at all: had the hook a Redis call in a job's
    path, that job would wait for ever on the stopped server. Every job completes while it is
    stopped; its events are dropped and counted, none is sent."""
    truth = tmp_path / "runs.jsonl"
    jobs = 10
    app = _app(redis_url, truth)
    try:
        with hung_redis(tmp_path) as events_redis:
            app.env.update(
                {"EVENTS_URL": events_redis.url, "EVENTS_NO_TIMEOUT": "1", "EVENTS_BUFFER": "4"}
            )
            worker = app.start([*APP, "work"])
            app.env.update(
                {"EVENTS_URL": redis_url, "EVENTS_NO_TIMEOUT": "0", "EVENTS_BUFFER": "10000"}
            )
            app.run("send", [{"actor": "work", "args": [0]}] * jobs)
            wait_for(lambda: len(_runs(truth)) == jobs)  # every job ran while the server hung
            events_redis.stop()  # SIGKILL: it dies stopped
            *_, counts = json_lines(app.stop(worker))
    finally:
        app.stop_all()
    assert counts["sent"] == 0
    assert sum(counts["dropped"].values()) == 2 * jobs  # started and completed of each
    assert counts["dropped"]["buffer_full"] > 0
    # Dramatiq's own view: every message acknowledged, none dead
    assert redis_client.hlen(f"dramatiq:{QUEUE}.msgs") == 0
    assert _dead_letters(redis_client) == {}
