"""exporter.hooks.arq with the real arq: a real `arq` worker (the arq venv's) runs an app whose
settings and pool have the hook (tests/hooks/arq_hooked.py); what the hook wrote is compared
with arq's own truth (Job.result_info(): enqueue, start and finish times, success, job_try; the
jobs' own clocks), then with what an exporter reading the stream serves; with and without
OpenTelemetry's arq instrumentation. An events Redis that hangs, then dies, costs counted
events, never a job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
from tests.tools import missing

ROOT = Path(__file__).resolve().parents[2]
ARQ_BIN = ROOT / ".venv/tools/arq/bin"
STREAM = "hooks:arq:events"
QUEUE = "hooked"
PLAN = [
    {"function": "work", "args": [0.05]},
    {"function": "work", "args": [0], "defer_by": 0.2},
    {"function": "again"},
    {"function": "broken"},
    {"function": "slow"},
]
RUNS = {"work": 1, "again": 2, "broken": 1, "slow": 1}  # per job: the tries arq makes
EXPECTED = {
    "work": ["enqueued", "started", "completed"],
    "again": ["enqueued", "started", "failed", "retried", "started", "completed"],
    "broken": ["enqueued", "started", "failed"],
    "slow": ["enqueued", "started", "failed", "timed_out"],
}
ROUNDING = 0.001  # arq keeps its times in whole milliseconds, rounded


def _app(redis_url: str, truth: Path, **more: str) -> Driver:
    if not (ARQ_BIN / "arq").exists():
        missing("the arq venv (.venv/tools/arq) not found: run scripts/setup.sh")
    env = {
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "EVENTS_URL": redis_url,
        "EVENTS_STREAM": STREAM,
        "TRUTH": str(truth),
        **more,
    }
    return Driver([str(ARQ_BIN / "python"), "-m", "tests.hooks.arq_hooked"], env)


def _worker(app: Driver) -> Any:
    return app.start([str(ARQ_BIN / "arq"), "tests.hooks.arq_hooked.WorkerSettings"])


def _runs(truth: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for run in json_lines(truth.read_text()) if truth.exists() else []:
        runs.setdefault(run["id"], []).append(run)
    return runs


def _finished(app: Driver, job_ids: list[str]) -> dict[str, dict[str, Any]] | None:
    """arq's result_info() of every job, once each has one."""
    try:
        infos = json_lines(app.run("truth", job_ids))
    except AssertionError:  # a job without a result yet
        return None
    return {info["id"]: info for info in infos}


@pytest.mark.parametrize("otel", [False, True], ids=["plain", "opentelemetry"])
def test_events_match_arqs_own_truth_and_are_served(
    otel, redis_client, redis_url, run_exporter, tmp_path
):
    exporter = exporter_reading(run_exporter, redis_url, STREAM, "arq")
    truth = tmp_path / "runs.jsonl"
    app = _app(redis_url, truth, OTEL="1" if otel else "0")
    try:
        worker = _worker(app)
        *jobs_sent, sender_counts = json_lines(app.run("send", PLAN))
        ids = [job["id"] for job in jobs_sent]
        arq_truth = wait_for(lambda: _finished(app, ids))
        *_, worker_counts = json_lines(app.stop(worker))
    finally:
        app.stop_all()
    events = events_of(redis_client, STREAM)
    assert sender_counts["dropped"] == {} and worker_counts["dropped"] == {}
    assert sender_counts["sent"] + worker_counts["sent"] == len(events)

    jobs, runs = by_job(events), _runs(truth)
    for step, sent in zip(PLAN, jobs_sent, strict=True):
        function, job, info = sent["function"], jobs[sent["id"]], arq_truth[sent["id"]]
        wanted = list(EXPECTED[function])
        if step.get("defer_by"):
            wanted.insert(1, "scheduled")
        assert event_names(job) == wanted, (function, job)
        assert {(e["queue"], e["job_type"], e["system"]) for e in job} == {(QUEUE, function, "arq")}
        assert len(runs[sent["id"]]) == RUNS[function] == info["job_try"]
        _check_times(job, info, runs[sent["id"]])
        assert info["success"] == (job[-1]["event"] == "completed")
        traces = {trace_id(event) for event in job}
        if otel:  # the job's trace: the sender's span, as OpenTelemetry tells the job
            assert sent["trace_id"] is not None
            assert traces == {sent["trace_id"]}
            assert {run["trace_id"] for run in runs[sent["id"]]} == {sent["trace_id"]}
        else:
            assert sent["trace_id"] is None and traces == {None}
    error_types = {
        sent["function"]: [e["error_type"] for e in jobs[sent["id"]] if e["event"] == "failed"]
        for sent in jobs_sent
    }
    assert error_types["again"] == ["retryable"]
    assert error_types["broken"] == ["non_retryable"]
    assert error_types["slow"] == ["timeout"]
    assert {arq_truth[s["id"]]["error"] for s in jobs_sent if s["function"] == "slow"} == {
        "TimeoutError"
    }
    scheduled = [e for e in events if e["event"] == "scheduled"]
    assert [float(e["delay"]) for e in scheduled] == [0.2]
    retried = [e for e in events if e["event"] == "retried"]
    assert [float(e["delay"]) for e in retried] == [0.1]  # the job's Retry(defer=100 ms)

    series = wait_for(
        lambda: (
            (s := scrape_series(exporter))
            and value(s, "queue_exporter_events_total", stream=STREAM) == len(events)
            and s
        )
    )
    labels = {"system": "arq", "queue": QUEUE}
    assert total(series, "queue_jobs_enqueued_total", **labels) == len(PLAN)
    assert total(series, "queue_jobs_started_total", **labels) == 6
    assert total(series, "queue_jobs_completed_total", **labels) == 3
    assert total(series, "queue_jobs_failed_total", **labels, error_type="retryable") == 1
    assert total(series, "queue_jobs_failed_total", **labels, error_type="non_retryable") == 1
    assert total(series, "queue_jobs_failed_total", **labels, error_type="timeout") == 1
    assert total(series, "queue_jobs_timed_out_total", **labels) == 1
    assert total(series, "queue_jobs_retried_total", **labels) == 1
    assert total(series, "queue_jobs_scheduled_total", **labels) == 1
    slow = {**labels, "job_type": "slow"}  # failed and timed_out: its one run observed once
    assert total(series, "queue_job_execution_seconds_count", **slow) == 1
    assert total(series, "queue_job_total_seconds_count", **slow) == 1
    work = {**labels, "job_type": "work"}
    assert total(series, "queue_job_execution_seconds_count", **work) == 2
    ran = sum(
        r["end"] - r["begin"] for s in jobs_sent if s["function"] == "work" for r in runs[s["id"]]
    )
    assert total(series, "queue_job_execution_seconds_sum", **work) >= ran
    assert total(series, "queue_job_wait_seconds_count", **labels) == 6
    assert value(series, "queue_exporter_events_invalid_total", stream=STREAM) is None


def _check_times(
    job: list[dict[str, str]], info: dict[str, Any], runs: list[dict[str, Any]]
) -> None:
    """arq's enqueue time is the job's; its enqueue call began before it; the last try's start
    and end lie within arq's start and finish times; each try's within the job's own clock."""
    assert float(job[0]["ts"]) <= info["enqueue_time"] + ROUNDING
    starts = [e for e in job if e["event"] == "started"]
    ends = [e for e in job if e["event"] in ("completed", "failed")]
    assert len(starts) == len(ends) == len(runs)
    for attempt, (start, end, run) in enumerate(zip(starts, ends, runs, strict=True), 1):
        assert float(start["enqueued_at"]) == info["enqueue_time"]
        assert start["attempt"] == end["attempt"] == str(attempt)
        assert float(start["ts"]) <= run["begin"]
        assert float(end["started_at"]) == float(start["ts"])
        assert float(end["started_at"]) + float(end["duration"]) >= run["end"] - ROUNDING
    last_start, last_end = starts[-1], ends[-1]
    assert float(last_start["ts"]) >= info["start_time"] - ROUNDING
    finished = float(last_end["started_at"]) + float(last_end["duration"])
    assert finished <= info["finish_time"] + ROUNDING


def test_a_job_whose_task_starts_late_is_still_timed_out(redis_client, redis_url, tmp_path):
    """arq starts a job's timeout before its task runs a line: a task that starts late (held
    0.15 s of the slow job's 0.3 s, as a slow instrumentation's wrapper would) is cancelled
    having run less than its timeout, and is a time-out all the same, as arq records it."""
    app = _app(redis_url, tmp_path / "runs.jsonl", LATE_START="0.15")
    try:
        worker = _worker(app)
        sent, _ = json_lines(app.run("send", [{"function": "slow"}]))
        arq_truth = wait_for(lambda: _finished(app, [sent["id"]]))
        app.stop(worker)
    finally:
        app.stop_all()
    assert arq_truth[sent["id"]]["error"] == "TimeoutError"
    job = by_job(events_of(redis_client, STREAM))[sent["id"]]
    assert event_names(job) == EXPECTED["slow"]
    assert [e["error_type"] for e in job if e["event"] == "failed"] == ["timeout"]


def test_an_events_redis_that_hangs_then_dies_costs_counted_events_never_a_job(redis_url, tmp_path):
    """The worker's events client has no timeout at all: had the hook a Redis call in a job's
    path, that job would wait for ever on the stopped server. Every job succeeds (arq's own
    result) while it is stopped; its events are dropped and counted, none is sent."""
    truth = tmp_path / "runs.jsonl"
    jobs = 10
    app = _app(redis_url, truth)
    try:
        with hung_redis(tmp_path) as events_redis:
            app.env.update(
                {"EVENTS_URL": events_redis.url, "EVENTS_NO_TIMEOUT": "1", "EVENTS_BUFFER": "4"}
            )
            worker = _worker(app)
            app.env.update(
                {"EVENTS_URL": redis_url, "EVENTS_NO_TIMEOUT": "0", "EVENTS_BUFFER": "10000"}
            )
            *sent, _ = json_lines(app.run("send", [{"function": "work", "args": [0]}] * jobs))
            infos = wait_for(lambda: _finished(app, [job["id"] for job in sent]))  # while hung
            events_redis.stop()  # SIGKILL: it dies stopped
            *_, counts = json_lines(app.stop(worker))
    finally:
        app.stop_all()
    assert all(info["success"] for info in infos.values()) and len(infos) == jobs
    assert counts["sent"] == 0
    assert sum(counts["dropped"].values()) == 2 * jobs  # started and completed of each
    assert counts["dropped"]["buffer_full"] > 0
